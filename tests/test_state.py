"""State store: schema versioning and two processes writing at once, on SQLite and on PostgreSQL
(`state_backend`: the same test on this machine's file and on a team database)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudtrain.errors import CloudtrainError
from cloudtrain.state import SCHEMA_VERSION, StateStore
from tests.conftest import cli_env, cloudtrain

WRITER = textwrap.dedent("""
    import sys, time
    from cloudtrain.state import StateStore, JobRecord
    store = StateStore()
    who = sys.argv[1]
    for i in range(150):
        store.upsert_cluster(name=f"{who}-{i % 10}", provider="local", status="up", owner=who)
        store.insert_job(JobRecord(id=f"{who}-{i}", cluster=f"{who}-{i % 10}", run_id=None, job_dir="/x",
                                   status="running", command=None, submitted_at=time.time(), started_at=None,
                                   ended_at=None, exit_code=None))
        store.add_event(f"{who}-{i % 10}", "test", str(i))
""")


def test_two_processes_write_concurrently(cloudtrain_home: Path, state_backend: str) -> None:
    StateStore().close()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, who], env=cli_env(), stderr=subprocess.PIPE, text=True)
        for who in ("a", "b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    store = StateStore()
    assert (str(store.path).startswith("postgresql://")) == (state_backend == "postgres")
    assert (cloudtrain_home / "state.db").exists() == (state_backend == "sqlite")
    assert len(store.list_clusters()) == 20
    assert len(store.list_events()) == 300
    assert len(store.list_jobs("a-3")) == 15


def test_two_cli_runs_at_once_share_one_state_db(tmp_path: Path, state_backend: str) -> None:
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nrun: echo {name}; sleep 1\n")
    procs = [
        subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", f"{name}.yaml", "--keep"], cwd=tmp_path,
                         env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("alpha", "beta")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    data = json.loads(cloudtrain("status", "--json").stdout)
    assert sorted(c["name"] for c in data["clusters"]) == ["alpha", "beta"]
    assert all(c["last_job"]["status"] == "succeeded" for c in data["clusters"])
    assert sorted(r["status"] for r in data["runs"]) == ["succeeded", "succeeded"]
    assert cloudtrain("down", "alpha", "beta").returncode == 0


def test_schema_version_and_wal(cloudtrain_home: Path) -> None:
    store = StateStore()
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store.close()
    with pytest.raises(CloudtrainError, match="newer than this cloudtrain"):
        StateStore()


def test_log_cursor_round_trip(cloudtrain_home: Path, state_backend: str) -> None:
    store = StateStore()
    assert store.get_log_cursor("j") == 0
    store.set_log_cursor("j", 42)
    store.set_log_cursor("j", 43)
    assert store.get_log_cursor("j") == 43


def test_state_is_owner_only_and_a_second_store_keeps_the_first_ones_locks(cloudtrain_home: Path) -> None:
    """state.db is 0600 and its home 0700; opening another store in the same process (a sweep's
    threads, the launch heartbeat) must not drop the first connection's locks (closing any
    descriptor of the file would): a write transaction held by one stays exclusive."""
    import sqlite3
    import stat

    first = StateStore()
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.path.parent.stat().st_mode) == 0o700
    first._db.execute("BEGIN IMMEDIATE")
    try:
        second = StateStore()
        second._db.execute("PRAGMA busy_timeout = 0")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            second._db.execute("BEGIN IMMEDIATE")
        second.close()
    finally:
        first._db.execute("ROLLBACK")
        first.close()


def test_rows_are_read_by_column_name_whatever_the_columns_order(cloudtrain_home: Path, state_backend: str) -> None:
    """Records are built by position (the ledger's 10,000 rows: `cost`'s time), so the position
    must come from the column's name: a query that lists the columns in another order, or a team
    database's extra ones (member, project), still fills each field with its own column."""
    from cloudtrain.state import ClusterRecord, _rows

    store = StateStore()
    store.upsert_cluster(name="c", provider="aws", status="up", owner="me", hourly_price=2.5, num_nodes=3,
                         instance_type="g4dn.xlarge", created_at=100.0)
    columns = [c for c in ClusterRecord.__dataclass_fields__][::-1]
    reversed_rows = _rows(store._db.execute(f"SELECT {', '.join(columns)}, 'x' AS extra FROM clusters"),
                          ClusterRecord)
    assert reversed_rows == store.list_clusters() == [store.get_cluster("c")]
    record = reversed_rows[0]
    assert (record.name, record.provider, record.num_nodes, record.hourly_price, record.created_at) == \
        ("c", "aws", 3, 2.5, 100.0)
    assert store.list_clusters(status="up") == reversed_rows and store.list_clusters(status="stopped") == []
    assert store.cluster_states() == [("c", record.uid, "up")]
    assert _rows(store._db.execute("SELECT * FROM clusters WHERE name = 'none'"), ClusterRecord) == []
