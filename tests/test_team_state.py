"""A team's PostgreSQL state database: init, grants, migrations (one at a time, however many
admins run them), and a CLI whose schema differs says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2.errors
import pytest

from cloudtrain.state import ClusterStatus, StateStore
from cloudtrain.state.schema_pg import PG_SCHEMA_VERSION
from cloudtrain.state.team import migrate
from cloudtrain.testing.postgres import PostgresServer
from cloudtrain.testing.postgres import connection as pg_connection
from tests.conftest import cli_env, cloudtrain


@pytest.fixture
def empty_db(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    name = postgres_server.create_database()
    monkeypatch.setenv("CLOUDTRAIN_STATE_URL", postgres_server.url(name))
    yield name
    postgres_server.drop_database(name)


def _versions(server: PostgresServer, db: str) -> list[int]:
    with pg_connection(server.url(db)) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM cloudtrain_schema ORDER BY version")]


def test_a_store_on_an_empty_database_says_to_init_and_migrate_refuses_it(empty_db: str) -> None:
    done = cloudtrain("status")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: the state database postgresql:///")
    assert "has no cloudtrain schema yet (an admin runs `cloudtrain team init` once" in done.stderr
    assert "Traceback" not in done.stderr
    done = cloudtrain("team", "migrate")
    assert done.returncode == 2 and "`cloudtrain team init` prepares an empty database" in done.stderr


def test_init_prints_grants_that_let_a_member_use_the_state_and_nothing_more(
        empty_db: str, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    done = cloudtrain("team", "init")
    assert done.returncode == 0, done.stderr
    assert f"cloudtrain schema v{PG_SCHEMA_VERSION} created" in done.stdout
    grants = [line for line in done.stdout.splitlines() if line.startswith("GRANT") or line.startswith("CREATE ROLE")]
    assert grants[0] == "CREATE ROLE cloudtrain_member NOLOGIN;"
    postgres_server.sql("DROP ROLE IF EXISTS alice")
    for statement in grants:
        try:
            postgres_server.sql(statement, empty_db)
        except psycopg2.errors.DuplicateObject:  # the role is cluster-wide: another test made it
            pass
    postgres_server.sql("CREATE ROLE alice LOGIN IN ROLE cloudtrain_member")
    try:
        monkeypatch.setenv("CLOUDTRAIN_STATE_URL", postgres_server.url(empty_db, user="alice"))
        store = StateStore()
        store.upsert_cluster(name="a1", provider="local", status=str(ClusterStatus.UP), owner="alice")
        store.add_event("a1", "test", "hello")
        assert [c.name for c in store.list_clusters()] == ["a1"]
        assert [e.message for e in store.list_events("a1")] == ["hello"]
        # The row records who wrote it: the database role, filled in by the server.
        assert store._db.execute("SELECT member FROM clusters WHERE name = 'a1'").fetchone()[0] == "alice"
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            store._db.execute("CREATE TABLE mine (x INTEGER)")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            store._db.execute("DELETE FROM cloudtrain_schema")
        store.close()
        again = cloudtrain("team", "init")
        assert again.returncode == 0 and "already at schema" in again.stdout
    finally:
        postgres_server.sql(f"REVOKE ALL ON DATABASE {empty_db} FROM cloudtrain_member")
        postgres_server.sql("DROP OWNED BY alice", empty_db)
        postgres_server.sql("DROP ROLE alice")


def test_two_migrations_at_once_apply_each_step_once(empty_db: str, postgres_server: PostgresServer) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "cloudtrain", "team", "init"], env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs.append(out)
    assert sorted("created" in out for out in outs) == [False, True]
    assert _versions(postgres_server, empty_db) == list(range(1, PG_SCHEMA_VERSION + 1))


def test_a_cli_older_or_newer_than_the_schema_says_what_to_run(empty_db: str, postgres_server: PostgresServer) -> None:
    migrate(postgres_server.url(empty_db), init=True)
    postgres_server.sql(f"INSERT INTO cloudtrain_schema VALUES ({PG_SCHEMA_VERSION + 1}, 0, 'x', '9.9')", empty_db)
    done = cloudtrain("status")
    assert done.returncode == 2
    assert (f"is at schema v{PG_SCHEMA_VERSION + 1}, newer than this cloudtrain (v{PG_SCHEMA_VERSION}) "
            "(upgrade cloudtrain: pip install -U 'cloudtrain[team]')") in done.stderr
    assert cloudtrain("team", "migrate").returncode == 2
    postgres_server.sql(f"DELETE FROM cloudtrain_schema WHERE version >= {PG_SCHEMA_VERSION}", empty_db)
    done = cloudtrain("status")
    assert done.returncode == 2
    assert (f"older than this cloudtrain (v{PG_SCHEMA_VERSION}) (an admin runs `cloudtrain team migrate`)"
            in done.stderr)


def test_team_verbs_without_a_team_database_say_how_to_name_one(tmp_path: Path) -> None:
    done = cloudtrain("team", "migrate")
    assert done.returncode == 2
    assert "no team database is configured" in done.stderr and "CLOUDTRAIN_STATE_URL" in done.stderr


@pytest.mark.parametrize("released", range(1, PG_SCHEMA_VERSION))
def test_migrating_from_every_released_version_keeps_the_rows(
        released: int, empty_db: str, postgres_server: PostgresServer, cloudtrain_home: Path) -> None:
    url = postgres_server.url(empty_db)
    migrate(url, init=True, to=released)
    # Rows as the CLI of that version wrote them (its columns only).
    postgres_server.sql("INSERT INTO clusters (name, provider, status, owner, created_at, updated_at, uid) "
                        "VALUES ('old', 'aws', 'up', 'bob', 1, 1, 'u1'); "
                        "INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at, incarnation) "
                        "VALUES ('old', 'aws', 'i-1', 'running', 0.5, 1, 'u1')", empty_db)
    assert "older than this cloudtrain" in cloudtrain("status").stderr
    done = cloudtrain("team", "migrate")
    assert done.returncode == 0, done.stderr
    assert f"migrated v{released} -> v{PG_SCHEMA_VERSION}" in done.stdout
    assert _versions(postgres_server, empty_db) == list(range(1, PG_SCHEMA_VERSION + 1))
    cloudtrain_home.mkdir(exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("project: vision\n")
    store = StateStore()
    assert [(b.instance_id, b.hourly_price) for b in store.billing("old")] == [("i-1", 0.5)]
    store.upsert_cluster(name="new", provider="aws", status="up", owner="alice")
    rows = {r["name"]: (r["member"], r["project"])
            for r in store._db.execute("SELECT name, member, project FROM clusters")}
    assert rows == {"old": (postgres_server.superuser, "default"), "new": (postgres_server.superuser, "vision")}
    store.close()


HOLDER = """
import sys, time
from cloudtrain.state.locks import cluster_lock
with cluster_lock("shared"):
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    print("released", flush=True)
"""


def test_a_cluster_lock_is_one_across_the_team_and_a_killed_holder_frees_it(
        state_backend: str, cloudtrain_home: Path) -> None:
    """Two CLIs (two machines: nothing shared but the state) take turns; SIGKILL of the holder
    frees the cluster at once (the server ends its session; no lock file is left behind)."""
    import time

    first = subprocess.Popen([sys.executable, "-c", HOLDER, "60"], env=cli_env(), stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline().strip() == "held"
    second = subprocess.Popen([sys.executable, "-c", HOLDER, "0"], env=cli_env(), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert second.poll() is None  # waiting for the first
        first.kill()
        first.wait(timeout=10)
        out, _ = second.communicate(timeout=30)
        assert out.split() == ["held", "released"]
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if state_backend == "postgres":
        assert not (cloudtrain_home / "locks").exists()


def test_a_database_lost_mid_command_is_one_line_and_the_heartbeat_survives_it(
        empty_db: str, postgres_server: PostgresServer) -> None:
    from cloudtrain.state.pg import StateUnavailable

    migrate(postgres_server.url(empty_db), init=True)
    store = StateStore()
    store.upsert_cluster(name="c", provider="aws", status="up", owner="me")
    pid = store._db.execute("SELECT pg_backend_pid()").fetchone()[0]
    postgres_server.sql(f"SELECT pg_terminate_backend({pid})")
    with pytest.raises(StateUnavailable, match=r"^lost the state database postgresql:///") as caught:
        store.get_cluster("c")
    assert isinstance(caught.value, store.errors)  # what the launch heartbeat catches and retries
    assert "run the command again once it is back" in caught.value.one_line()
    store.close()
