"""Team policies' schema steps (SQLite v9, PostgreSQL v4) from the version before: the rows stay, a
policy can be set and binds at once; on PostgreSQL a member whose grants predate the table is told
in one line to have the admin run them, and reads it once they are run."""

from __future__ import annotations

import secrets
import sqlite3
from pathlib import Path

import psycopg2.errors
import pytest

from cloudtrain.config import Config
from cloudtrain.errors import UsageError
from cloudtrain.policy import Policy, effective_policy
from cloudtrain.state import SCHEMA_VERSION, StateStore
from cloudtrain.state.budgets import list_budgets, set_budget
from cloudtrain.state.location import ENV
from cloudtrain.state.policies import set_policy
from cloudtrain.state.schema import _MIGRATIONS
from cloudtrain.state.schema_pg import PG_SCHEMA_VERSION
from cloudtrain.state.team import grants, migrate
from cloudtrain.testing.postgres import PostgresServer
from cloudtrain.testing.postgres import connection as pg_connection


def test_a_v8_file_migrates_to_the_policies_table(tmp_path: Path) -> None:
    assert SCHEMA_VERSION >= 9
    path = tmp_path / "state.db"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(8):
        for statement in _MIGRATIONS[step].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {step + 1}")
    db.execute("INSERT INTO budgets (member, project, monthly_usd, set_at, set_by) VALUES ('*', '*', 50, 1, 'me')")
    db.close()

    store = StateStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [b.monthly_usd for b in list_budgets(store)] == [50.0]
    with store._write() as db:
        db.execute("INSERT INTO policies (project, max_idle_minutes, set_at, set_by) VALUES (NULL, 60, 1, 'me')")
    # One row per scope, NULL (every project) included; a row sets at least one floor.
    with pytest.raises(sqlite3.IntegrityError):
        with store._write() as db:
            db.execute("INSERT INTO policies (project, max_hours, set_at, set_by) VALUES (NULL, 2, 1, 'me')")
    with pytest.raises(sqlite3.IntegrityError):
        with store._write() as db:
            db.execute("INSERT INTO policies (project, set_at, set_by) VALUES ('vision', 1, 'me')")
    store.close()


@pytest.fixture
def v3_db(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A team database at v3 (before policies) with a member role granted as v3's grants did."""
    database = postgres_server.create_database()
    admin = postgres_server.url(database)
    migrate(admin, init=True, to=3)
    member = f"ct_carol_{secrets.token_hex(3)}"
    group = f"ct_members_{secrets.token_hex(3)}"
    for statement in (f"CREATE ROLE {group} NOLOGIN", f"CREATE ROLE {member} LOGIN IN ROLE {group}"):
        postgres_server.sql(statement)
    for statement in (f"GRANT SELECT ON cloudtrain_schema, budgets TO {group}",
                      f"GRANT SELECT, INSERT, UPDATE, DELETE ON clusters, budget_holds TO {group}"):
        postgres_server.sql(statement, database)
    monkeypatch.setenv(ENV, admin)
    try:
        yield database, member, group
    finally:
        postgres_server.drop_database(database)
        postgres_server.sql(f"DROP ROLE IF EXISTS {member}")
        postgres_server.sql(f"DROP ROLE IF EXISTS {group}")


def test_a_v3_team_database_migrates_to_policies_and_a_member_needs_the_grants_again(
        v3_db: tuple[str, str, str], postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    database, member, group = v3_db
    admin = postgres_server.url(database)
    with pg_connection(admin) as conn:
        conn.execute("INSERT INTO budgets (member, project, monthly_usd, set_at) VALUES ('*', '*', 70, 1)")
    done = migrate(admin)
    assert (done.before, done.after) == (3, PG_SCHEMA_VERSION) and 4 in done.applied
    store = StateStore()
    assert [b.monthly_usd for b in list_budgets(store)] == [70.0]
    set_policy(store, max_idle_minutes=30, max_hours=None, project=None, by="admin")
    set_budget(store, 80.0, None, None, by="admin")  # v3's table still written as before
    store.close()
    with pg_connection(admin) as conn:
        # One row per scope, NULL (every project) included; a row sets at least one floor.
        with pytest.raises(psycopg2.errors.UniqueViolation):
            conn.execute("INSERT INTO policies (project, max_hours, set_at) VALUES (NULL, 2, 1)")
        with pytest.raises(psycopg2.errors.CheckViolation):
            conn.execute("INSERT INTO policies (project, set_at) VALUES ('vision', 1)")

    # The member's grants were run at v3: the new table is not theirs to read, said in one line,
    # and nothing binds less than it should (no launch goes ahead without its floor).
    monkeypatch.setenv(ENV, postgres_server.url(database, user=member))
    with pytest.raises(UsageError) as refused:
        effective_policy(Config())
    assert refused.value.one_line().startswith("this member may not read the team database's policies "
                                               "(permission denied for table policies) (an admin runs the grants")
    # The grants `team init` prints now name the table, read-only.
    printed = grants(admin)
    assert "budgets, public.policies TO cloudtrain_member;" in printed
    postgres_server.sql(f"GRANT SELECT ON policies TO {group}", database)
    assert effective_policy(Config()) == Policy(max_idle_minutes=30, max_idle_minutes_from="team")
