"""The StateStore contract, method by method, on SQLite and on PostgreSQL (`state_backend`): the
same calls give the same records on both, so nothing above the store needs to know which it has."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloudtrain.cluster.reconcile import BillingOp, Transition
from cloudtrain.notify import outbox
from cloudtrain.notify.model import Event, EventType
from cloudtrain.notify.targets import bind
from cloudtrain.state import (
    BillKind,
    ClusterStatus,
    JobRecord,
    NodeRecord,
    RunRecord,
    StateStore,
    SweepAttemptRow,
    SweepRecord,
    SweepTrialRow,
    SweepVmRow,
)


@pytest.fixture
def store(cloudtrain_home: Path, state_backend: str):  # noqa: ANN201
    opened = StateStore()
    yield opened
    opened.close()


def _node(cluster: str, rank: int, instance: str) -> NodeRecord:
    return NodeRecord(cluster, rank, instance, "running", "203.0.113.7", "10.0.0.7", "ubuntu", 22, "/k", None, 100.0)


def _job(job_id: str, cluster: str, at: float) -> JobRecord:
    return JobRecord(job_id, cluster, None, "/jobs/" + job_id, "running", "echo hi", at, None, None, None)


def test_clusters_nodes_runs_and_jobs(store: StateStore) -> None:
    store.upsert_cluster(name="c1", provider="aws", status=str(ClusterStatus.PROVISIONING), owner="me", spot=True,
                         hourly_price=0.526)
    store.upsert_cluster(name="c1", status=str(ClusterStatus.UP), region="us-east-1")
    first = store.get_cluster("c1")
    assert first is not None and first.uid and first.spot == 1 and first.region == "us-east-1"
    assert first.hourly_price == pytest.approx(0.526)
    store.set_cluster_status("c1", str(ClusterStatus.DOWN_FAILED), "node 0 unreachable")
    assert store.get_cluster("c1").last_error == "node 0 unreachable"  # type: ignore[union-attr]
    store.upsert_cluster(name="c0", provider="local", status="up", owner="me", created_at=1.0)
    assert [c.name for c in store.list_clusters()] == ["c0", "c1"]
    with pytest.raises(ValueError, match="unknown clusters columns"):
        store.upsert_cluster(name="c1", bogus=1)

    store.put_nodes("c1", [_node("c1", 1, "i-b"), _node("c1", 0, "i-a")])
    assert [(n.rank, n.instance_id) for n in store.get_nodes("c1")] == [(0, "i-a"), (1, "i-b")]

    now = time.time()
    run = RunRecord("r1", "c1", "/r.yaml", "d", "/runs/r1", "running", None, "aws", "g4dn.xlarge", 0.5, 0.0, now, None)
    store.insert_run(run)
    store.insert_run(RunRecord("r0", "c0", None, None, None, "succeeded", 0, "local", None, 0, 0, now - 10, None))
    store.update_run("r1", status="succeeded", exit_code=0, cost_usd=0.25, ended_at=now + 5)
    assert store.get_run("r1") == RunRecord("r1", "c1", "/r.yaml", "d", "/runs/r1", "succeeded", 0, "aws",
                                            "g4dn.xlarge", 0.5, 0.25, now, now + 5)
    assert [r.id for r in store.list_runs()] == ["r1", "r0"]
    assert [r.id for r in store.list_runs("c0")] == ["r0"]
    assert [r.id for r in store.list_runs(limit=1)] == ["r1"]
    with pytest.raises(ValueError, match="unknown runs columns"):
        store.update_run("r1", nope=1)

    store.insert_job(_job("j1", "c1", now))
    store.insert_job(_job("j2", "c1", now + 1))
    store.insert_job(_job("j3", "c0", now))
    store.update_job("j1", status="succeeded", exit_code=0)
    assert store.get_job("j1").status == "succeeded"  # type: ignore[union-attr]
    assert [j.id for j in store.list_jobs("c1")] == ["j1", "j2"]
    assert {c: j.id for c, j in store.latest_jobs().items()} == {"c1": "j2", "c0": "j3"}
    store.set_log_cursor("j1", 5_000_000_000)  # past 2^31: a log of a long run
    store.delete_jobs("c1")
    assert store.list_jobs("c1") == [] and store.get_log_cursor("j1") == 0

    store.delete_cluster("c1")
    assert store.get_cluster("c1") is None and store.get_nodes("c1") == []


def test_reconcile_transitions_and_billing(store: StateStore) -> None:
    store.upsert_cluster(name="g", provider="aws", status="provisioning", owner="me")
    uid = store.get_cluster("g").uid  # type: ignore[union-attr]
    opened = Transition(nodes=(_node("g", 0, "i-1"),), status=ClusterStatus.UP, events=(("up", "is up"),),
                        billing=(BillingOp(True, "i-1", BillKind.RUNNING, 1000.0, 0.5, 60.0),
                                 BillingOp(True, "i-1", BillKind.DISK, 1000.0, 0.01)))
    store.apply("g", opened, uid, "aws")
    store.apply("g", Transition(nodes=(_node("g", 0, "i-1"),), status=ClusterStatus.UP, events=(),
                                billing=(BillingOp(True, "i-1", BillKind.DISK, 1000.0, 0.02, amend=True),)), uid, "aws")
    assert [(b.kind, b.hourly_price, b.ended_at) for b in store.open_billing(uid)] == [
        ("running", 0.5, None), ("disk", 0.02, None)]
    # A close earlier than the start (clocks) ends at the start, never before it.
    store.apply("g", Transition(nodes=(), status=ClusterStatus.STOPPED, events=(("stop", "stopped"),),
                                billing=(BillingOp(False, "i-1", BillKind.RUNNING, 990.0),)), uid, "aws")
    assert store.get_nodes("g") == [] and store.get_cluster("g").status == "stopped"  # type: ignore[union-attr]
    closed = [b for b in store.billing("g") if b.kind == "running"]
    assert [(b.started_at, b.ended_at, b.min_s) for b in closed] == [(1000.0, 1000.0, 60.0)]
    # An interval that ended before `since` still bills its minimum after it, and not past that.
    assert [b.kind for b in store.billing("g", since=1030.0)] == ["running", "disk"]
    assert [b.kind for b in store.billing("g", since=1070.0)] == ["disk"]
    assert [b.kind for b in store.billing(incarnation=uid, since=1070.0)] == ["disk"]
    store.end_billing(uid, 2000.0)
    assert store.open_billing(uid) == []
    store.heartbeat("g", uid)
    assert store.get_cluster("g").heartbeat_at is not None  # type: ignore[union-attr]
    assert [(e.kind, e.message) for e in store.list_events("g")] == [("up", "is up"), ("stop", "stopped")]
    store.add_event(None, "gc", "nothing leaked")
    assert [e.kind for e in store.list_events()] == ["up", "stop", "gc"]


def test_sweep_journal_upserts(store: StateStore) -> None:
    store.insert_sweep(SweepRecord("s1", "sw", "/r.yaml", "d", "running", 42, "/res", "{}", 1.0, 1.0))
    trial = SweepTrialRow("s1", 0, '{"lr": 0.1}', "running", 1, 0, None, None, 1.0, None)
    attempt = SweepAttemptRow("s1", 0, 1, "vm0", 1.0, 99.0, 0.5, "running", None, None, None, None)
    vm = SweepVmRow("s1", "vm0", 0, "ready", 0.5, 1.0, 50.0, 2.0, None, None, 0, 1, 0, None)
    store.save_sweep_records("s1", [trial], [attempt], [vm], {"next_slot": 1})
    store.save_sweep_records("s1", [SweepTrialRow("s1", 0, '{"lr": 0.1}', "done", 1, 0, 0.93, None, 1.0, 9.0)],
                             [], [], {"stop_reason": "budget"})
    assert [(t.state, t.value) for t in store.sweep_trials("s1")] == [("done", 0.93)]
    assert store.sweep_attempts("s1") == [attempt] and store.sweep_vms("s1") == [vm]
    sweep = store.get_sweep("s1")
    assert sweep is not None and (sweep.next_slot, sweep.stop_reason) == (1, "budget")
    store.update_sweep("s1", status="done")
    assert [s.status for s in store.list_sweeps()] == ["done"]
    with pytest.raises(ValueError, match="unknown sweep counters"):
        store.save_sweep_records("s1", [], [], [], {"pid": 1})


def test_notification_outbox(store: StateStore, cloudtrain_home: Path) -> None:
    from cloudtrain import paths
    from cloudtrain.config import load_config

    paths.home().mkdir(exist_ok=True)  # a team database creates no home (finding the config does not either)
    paths.config_file().write_text("notify:\n  - webhook: http://127.0.0.1:9/h\n    secret: '${HOOK_SECRET}'\n")
    targets = bind(load_config().notify, "config")
    first = Event(EventType.RUN_FAILED, {"run": "r1", "cluster": "c"}, at=10.0)
    outbox.enqueue(store, first, targets)
    outbox.enqueue(store, first, targets)  # the same event twice: kept once
    outbox.enqueue(store, Event(EventType.RUN_SUCCEEDED, {"run": "r2"}, at=20.0), targets)
    assert outbox.pending_count(store) == 2
    claims = outbox.claim(store)
    assert [c.event_id for c in claims] == [first.id, claims[1].event_id] and outbox.claim(store) == []
    outbox.record(store, claims[0], ok=True, attempts=1, error=None)
    outbox.release(store, claims[1])
    rows = outbox.events(store)
    assert [(r.id, r.deliveries[0].state) for r in rows] == [(first.id, "delivered"), (claims[1].event_id, "pending")]
    assert [r.id for r in outbox.events(store, after=first.id)] == [claims[1].event_id]
    assert [c.event_id for c in outbox.claim(store, force=True)] == [claims[1].event_id]
    outbox.record_delivered(store, claims[1].event_id, targets[0].ref.key(), "node", 30.0)
    assert outbox.pending_count(store) == 0 and [r.deliveries[0].state for r in outbox.events(store)] == ["delivered"] * 2
