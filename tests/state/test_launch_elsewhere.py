"""A launch from another machine of the team (issue 37): its cluster row says "provisioning" with
the launcher's identity and a heartbeat this machine cannot check against a process table. Every
launch runs under the cluster's lock (cluster/lifecycle.py `up`), a PostgreSQL session lock that
the server frees when the launcher dies, so whether that lock is held is the answer: a live
launcher holds it (`down` refuses, `gc` leaves it), a killed one does not (`down` ends what it
left at once, instead of waiting out the heartbeat's two minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from cloudtrain.state import StateStore
from cloudtrain.state.locks import launch_in_flight
from cloudtrain.testing.postgres import PostgresServer
from tests.conftest import cloudtrain

# A launcher on another machine: another boot id, so no process table here can say it is dead.
ELSEWHERE = "0b0e0c0d-another-machine:4242:1234"


@pytest.fixture
def team(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    database = postgres_server.initialized_database()
    url = postgres_server.url(database)
    monkeypatch.setenv("CLOUDTRAIN_STATE_URL", url)
    try:
        yield url
    finally:
        postgres_server.drop_database(database)


def _launching_elsewhere(name: str) -> None:
    store = StateStore()
    store.upsert_cluster(name=name, provider="local", status="provisioning", region=None, zone=None,
                         instance_type=None, hourly_price=0.0, num_nodes=1, recipe_path=None, recipe_digest=None,
                         owner="me", last_error=None, driver=ELSEWHERE, heartbeat_at=time.time())
    store.close()


@pytest.fixture
def holder(team: str) -> Iterator[subprocess.Popen]:
    """Another session holding cluster c1's lock, as a live launcher's CLI does."""
    code = ("import sys; from cloudtrain.state.locks import cluster_lock\n"
            "with cluster_lock('c1'):\n    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CLOUDTRAIN_STATE_URL": team})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_live_launch_on_another_machine_is_left_alone(holder: subprocess.Popen) -> None:
    _launching_elsewhere("c1")
    store = StateStore()
    assert launch_in_flight(store.get_cluster("c1"))  # type: ignore[arg-type]
    holder.kill()
    holder.wait()
    # Its session went with it: the server freed the lock, and nothing is in flight any more.
    assert not launch_in_flight(store.get_cluster("c1"))  # type: ignore[arg-type]


def test_down_of_a_launch_killed_on_another_machine_ends_it_at_once(team: str) -> None:
    _launching_elsewhere("c1")
    done = cloudtrain("down", "c1")
    # Before: refused for two minutes ("being launched by another cloudtrain process"), then ended.
    assert done.returncode == 0, done.stderr
    assert StateStore().get_cluster("c1") is None
