"""State: clusters, nodes, jobs, runs, billing, events, log cursors, sweeps, notifications.

By default one SQLite file under $CLOUDTRAIN_HOME. WAL mode plus short `BEGIN IMMEDIATE` write
transactions make two CLI processes at once safe: readers never block, writers queue on the busy
timeout instead of failing. The schema is versioned with `PRAGMA user_version` and migrated
forward on open.

With `state_url: postgresql://...` (or $CLOUDTRAIN_STATE_URL) the same tables live in a team's
PostgreSQL database (state/pg.py: the same SQL through a small translating connection, writers
serialized by an advisory lock as BEGIN IMMEDIATE does); its schema is migrated only by
`cloudtrain team migrate` (state/team.py). Nothing above this module knows which engine it has.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar

from cloudtrain import paths
from cloudtrain.state.records import (  # noqa: F401 - the package's public names
    BillingRecord,
    BillKind,
    ClusterRecord,
    ClusterStatus,
    EventRecord,
    JobRecord,
    NodeRecord,
    RunRecord,
    RunStatus,
    SweepAttemptRow,
    SweepRecord,
    SweepTrialRow,
    SweepVmRow,
)
from cloudtrain.state.schema import _MIGRATIONS, SCHEMA_VERSION

R = TypeVar("R")


# The primary key of each table the sweep journal upserts (`INSERT ... ON CONFLICT` names it).
_SWEEP_KEYS = {"sweep_trials": "sweep, number", "sweep_attempts": "sweep, trial, attempt", "sweep_vms": "sweep, id"}


@functools.cache
def _field_names(record: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record))


def _rows(cursor: Any, record: type[R]) -> list[R]:
    """The cursor's rows as `record`s, whatever the order of its columns (and extra ones, a team
    database's member and project): fields taken by position, not by name per row per field (that
    was most of `cost`'s time reading the ledger's 10,000 rows)."""
    # A team database's cursor also gives plain tuples: their fields are picked in C, where a
    # Row's are picked by a Python __getitem__ each (sqlite3.Row's are in C already).
    rows = getattr(cursor, "fetchall_values", cursor.fetchall)()
    if not rows:
        return []
    at = {column[0]: i for i, column in enumerate(cursor.description)}
    pick = itemgetter(*(at[n] for n in _field_names(record)))
    return [record(*pick(row)) for row in rows]


class StateStore:
    """The only place SQL lives. `lifecycle` is the only writer of cluster state."""

    def __init__(self, path: Path | str | None = None) -> None:
        """`path`: a SQLite file or a postgresql:// URL; None: where the config says (location.py).
        `self.path` opens the same store again (threads that need a connection of their own)."""
        if path is None:
            from cloudtrain.state.location import state_url

            path = state_url() or paths.state_db()
        # What a write transaction starts with: for PostgreSQL, BEGIN and the writers' lock.
        self._begin: tuple[str, ...] = ("BEGIN IMMEDIATE",)
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        self.path: Path | str
        if isinstance(path, str) and path.startswith(("postgresql://", "postgres://")):
            from cloudtrain.state import pg

            self.path = path
            self._db: Any = pg.open_store(path)
            self._begin = (pg.BEGIN, pg.AFTER_BEGIN)
            self.errors = pg.errors()
            return
        self._open_sqlite(Path(path))

    def _open_sqlite(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Owner-only before SQLite opens it (SQLite gives its -wal and -shm files the same mode):
        # the file names every cluster, address and key path of the user. Only a file that does
        # not exist yet is opened here: closing any descriptor of a database file drops every
        # POSIX lock this process holds on it, those of SQLite connections in other threads too.
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
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
    def _write(self) -> Iterator[Any]:
        # IMMEDIATE takes the write lock up front, so two processes never both read-then-upgrade
        # and deadlock; the loser waits on busy_timeout. PostgreSQL: the writers' advisory lock.
        self._begin_write()
        try:
            for statement in self._begin[1:]:
                self._db.execute(statement)
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _begin_write(self) -> None:
        # SQLite answers some lock conflicts at once, without its busy handler: in WAL mode a
        # connection whose read snapshot went stale while another process committed gets
        # SQLITE_BUSY_SNAPSHOT ("database is locked") on BEGIN IMMEDIATE. Nothing has been done
        # yet, so starting again is safe; the same 30 s as busy_timeout bound it.
        deadline = time.monotonic() + 30.0
        pause = 0.005
        while True:
            try:
                self._db.execute(self._begin[0])
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

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
        with self._write() as db:
            self.upsert_cluster_in(db, **values)

    @staticmethod
    def upsert_cluster_in(db: Any, **values: Any) -> str:
        """upsert_cluster inside the caller's write transaction (`with store._write() as db`: a
        launch intent written with its budget hold); the row's incarnation (uid)."""
        unknown = set(values) - {f.name for f in fields(ClusterRecord)}
        if unknown:
            raise ValueError(f"unknown clusters columns: {sorted(unknown)}")
        now = time.time()
        values.setdefault("updated_at", now)
        existing = db.execute("SELECT uid FROM clusters WHERE name = ?", (values["name"],)).fetchone()
        if existing:
            sets = ", ".join(f"{k} = :{k}" for k in values if k != "name")
            db.execute(f"UPDATE clusters SET {sets} WHERE name = :name", values)
            return str(values.get("uid") or existing["uid"])
        values.setdefault("created_at", now)
        # A new incarnation: everything billed or run from here on is keyed by this uid.
        import uuid  # here, not at the top: it imports `platform`, paid by every read-only verb

        values.setdefault("uid", uuid.uuid4().hex)
        cols = ", ".join(values)
        db.execute(f"INSERT INTO clusters ({cols}) VALUES ({', '.join(':' + k for k in values)})", values)
        return str(values["uid"])

    def set_cluster_status(self, name: str, status: str, error: str | None = None) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE clusters SET status = ?, last_error = ?, updated_at = ? WHERE name = ?",
                (status, error, time.time(), name),
            )

    def get_cluster(self, name: str) -> ClusterRecord | None:
        found = _rows(self._db.execute("SELECT * FROM clusters WHERE name = ?", (name,)), ClusterRecord)
        return found[0] if found else None

    def list_clusters(self, status: str | None = None) -> list[ClusterRecord]:
        """Every cluster row, oldest first; with `status`, only those in it."""
        if status is None:
            return _rows(self._db.execute("SELECT * FROM clusters ORDER BY created_at"), ClusterRecord)
        return _rows(self._db.execute("SELECT * FROM clusters WHERE status = ? ORDER BY created_at", (str(status),)),
                     ClusterRecord)

    def cluster_states(self) -> list[tuple[str, str | None, str]]:
        """(name, incarnation (uid), status) of every cluster row, oldest first: what the ledger's
        reports need of the clusters, without reading whole rows (1,000 of them: ~6 ms)."""
        rows = self._db.execute("SELECT name, uid, status FROM clusters ORDER BY created_at").fetchall()
        return [(row[0], row[1], row[2]) for row in rows]

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

    def live_runs(self, cluster: str, except_run: str | None = None) -> list[RunRecord]:
        """Runs on `cluster` whose `cloudtrain run` process is still alive on this machine."""
        return [r for r in self.list_runs(cluster=cluster, limit=100)
                if r.status == RunStatus.RUNNING and r.id != except_run and r.driver_alive()]

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

    def apply(self, name: str, transition: Any, incarnation: str, cloud: str) -> None:
        """Write a reconcile.Transition in one transaction: node rows, status, billed intervals, events.
        A closing op closes the node's open interval of that kind in this incarnation only."""
        now = time.time()
        with self._write() as db:
            db.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            for node in transition.nodes:
                db.execute(
                    "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (node.cluster, node.rank, node.instance_id, node.state, node.public_ip, node.private_ip,
                     node.ssh_user, node.ssh_port, node.ssh_key, node.proxy_command, node.started_at),
                )
            db.execute("UPDATE clusters SET status = ?, updated_at = ? WHERE name = ? AND uid = ?",
                       (str(transition.status), now, name, incarnation))
            for op in transition.billing:
                if op.amend:
                    db.execute("UPDATE billing SET hourly_price = ? WHERE incarnation = ? AND instance_id = ? "
                               "AND kind = ? AND ended_at IS NULL", (op.hourly_price, incarnation, op.instance_id,
                                                                     str(op.kind)))
                elif op.open:
                    db.execute(
                        "INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at, incarnation, "
                        "min_s, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (name, cloud, op.instance_id, str(op.kind), op.hourly_price, op.at, incarnation, op.min_s,
                         str(op.source)))
                else:
                    db.execute("UPDATE billing SET ended_at = MAX(started_at, ?) WHERE incarnation = ? AND instance_id = ? "
                               "AND kind = ? AND ended_at IS NULL", (op.at, incarnation, op.instance_id, str(op.kind)))
            for kind, message in transition.events:
                db.execute("INSERT INTO events (ts, cluster, kind, message) VALUES (?, ?, ?, ?)",
                           (now, name, kind, message))

    def open_billing(self, incarnation: str) -> list[BillingRecord]:
        cur = self._db.execute("SELECT * FROM billing WHERE incarnation = ? AND ended_at IS NULL ORDER BY id",
                               (incarnation,))
        return _rows(cur, BillingRecord)

    def end_billing(self, incarnation: str, at: float) -> None:
        """Close every open interval of an incarnation at `at`: only for a row that is being
        forgotten (`down --forget`), when nothing more will ever be observed of it."""
        with self._write() as db:
            db.execute("UPDATE billing SET ended_at = MAX(started_at, ?) WHERE incarnation = ? AND ended_at IS NULL",
                       (at, incarnation))

    def heartbeat(self, name: str, incarnation: str) -> None:
        with self._write() as db:
            db.execute("UPDATE clusters SET heartbeat_at = ? WHERE name = ? AND uid = ?", (time.time(), name, incarnation))

    def billing(self, cluster: str | None = None, since: float = 0.0,
                incarnation: str | None = None) -> list[BillingRecord]:
        """Intervals that may bill in [since, now), oldest first: of a cluster name (every
        incarnation it had), or of one incarnation."""
        # An interval ended before `since` may still bill its minimum after it.
        query = "SELECT * FROM billing WHERE (ended_at IS NULL OR MAX(ended_at, started_at + min_s) > ?)"
        args: list[Any] = [since]
        if cluster is not None:
            query += " AND cluster = ?"
            args.append(cluster)
        if incarnation is not None:
            query += " AND incarnation = ?"
            args.append(incarnation)
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
        row = self._db.execute('SELECT "offset" FROM log_cursors WHERE job_id = ?', (job_id,)).fetchone()
        return int(row["offset"]) if row else 0

    def set_log_cursor(self, job_id: str, offset: int) -> None:
        with self._write() as db:
            db.execute(
                'INSERT INTO log_cursors (job_id, "offset") VALUES (?, ?) '
                'ON CONFLICT(job_id) DO UPDATE SET "offset" = excluded."offset"',
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
                    # Every column is given, so an update of all of them is what REPLACE did.
                    db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                               f"ON CONFLICT ({_SWEEP_KEYS[table]}) DO UPDATE SET "
                               f"{', '.join(f'{c} = excluded.{c}' for c in cols)}", [getattr(row, c) for c in cols])
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
