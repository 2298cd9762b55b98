"""The state database's schema: one SQL script per version, applied in order on open
(`PRAGMA user_version` says how far a file is). Append a version; never edit a released one."""

from __future__ import annotations

_MIGRATIONS: list[str] = [
    # version 1
    """
    CREATE TABLE clusters (
        name TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        status TEXT NOT NULL,
        region TEXT, zone TEXT, instance_type TEXT,
        hourly_price REAL NOT NULL DEFAULT 0,
        num_nodes INTEGER NOT NULL DEFAULT 1,
        recipe_path TEXT, recipe_digest TEXT,
        owner TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL,
        last_error TEXT
    );
    CREATE TABLE nodes (
        cluster TEXT NOT NULL REFERENCES clusters(name) ON DELETE CASCADE,
        rank INTEGER NOT NULL,
        instance_id TEXT NOT NULL,
        state TEXT NOT NULL,
        public_ip TEXT, private_ip TEXT,
        ssh_user TEXT, ssh_port INTEGER,
        ssh_key TEXT, proxy_command TEXT,
        started_at REAL,
        PRIMARY KEY (cluster, rank)
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        recipe_path TEXT, recipe_digest TEXT,
        run_dir TEXT,
        status TEXT NOT NULL,
        exit_code INTEGER,
        provider TEXT, instance_type TEXT,
        hourly_price REAL NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0,
        started_at REAL NOT NULL, ended_at REAL
    );
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        run_id TEXT,
        job_dir TEXT NOT NULL,
        status TEXT NOT NULL,
        command TEXT,
        submitted_at REAL NOT NULL,
        started_at REAL, ended_at REAL,
        exit_code INTEGER
    );
    CREATE INDEX jobs_by_cluster ON jobs(cluster, submitted_at);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        cluster TEXT,
        kind TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE TABLE log_cursors (
        job_id TEXT PRIMARY KEY,
        offset INTEGER NOT NULL
    );
    """,
    # version 2: which process drives a run (to tell a live run from an abandoned row), what a
    # run collects (for `cloudtrain collect`), and whether a cluster is spot (stop semantics).
    """
    ALTER TABLE runs ADD COLUMN pid INTEGER;
    ALTER TABLE runs ADD COLUMN result_paths TEXT;
    ALTER TABLE runs ADD COLUMN error TEXT;
    ALTER TABLE clusters ADD COLUMN spot INTEGER NOT NULL DEFAULT 0;
    """,
    # version 3: billed intervals, one row per node and billing state (running at the compute
    # price, stopped at the disk price); an open interval has ended_at NULL. Spend is the sum of
    # price x billed time over these rows, never an estimate from the cluster's age.
    """
    CREATE TABLE billing (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster TEXT NOT NULL,
        cloud TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        hourly_price REAL NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX billing_by_cluster ON billing(cluster, started_at);
    CREATE INDEX billing_open ON billing(instance_id, ended_at);
    """,
    # version 4: sweeps (cloudtrain/sweep). The scheduler's journal: written before it acts, so
    # `sweep resume` after a killed CLI knows every VM and attempt it may have started.
    """
    CREATE TABLE sweeps (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        recipe_path TEXT NOT NULL,
        recipe_digest TEXT NOT NULL,
        status TEXT NOT NULL,
        pid INTEGER,
        results_dir TEXT NOT NULL,
        spec TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        ended_at REAL,
        error TEXT,
        next_slot INTEGER NOT NULL DEFAULT 0,
        boot_failures INTEGER NOT NULL DEFAULT 0,
        stop_reason TEXT,
        ended_reason TEXT
    );
    CREATE TABLE sweep_trials (
        sweep TEXT NOT NULL,
        number INTEGER NOT NULL,
        params TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        value REAL,
        error TEXT,
        created_at REAL NOT NULL,
        ended_at REAL,
        PRIMARY KEY (sweep, number)
    );
    CREATE TABLE sweep_attempts (
        sweep TEXT NOT NULL,
        trial INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        vm TEXT NOT NULL,
        started_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        hourly_usd REAL NOT NULL,
        state TEXT NOT NULL,
        ended_at REAL,
        value REAL,
        error TEXT,
        stopping TEXT,
        PRIMARY KEY (sweep, trial, attempt)
    );
    CREATE TABLE sweep_vms (
        sweep TEXT NOT NULL,
        id TEXT NOT NULL,
        slot INTEGER NOT NULL,
        state TEXT NOT NULL,
        hourly_usd REAL NOT NULL,
        launched_at REAL NOT NULL,
        lease_end REAL NOT NULL,
        ready_at REAL,
        release_at REAL,
        gone_at REAL,
        trial INTEGER,
        attempt INTEGER,
        runs INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        PRIMARY KEY (sweep, id)
    );
    """,
    # version 5: cluster incarnations. A cluster's uid is written with its first row, before any
    # create call; billing, runs and jobs carry it, so a new cluster of a reused name starts with
    # a clean history (no inherited budget or spend). Billing rows say where their times came from
    # and the cloud's minimum billed seconds per start. A launch in flight is an intent: the
    # process driving it (boot id:pid:start time) and a heartbeat, so `gc` and other terminals
    # leave it alone. Rows written before v5 get an incarnation of their own ("legacy-<id>")
    # unless they fall inside the current cluster's lifetime.
    """
    ALTER TABLE clusters ADD COLUMN uid TEXT;
    ALTER TABLE clusters ADD COLUMN driver TEXT;
    ALTER TABLE clusters ADD COLUMN heartbeat_at REAL;
    ALTER TABLE billing ADD COLUMN incarnation TEXT;
    ALTER TABLE billing ADD COLUMN min_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE billing ADD COLUMN source TEXT;
    ALTER TABLE runs ADD COLUMN incarnation TEXT;
    ALTER TABLE runs ADD COLUMN driver TEXT;
    ALTER TABLE jobs ADD COLUMN incarnation TEXT;
    UPDATE clusters SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL;
    UPDATE billing SET incarnation = (SELECT c.uid FROM clusters c WHERE c.name = billing.cluster
                                      AND billing.started_at >= c.created_at - 1)
        WHERE incarnation IS NULL;
    UPDATE billing SET incarnation = 'legacy-' || id WHERE incarnation IS NULL;
    UPDATE runs SET incarnation = (SELECT c.uid FROM clusters c WHERE c.name = runs.cluster
                                   AND runs.started_at >= c.created_at - 1) WHERE incarnation IS NULL;
    UPDATE jobs SET incarnation = (SELECT c.uid FROM clusters c WHERE c.name = jobs.cluster) WHERE incarnation IS NULL;
    CREATE INDEX billing_by_incarnation ON billing(incarnation, started_at)
    """,
    # version 6: a launch intent's deadline, written before the create call: the latest moment its
    # machines can live (the deadline in the launch request). A machine whose create answer was
    # lost and that the cloud no longer reports is booked until then, as an estimate.
    """
    ALTER TABLE clusters ADD COLUMN deadline_at REAL
    """,
    # version 7: notifications (cloudtrain/notify): each event once, its body exactly as signed and
    # sent, and one delivery row per target (a reference to where the target is configured, never
    # its URL or secret), so a later command sends what a receiver that was down missed.
    """
    CREATE TABLE notify_events (
        id TEXT PRIMARY KEY, type TEXT NOT NULL, at REAL NOT NULL, source TEXT NOT NULL,
        run_id TEXT, cluster TEXT, body TEXT NOT NULL
    );
    CREATE TABLE notify_deliveries (
        event TEXT NOT NULL REFERENCES notify_events(id) ON DELETE CASCADE,
        target TEXT NOT NULL, label TEXT NOT NULL, state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, rounds INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL, last_error TEXT, delivered_at REAL,
        PRIMARY KEY (event, target)
    );
    CREATE INDEX notify_due ON notify_deliveries(state, next_at)
    """,
    # version 8: team budgets (state/budgets.py). `budgets`: a monthly cap per member and project
    # ('*': every member, every project). `budget_holds`: one row per launched incarnation, written
    # in the launch intent's transaction: who launched it, for which project, and its worst case
    # (NULL: nothing bounds it). A hold counts while its cluster lives; the row stays afterwards as
    # the incarnation's owner, so the month's spend is attributed to members and projects.
    """
    CREATE TABLE budgets (
        member TEXT NOT NULL, project TEXT NOT NULL,
        monthly_usd REAL NOT NULL,
        set_at REAL NOT NULL, set_by TEXT NOT NULL,
        PRIMARY KEY (member, project)
    );
    CREATE TABLE budget_holds (
        incarnation TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        member TEXT NOT NULL, project TEXT NOT NULL,
        usd REAL,
        at REAL NOT NULL
    );
    CREATE INDEX budget_holds_by_scope ON budget_holds(member, project)
    """,
    # version 9: team policies (state/policies.py), for parity with the team database's v4: the
    # floors no recipe and no `cloudtrain autostop` lifts, one row per project (NULL: every
    # project). Only a team database's rows are read; this machine's floor is the config's
    # `policy:`, so the table stays empty here.
    """
    CREATE TABLE policies (
        project TEXT,
        max_idle_minutes INTEGER CHECK (max_idle_minutes >= 1),
        max_hours REAL CHECK (max_hours > 0),
        set_at REAL NOT NULL, set_by TEXT NOT NULL,
        CHECK (max_idle_minutes IS NOT NULL OR max_hours IS NOT NULL)
    );
    CREATE UNIQUE INDEX policies_by_project ON policies ((COALESCE(project, '')))
    """,
]
SCHEMA_VERSION = len(_MIGRATIONS)
