"""The teammates rule (state/team.py), on both engines: which of another member's cluster rows are
live work that `gc` never lists (up, stopped, a launch in flight; not a failed launch, a failed
down or an intent whose launcher died), and `down`/`stop` of a teammate's cluster refused in one
line without --force and recorded with it. On SQLite (one machine's file) nobody is a teammate."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cloudtrain import procid
from cloudtrain.errors import UsageError
from cloudtrain.state import StateStore
from cloudtrain.state.team import guard_teammates, teammates_live, whose
from tests.conftest import cloudtrain


def _dead_identity() -> str:
    """The identity of a process that has ended (a launcher that died)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = procid.identity(proc.pid)
    proc.wait()
    return identity


@pytest.fixture
def rows(state_backend: str) -> str:
    """Clusters of this member (mine) and of bob in each state that matters."""
    store = StateStore()
    now = time.time()
    stale = now - 3600
    given = {
        "mine": dict(status="up"),
        "b-up": dict(status="up"),
        "b-stopped": dict(status="stopped"),
        "b-failed": dict(status="launch-failed"),
        "b-downfail": dict(status="down-failed"),
        "b-inflight": dict(status="provisioning", driver=procid.identity(), heartbeat_at=now),
        "b-abandoned": dict(status="provisioning", driver=_dead_identity(), heartbeat_at=stale),
    }
    for name, values in given.items():
        store.upsert_cluster(name=name, provider="local", region=None, zone=None, instance_type=None,
                             hourly_price=0.0, num_nodes=1, recipe_path=None, recipe_digest=None,
                             owner="alice" if name == "mine" else "bob", last_error=None, **values)
    if state_backend == "postgres":
        # The server records the writing role; bob's rows are written here by the test's role, then given to bob.
        with store._write() as db:
            db.execute("UPDATE clusters SET member = 'bob' WHERE name != 'mine'")
    store.close()
    return state_backend


def test_which_of_a_teammates_rows_are_live_work(rows: str) -> None:
    store = StateStore()
    live = teammates_live(store)
    if rows == "sqlite":
        assert live == {} and whose(store, "b-up") is None
        return
    assert sorted(live) == ["b-inflight", "b-stopped", "b-up"]
    assert {m.member for m in live.values()} == {"bob"} and live["b-up"].cloud == "local"
    assert [whose(store, n) for n in ("mine", "b-failed", "nowhere")] == [None, "bob", None]


def test_down_and_stop_of_a_teammates_cluster_need_force_and_are_recorded(rows: str) -> None:
    store = StateStore()
    if rows == "sqlite":
        assert guard_teammates(store, ["mine", "b-up"], "down", force=False) == {}
        return
    with pytest.raises(UsageError) as refused:
        guard_teammates(store, ["mine", "b-up"], "down", force=False)
    assert refused.value.one_line().startswith("cluster b-up is bob's (a teammate's, in the team database): not ended")
    assert [e for e in store.list_events("b-up")] == []
    assert guard_teammates(store, ["mine", "b-up"], "down", force=True) == {"b-up": "bob"}
    me = store._db.execute("SELECT current_user").fetchone()[0]
    (event,) = store.list_events("b-up")
    assert (event.kind, event.message) == ("down-forced", f"{me} ran `down --force` on bob's cluster")
    assert store._db.execute("SELECT member FROM events WHERE cluster = 'b-up'").fetchone()[0] == me

    # Through the CLI: one line, exit 2, and the cluster untouched.
    done = cloudtrain("stop", "b-stopped")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in done.stderr.strip().splitlines()] and len(errors) == 1, done.stderr
    assert "cluster b-stopped is bob's" in errors[0] and "`cloudtrain stop b-stopped --force`" in errors[0]
    assert store.get_cluster("b-stopped").status == "stopped"  # type: ignore[union-attr]
