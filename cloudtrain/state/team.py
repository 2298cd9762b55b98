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
from dataclasses import dataclass
from typing import Any

from cloudtrain.errors import UsageError
from cloudtrain.state import pg
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
        conn.execute(f"SELECT pg_advisory_unlock({pg.MIGRATE_LOCK})")
        return Migrated(before or 0, max([before or 0, *applied]), tuple(applied))
    finally:
        conn.close()


def grants(url: str) -> str:
    """The SQL an admin runs once so that members can use the database (and no more: they read
    and write rows; creating, altering or dropping tables stays with the admin who ran init)."""
    conn = pg.connect(url)
    try:
        database, schema = conn.execute("SELECT current_database(), current_schema()").fetchone()
    finally:
        conn.close()
    tables = ", ".join(_ident(schema) + "." + t for t in PG_TABLES)
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

