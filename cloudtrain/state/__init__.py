"""SQLite state: clusters, nodes, jobs, runs, events, log cursors.

One file under $CLOUDTRAIN_HOME. WAL mode plus short `BEGIN IMMEDIATE` write transactions make two
CLI processes at once safe: readers never block, writers queue on the busy timeout instead of
failing. The schema is versioned with `PRAGMA user_version` and migrated forward on open.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from cloudtrain import paths

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
]
SCHEMA_VERSION = len(_MIGRATIONS)


class ClusterStatus(StrEnum):
    PROVISIONING = "provisioning"
    UP = "up"
    STOPPED = "stopped"
    TERMINATED = "terminated"
    LAUNCH_FAILED = "launch-failed"  # cleanup could not reach the cloud: `down` or `gc` must finish it
    DOWN_FAILED = "down-failed"  # a node could not be cleaned: `down` again, or `down --forget`


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the job succeeded and its results and logs are home, verified
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"  # the `cloudtrain run` process died without finishing the row



@dataclass(frozen=True)
class ClusterRecord:
    name: str
    provider: str
    status: str
    region: str | None
    zone: str | None
    instance_type: str | None
    hourly_price: float
    num_nodes: int
    recipe_path: str | None
    recipe_digest: str | None
    owner: str
    created_at: float
    updated_at: float
    last_error: str | None
    spot: int = 0


@dataclass(frozen=True)
class NodeRecord:
    cluster: str
    rank: int
    instance_id: str
    state: str
    public_ip: str | None
    private_ip: str | None
    ssh_user: str | None
    ssh_port: int | None
    ssh_key: str | None
    proxy_command: str | None
    started_at: float | None


@dataclass(frozen=True)
class RunRecord:
    id: str
    cluster: str
    recipe_path: str | None
    recipe_digest: str | None
    run_dir: str | None
    status: str
    exit_code: int | None
    provider: str | None
    instance_type: str | None
    hourly_price: float
    cost_usd: float
    started_at: float
    ended_at: float | None
    pid: int | None = None
    result_paths: str | None = None  # JSON list, relative to the workdir
    error: str | None = None  # why the run failed (job, collect, teardown), one line

    def driver_alive(self) -> bool:
        """Whether the cloudtrain process that drives this run is still running on this machine."""
        if self.pid is None:
            return False
        import os

        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@dataclass(frozen=True)
class JobRecord:
    id: str
    cluster: str
    run_id: str | None
    job_dir: str
    status: str
    command: str | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None


@dataclass(frozen=True)
class BillingRecord:
    id: int
    cluster: str
    cloud: str
    instance_id: str
    kind: str  # "running" | "stopped"
    hourly_price: float  # USD per hour for this node in this state
    started_at: float
    ended_at: float | None  # None: still billing

    def cost(self, until: float, since: float = 0.0) -> float:
        """USD billed between `since` and `until` (clipped to this interval)."""
        start = max(self.started_at, since)
        end = min(self.ended_at if self.ended_at is not None else until, until)
        return max(0.0, end - start) * self.hourly_price / 3600.0


@dataclass(frozen=True)
class EventRecord:
    id: int
    ts: float
    cluster: str | None
    kind: str
    message: str


R = TypeVar("R")


def _rows(cursor: sqlite3.Cursor, record: type[R]) -> list[R]:
    names = [f.name for f in fields(record)]  # type: ignore[arg-type]
    return [record(**{n: row[n] for n in names}) for row in cursor.fetchall()]


class StateStore:
    """The only place SQL lives. `lifecycle` is the only writer of cluster state."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.state_db()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout = 30000")
        self._db.execute("PRAGMA foreign_keys = ON")
        mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
        if mode != "wal":
            self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so two processes never both read-then-upgrade
        # and deadlock; the loser waits on busy_timeout.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _insert(self, table: str, record: Any) -> None:
        cols = [f.name for f in fields(record)]
        with self._write() as db:
            db.execute(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                [getattr(record, c) for c in cols],
            )

    def _update(self, table: str, record_type: type, record_id: str, values: dict[str, Any]) -> None:
        # Column names come from code, but check them anyway: they are spliced into SQL.
        unknown = set(values) - {f.name for f in fields(record_type)}
        if unknown:
            raise ValueError(f"unknown {table} columns: {sorted(unknown)}")
        sets = ", ".join(f"{k} = :{k}" for k in values)
        with self._write() as db:
            db.execute(f"UPDATE {table} SET {sets} WHERE id = :id", {**values, "id": record_id})

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            from cloudtrain.errors import CloudtrainError

            raise CloudtrainError(
                f"{self.path}: state schema v{version} is newer than this cloudtrain (v{SCHEMA_VERSION})",
                hint="upgrade cloudtrain",
            )
        if version == SCHEMA_VERSION:
            return
        with self._write() as db:
            # Re-read under the lock: another process may have migrated meanwhile.
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {step + 1}")

    # clusters ------------------------------------------------------------------------------------

    def upsert_cluster(self, **values: Any) -> None:
        unknown = set(values) - {f.name for f in fields(ClusterRecord)}
        if unknown:
            raise ValueError(f"unknown clusters columns: {sorted(unknown)}")
        now = time.time()
        values.setdefault("updated_at", now)
        with self._write() as db:
            existing = db.execute("SELECT name FROM clusters WHERE name = ?", (values["name"],)).fetchone()
            if existing:
                sets = ", ".join(f"{k} = :{k}" for k in values if k != "name")
                db.execute(f"UPDATE clusters SET {sets} WHERE name = :name", values)
            else:
                values.setdefault("created_at", now)
                cols = ", ".join(values)
                db.execute(f"INSERT INTO clusters ({cols}) VALUES ({', '.join(':' + k for k in values)})", values)

    def set_cluster_status(self, name: str, status: str, error: str | None = None) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE clusters SET status = ?, last_error = ?, updated_at = ? WHERE name = ?",
                (status, error, time.time(), name),
            )

    def get_cluster(self, name: str) -> ClusterRecord | None:
        found = _rows(self._db.execute("SELECT * FROM clusters WHERE name = ?", (name,)), ClusterRecord)
        return found[0] if found else None

    def list_clusters(self) -> list[ClusterRecord]:
        return _rows(self._db.execute("SELECT * FROM clusters ORDER BY created_at"), ClusterRecord)

    def delete_cluster(self, name: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))

    # nodes ---------------------------------------------------------------------------------------

    def put_nodes(self, cluster: str, nodes: list[NodeRecord]) -> None:
        with self._write() as db:
            db.execute("DELETE FROM nodes WHERE cluster = ?", (cluster,))
            for node in nodes:
                db.execute(
                    "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (node.cluster, node.rank, node.instance_id, node.state, node.public_ip, node.private_ip,
                     node.ssh_user, node.ssh_port, node.ssh_key, node.proxy_command, node.started_at),
                )

    def get_nodes(self, cluster: str) -> list[NodeRecord]:
        return _rows(self._db.execute("SELECT * FROM nodes WHERE cluster = ? ORDER BY rank", (cluster,)), NodeRecord)

    # runs ----------------------------------------------------------------------------------------

    def insert_run(self, run: RunRecord) -> None:
        self._insert("runs", run)

    def update_run(self, run_id: str, **values: Any) -> None:
        self._update("runs", RunRecord, run_id, values)

    def get_run(self, run_id: str) -> RunRecord | None:
        found = _rows(self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)), RunRecord)
        return found[0] if found else None

    def list_runs(self, cluster: str | None = None, limit: int = 20) -> list[RunRecord]:
        if cluster:
            cur = self._db.execute(
                "SELECT * FROM runs WHERE cluster = ? ORDER BY started_at DESC LIMIT ?", (cluster, limit)
            )
        else:
            cur = self._db.execute("SELECT * FROM runs ORDER BY started_at DESC LIMIT ?", (limit,))
        return _rows(cur, RunRecord)

    # jobs ----------------------------------------------------------------------------------------

    def insert_job(self, job: JobRecord) -> None:
        self._insert("jobs", job)

    def update_job(self, job_id: str, **values: Any) -> None:
        self._update("jobs", JobRecord, job_id, values)

    def get_job(self, job_id: str) -> JobRecord | None:
        found = _rows(self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)), JobRecord)
        return found[0] if found else None

    def list_jobs(self, cluster: str) -> list[JobRecord]:
        cur = self._db.execute("SELECT * FROM jobs WHERE cluster = ? ORDER BY submitted_at", (cluster,))
        return _rows(cur, JobRecord)

    def delete_jobs(self, cluster: str) -> None:
        """Forget a cluster's jobs (after `down`): a new cluster of the same name starts clean."""
        with self._write() as db:
            db.execute("DELETE FROM log_cursors WHERE job_id IN (SELECT id FROM jobs WHERE cluster = ?)", (cluster,))
            db.execute("DELETE FROM jobs WHERE cluster = ?", (cluster,))

    def latest_jobs(self) -> dict[str, JobRecord]:
        """The newest job of every cluster, in one query (status must stay fast with many clusters)."""
        cur = self._db.execute(
            "SELECT j.* FROM jobs j JOIN (SELECT cluster, MAX(submitted_at) AS t FROM jobs GROUP BY cluster) m "
            "ON j.cluster = m.cluster AND j.submitted_at = m.t"
        )
        return {job.cluster: job for job in _rows(cur, JobRecord)}

    # events and log cursors ----------------------------------------------------------------------

    # billing --------------------------------------------------------------------------------------

    def bill(self, cluster: str, cloud: str, instance_ids: list[str], kind: str, hourly_price: float,
             at: float | None = None) -> None:
        """Close the nodes' open intervals and open new ones in `kind` at `hourly_price` (per node)."""
        now = time.time() if at is None else at
        with self._write() as db:
            for instance_id in instance_ids:
                db.execute("UPDATE billing SET ended_at = ? WHERE instance_id = ? AND cluster = ? AND ended_at IS NULL",
                           (now, instance_id, cluster))
                db.execute(
                    "INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)", (cluster, cloud, instance_id, kind, hourly_price, now))

    def end_billing(self, cluster: str, instance_ids: list[str] | None = None, at: float | None = None) -> None:
        """Close open intervals (the nodes are gone): of the listed nodes, or of the whole cluster."""
        now = time.time() if at is None else at
        with self._write() as db:
            if instance_ids is None:
                db.execute("UPDATE billing SET ended_at = ? WHERE cluster = ? AND ended_at IS NULL", (now, cluster))
            else:
                for instance_id in instance_ids:
                    db.execute("UPDATE billing SET ended_at = ? WHERE cluster = ? AND instance_id = ? AND ended_at IS NULL",
                               (now, cluster, instance_id))

    def billing(self, cluster: str | None = None, since: float = 0.0) -> list[BillingRecord]:
        """Intervals that overlap [since, now), oldest first."""
        query = "SELECT * FROM billing WHERE (ended_at IS NULL OR ended_at > ?)"
        args: list[Any] = [since]
        if cluster is not None:
            query += " AND cluster = ?"
            args.append(cluster)
        return _rows(self._db.execute(query + " ORDER BY started_at, id", args), BillingRecord)

    def add_event(self, cluster: str | None, kind: str, message: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO events (ts, cluster, kind, message) VALUES (?, ?, ?, ?)",
                (time.time(), cluster, kind, message),
            )

    def list_events(self, cluster: str | None = None) -> list[EventRecord]:
        if cluster:
            cur = self._db.execute("SELECT * FROM events WHERE cluster = ? ORDER BY id", (cluster,))
        else:
            cur = self._db.execute("SELECT * FROM events ORDER BY id")
        return _rows(cur, EventRecord)

    def get_log_cursor(self, job_id: str) -> int:
        row = self._db.execute("SELECT offset FROM log_cursors WHERE job_id = ?", (job_id,)).fetchone()
        return int(row["offset"]) if row else 0

    def set_log_cursor(self, job_id: str, offset: int) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO log_cursors (job_id, offset) VALUES (?, ?) "
                "ON CONFLICT(job_id) DO UPDATE SET offset = excluded.offset",
                (job_id, offset),
            )

    # sweeps ----------------------------------------------------------------------------------------

    def insert_sweep(self, sweep: SweepRecord) -> None:
        self._insert("sweeps", sweep)

    def update_sweep(self, sweep_id: str, **values: Any) -> None:
        values.setdefault("updated_at", time.time())
        self._update("sweeps", SweepRecord, sweep_id, values)

    def get_sweep(self, sweep_id: str) -> SweepRecord | None:
        found = _rows(self._db.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)), SweepRecord)
        return found[0] if found else None

    def list_sweeps(self, limit: int = 50) -> list[SweepRecord]:
        return _rows(self._db.execute("SELECT * FROM sweeps ORDER BY created_at DESC LIMIT ?", (limit,)), SweepRecord)

    def save_sweep_records(self, sweep_id: str, trials: list[SweepTrialRow], attempts: list[SweepAttemptRow],
                           vms: list[SweepVmRow], counters: dict[str, Any] | None = None) -> None:
        """The scheduler's changed records, all in one transaction (its journal)."""
        unknown = set(counters or {}) - {"next_slot", "boot_failures", "stop_reason", "ended_reason"}
        if unknown:
            raise ValueError(f"unknown sweep counters: {sorted(unknown)}")
        with self._write() as db:
            for table, rows in (("sweep_trials", trials), ("sweep_attempts", attempts), ("sweep_vms", vms)):
                for row in rows:
                    cols = [f.name for f in fields(row)]
                    db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) "
                               f"VALUES ({', '.join('?' for _ in cols)})", [getattr(row, c) for c in cols])
            if counters:
                sets = ", ".join(f"{k} = :{k}" for k in counters)
                db.execute(f"UPDATE sweeps SET {sets}, updated_at = :now WHERE id = :id",
                           {**counters, "now": time.time(), "id": sweep_id})

    def sweep_trials(self, sweep_id: str) -> list[SweepTrialRow]:
        cur = self._db.execute("SELECT * FROM sweep_trials WHERE sweep = ? ORDER BY number", (sweep_id,))
        return _rows(cur, SweepTrialRow)

    def sweep_attempts(self, sweep_id: str) -> list[SweepAttemptRow]:
        cur = self._db.execute("SELECT * FROM sweep_attempts WHERE sweep = ? ORDER BY started_at, trial, attempt",
                               (sweep_id,))
        return _rows(cur, SweepAttemptRow)

    def sweep_vms(self, sweep_id: str) -> list[SweepVmRow]:
        cur = self._db.execute("SELECT * FROM sweep_vms WHERE sweep = ? ORDER BY slot", (sweep_id,))
        return _rows(cur, SweepVmRow)


@dataclass(frozen=True)
class SweepRecord:
    id: str
    name: str
    recipe_path: str
    recipe_digest: str
    status: str  # running | stopping | done | stopped | failed
    pid: int | None  # the process driving it
    results_dir: str
    spec: str  # JSON: costs, limits, metric, goal (fixed when the sweep starts)
    created_at: float
    updated_at: float
    ended_at: float | None = None
    error: str | None = None
    next_slot: int = 0
    boot_failures: int = 0
    stop_reason: str | None = None
    ended_reason: str | None = None


@dataclass(frozen=True)
class SweepTrialRow:
    sweep: str
    number: int
    params: str  # JSON object
    state: str
    attempts: int
    failures: int
    value: float | None
    error: str | None
    created_at: float
    ended_at: float | None


@dataclass(frozen=True)
class SweepAttemptRow:
    sweep: str
    trial: int
    attempt: int
    vm: str
    started_at: float
    deadline_at: float
    hourly_usd: float
    state: str
    ended_at: float | None
    value: float | None
    error: str | None
    stopping: str | None


@dataclass(frozen=True)
class SweepVmRow:
    sweep: str
    id: str
    slot: int
    state: str
    hourly_usd: float
    launched_at: float
    lease_end: float
    ready_at: float | None
    release_at: float | None
    gone_at: float | None
    trial: int | None
    attempt: int | None
    runs: int
    error: str | None
