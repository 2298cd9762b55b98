"""A team database's schema: `cloudtrain team init` and `cloudtrain team migrate`.

The project's own runner, not alembic: the migrations are a list of SQL scripts (schema_pg.py, as
the SQLite ones are in schema.py), and what a runner must do is small: hold a session advisory
lock so that two admins migrating at once apply each step once, run each step in a transaction
of its own (a step that fails leaves the database at the step before, never half-migrated, and
no long transaction holds locks across steps: dstack #3219's deadlock), and record the version
with who applied it. alembic would bring SQLAlchemy into every verb that checks the version on
open (tens of ms of imports in a CLI whose `status` takes ~85 ms) and a second way of writing
a schema the SQLite side does not share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from cloudtrain.errors import UsageError
from cloudtrain.state import pg
from cloudtrain.state.budgets import is_team, who
from cloudtrain.state.locks import launch_in_flight
from cloudtrain.state.schema_pg import PG_MIGRATIONS, PG_READ_ONLY_TABLES, PG_SCHEMA_VERSION, PG_TABLES

MEMBER_ROLE = "cloudtrain_member"


@dataclass(frozen=True)
class Migrated:
    before: int  # 0: the database had no cloudtrain schema
    after: int
    applied: tuple[int, ...]


def _create_version_table(conn: Any) -> None:
    conn.execute(f"CREATE TABLE IF NOT EXISTS {pg.VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                 "applied_at DOUBLE PRECISION NOT NULL, applied_by TEXT NOT NULL, cli_version TEXT NOT NULL)")


def migrate(url: str, *, init: bool = False, to: int = PG_SCHEMA_VERSION) -> Migrated:
    """Apply every step the database lacks (up to `to`: the tests build each released version).
    `init`: the database may have no cloudtrain schema yet (`team init`); `migrate` refuses one,
    so a mistyped URL never grows a schema."""
    from cloudtrain import __version__

    conn = pg.connect(url)
    try:
        # Session-level: held across the steps' transactions, freed by the server if we die.
        conn.execute(f"SELECT pg_advisory_lock({pg.MIGRATE_LOCK})")
        before = pg.schema_version(conn)
        where = pg.display(url)
        if before is None and not init:
            raise UsageError(f"the state database {where} has no cloudtrain schema",
                             hint="`cloudtrain team init` prepares an empty database")
        if before is not None and before > PG_SCHEMA_VERSION:
            raise UsageError(f"the state database {where} is at schema v{before}, newer than this cloudtrain "
                             f"(v{PG_SCHEMA_VERSION})", hint="upgrade cloudtrain: pip install -U 'cloudtrain[team]'")
        applied = []
        for step in range(before or 0, to):
            conn.execute("BEGIN")
            try:
                _create_version_table(conn)
                # Re-read inside the transaction: the lock makes this redundant unless someone
                # migrated without it (an older runner); then the step is theirs.
                if (pg.schema_version(conn) or 0) > step:
                    conn.execute("ROLLBACK")
                    continue
                for statement in PG_MIGRATIONS[step].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"INSERT INTO {pg.VERSION_TABLE} VALUES (%s, %s, current_user, %s)",
                             (step + 1, time.time(), __version__))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            applied.append(step + 1)
        if to == PG_SCHEMA_VERSION:
            _create_study_tables(url)
        conn.execute(f"SELECT pg_advisory_unlock({pg.MIGRATE_LOCK})")
        return Migrated(before or 0, max([before or 0, *applied]), tuple(applied))
    finally:
        conn.close()


def _create_study_tables(url: str) -> None:
    """Sweeps keep their Optuna study in the team database (sweep/space.py), in Optuna's own tables (state/optuna_tables.py),
    which members may not create: made here, under the migration lock. Optuna's schema is Optuna's
    (not a version of ours); without Optuna installed there is nothing to make."""
    try:
        from cloudtrain.state.optuna_tables import create_study_tables
    except ImportError:
        return
    create_study_tables(url)


def _study_tables(conn: Any) -> list[str]:
    """Optuna's tables that the database holds (`_create_study_tables`), for the members' grants."""
    try:
        from cloudtrain.state.optuna_tables import study_tables
    except ImportError:
        return []
    names = list(study_tables())
    return [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                                       "AND tablename = ANY(%s) ORDER BY tablename", (names,)).fetchall()]


def grants(url: str) -> str:
    """The SQL an admin runs once so that members can use the database (and no more: they read
    and write rows; creating, altering or dropping tables stays with the admin who ran init)."""
    conn = pg.connect(url)
    try:
        database, schema = conn.execute("SELECT current_database(), current_schema()").fetchone()
        study = _study_tables(conn)
    finally:
        conn.close()
    tables = ", ".join(_ident(schema) + "." + t for t in (*PG_TABLES, *study))
    member = MEMBER_ROLE
    return "\n".join([
        f"CREATE ROLE {member} NOLOGIN;",
        f"GRANT CONNECT ON DATABASE {_ident(database)} TO {member};",
        f"GRANT USAGE ON SCHEMA {_ident(schema)} TO {member};",
        f"GRANT SELECT ON {_ident(schema)}.{pg.VERSION_TABLE}, "
        + ", ".join(_ident(schema) + "." + t for t in PG_READ_ONLY_TABLES) + f" TO {member};",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {member};",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {_ident(schema)} TO {member};",
        f"-- then, per member (password in their ~/.pgpass, never in state_url): "
        f"CREATE ROLE alice LOGIN IN ROLE {member};",
    ])


def _ident(name: str) -> str:
    """A SQL identifier as written in the printed grants: quoted only when it must be."""
    import re

    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'



# teammates ---------------------------------------------------------------------------------------------
# On a team database every member sees every cluster row; what one member's verbs may do with
# another's is decided here, in one place: `gc` never takes a teammate's live work for a leak, and
# `down`/`stop` of a teammate's cluster needs --force (and is recorded, with who did it).


@dataclass(frozen=True)
class Teammate:
    """A cluster row another member wrote: whose it is, and where."""

    cluster: str
    member: str
    cloud: str
    status: str


def teammates_live(store: Any, now: float | None = None) -> dict[str, Teammate]:
    """Every cluster row of another member that is live work: up, stopped (its disks kept to be
    started again), or a launch in flight (a live process, or a fresh heartbeat from another
    machine). A teammate's launch-failed or down-failed row, or an intent whose launcher died,
    is not: gc lists what they left as it does for anyone's (saying whose). {} on SQLite: one
    machine's file has no teammates."""
    from cloudtrain.state import ClusterRecord, ClusterStatus

    if not is_team(store):
        return {}
    now = time.time() if now is None else now
    names = [f.name for f in fields(ClusterRecord)]
    rows = store._db.execute("SELECT * FROM clusters WHERE member != current_user ORDER BY member, name").fetchall()
    found: dict[str, Teammate] = {}
    for row in rows:
        record = ClusterRecord(**{n: row[n] for n in names})
        live = record.status in (ClusterStatus.UP, ClusterStatus.STOPPED) or launch_in_flight(record, now)
        if live:
            found[record.name] = Teammate(record.name, str(row["member"]), record.provider, record.status)
    return found


def whose(store: Any, name: str) -> str | None:
    """The member whose cluster `name` is, when that is not this CLI's member (a team database);
    None for one's own, an unknown name, or SQLite."""
    if not is_team(store):
        return None
    row = store._db.execute("SELECT member, current_user AS me FROM clusters WHERE name = ?", (name,)).fetchone()
    if row is None or row["member"] == row["me"]:
        return None
    return str(row["member"])


def guard_teammates(store: Any, names: Any, verb: str, force: bool) -> dict[str, str]:
    """`down`/`stop` of a teammate's cluster: refused in one line (exit 2) unless `force`; with it,
    an event on each such cluster says who ended or stopped whose (the events table records the
    writer's role too). Every name is checked before anything is done: `down a b` with b a
    teammate's ends nothing. Returns {cluster: its member} of the teammates' clusters."""
    theirs = {name: member for name in names if (member := whose(store, name)) is not None}
    if not theirs:
        return {}
    if not force:
        name, member = next(iter(theirs.items()))
        done = {"down": "ended", "stop": "stopped"}.get(verb, verb)
        raise UsageError(f"cluster {name} is {member}'s (a teammate's, in the team database): not {done}",
                         hint=f"ask {member}, or `cloudtrain {verb} {name} --force` does it anyway, recorded as yours")
    me = who(store, "")
    for name, member in theirs.items():
        store.add_event(name, f"{verb}-forced", f"{me} ran `{verb} --force` on {member}'s cluster")
    return theirs
