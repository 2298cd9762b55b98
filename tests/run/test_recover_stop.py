"""Stopping an attempt (issue 36.1): a token set once and checked by the pipeline between phases,
handed to the attempt's transports when the machine is gone; the one cloud watcher that sets it;
reporters that only display. No exception is injected into another thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cloudtrain.cluster.lifecycle import Cluster
from cloudtrain.errors import CloudtrainError
from cloudtrain.remote import gone as transports
from cloudtrain.run.gone import Gone, GoneKind
from cloudtrain.run.pipeline import _PhaseClock
from cloudtrain.run.recover_watch import Tee, Watcher
from cloudtrain.run.stop import AttemptStopped, StopKind, StopToken
from cloudtrain.state import ClusterStatus
from tests.run.test_recover import cluster

pytestmark = pytest.mark.quick


class _Transport:
    """What remote/gone.py tracks of an SSH transport: its cluster, give_up and close."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.calls: list[str] = []

    def give_up(self) -> None:
        self.calls.append("give_up")

    def close(self) -> None:
        self.calls.append("close")


def test_the_first_stop_wins_and_is_what_the_attempt_ends_with() -> None:
    token = StopToken()
    assert token.stop(StopKind.STOPPED, "pruned") is True
    assert token.stop(StopKind.NODE_GONE, "aws reports i-1 terminated") is False  # reported by whoever was first
    assert token.reason is not None and token.reason.kind is StopKind.STOPPED and token.gone() is None
    with pytest.raises(AttemptStopped) as caught:
        token.check()
    assert caught.value.message == "the attempt was stopped (pruned)" and caught.value.phase_note == "pruned"


def test_a_machine_gone_makes_the_clusters_transports_give_up_and_close_and_a_stop_does_not() -> None:
    ours, other, pruned = _Transport("c1"), _Transport("c2"), _Transport("c3")
    for transport in (ours, other, pruned):
        transports.track(transport)
    StopToken("c3").stop(StopKind.STOPPED, "pruned")  # the node is fine: the next trial reuses its VM
    gone = StopToken("c1")
    assert gone.stop(StopKind.NODE_GONE, "aws reports i-1 terminated")
    assert ours.calls == ["give_up", "close"] and other.calls == [] and pruned.calls == []
    assert gone.gone() == "aws reports i-1 terminated"
    with pytest.raises(AttemptStopped) as caught:
        gone.check()
    assert caught.value.phase_note == "the node is gone"


class _Reporter:
    def __init__(self) -> None:
        self.said: list[tuple[str, ...]] = []

    def phase_start(self, phase: str, detail: str = "") -> None:
        self.said.append(("start", phase))

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        self.said.append(("end", phase, detail, str(ok)))

    def log_line(self, line: str, node: int = 0) -> None:
        self.said.append(("line", line))

    def progress(self, event: dict[str, Any]) -> None:
        self.said.append(("progress", str(event.get("epoch"))))


def test_the_pipeline_starts_no_attempt_phase_once_stopped_but_the_runs_cleanup_goes_on() -> None:
    reporter, token = _Reporter(), StopToken()
    clock = _PhaseClock(reporter, stop=token)  # type: ignore[arg-type]
    with clock.phase("sync"):
        token.stop(StopKind.NODE_GONE, "gcp reports n-0 terminated")
        # A phase in progress is not interrupted: it fails in its own thread (here: as a command on
        # a given-up transport does), and its end line names the loss.
    with pytest.raises(AttemptStopped), clock.phase("run"):
        raise AssertionError("a stopped attempt's next phase must not start")
    for cleanup in ("teardown", "recover", "upload"):
        with clock.phase(cleanup):
            pass
    assert ("start", "run") not in reporter.said
    assert [s[1] for s in reporter.said if s[0] == "start"] == ["sync", "teardown", "recover", "upload"]


def test_a_phase_that_failed_after_a_stop_says_why_on_its_end_line() -> None:
    reporter, token = _Reporter(), StopToken()
    clock = _PhaseClock(reporter, stop=token)  # type: ignore[arg-type]
    with pytest.raises(CloudtrainError), clock.phase("run"):
        token.stop(StopKind.NODE_GONE, "aws reports i-0 terminated")
        raise CloudtrainError("connection lost")
    assert reporter.said[-1] == ("end", "run", "the node is gone", "False")


_cluster = cluster  # tests/run/test_recover.py's: a cluster of these node states


class _Lc:
    """A lifecycle whose cloud answers from a list (the last answer repeats); `row`: state has it."""

    def __init__(self, answers: list[Cluster], row: bool = True) -> None:
        self.answers = answers
        self.row = row
        self.closed = False
        store = type("S", (), {})()
        store.get_cluster = lambda name: (  # type: ignore[attr-defined]
            type("R", (), {"status": ClusterStatus.UP})() if self.row else None)
        store.close = lambda: setattr(self, "closed", True)  # type: ignore[attr-defined]
        self.store = store

    def refresh(self, name: str) -> Cluster:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _watch(lc: _Lc, token: StopToken, recovering: bool) -> tuple[Watcher, list[Gone]]:
    acted: list[Gone] = []
    watcher = Watcher(lambda: lc, "c", 0.01, token, print, recovering=recovering,  # type: ignore[arg-type,return-value]
                      on_gone=acted.append)
    return watcher, acted


def test_the_watcher_stops_the_attempt_once_on_the_loss_it_sees() -> None:
    lc = _Lc([_cluster(ClusterStatus.UP, "running"), _cluster(ClusterStatus.UP, "terminated")])
    token = StopToken()
    watcher, acted = _watch(lc, token, recovering=True)
    watcher.start()
    assert token.wait(10)
    watcher.stop()
    assert watcher.lost is not None and watcher.lost.kind is GoneKind.LEAVING and watcher.detected_at is not None
    assert token.gone() == "aws reports i-0 terminated" and acted == [watcher.lost] and lc.closed


def test_a_watcher_that_did_not_stop_the_attempt_does_not_act_on_the_loss() -> None:
    """The attempt's own failure saw the loss first (and reported it): the watcher is quiet."""
    token = StopToken()
    token.stop(StopKind.NODE_GONE, "seen by the attempt itself")
    watcher, acted = _watch(_Lc([_cluster(ClusterStatus.UP, "terminated")]), token, recovering=False)
    watcher.run()
    assert acted == [] and watcher.lost is None


def test_a_down_by_another_command_is_a_loss_to_a_sweep_and_not_to_a_recovering_run() -> None:
    token = StopToken()
    watcher, acted = _watch(_Lc([_cluster(ClusterStatus.UP, "running")], row=False), token, recovering=False)
    watcher.run()
    assert [g.kind for g in acted] == [GoneKind.TAKEN_DOWN] and token.gone() == "cluster c was taken down"

    token = StopToken()
    watcher, acted = _watch(_Lc([_cluster(ClusterStatus.UP, "running")], row=False), token, recovering=True)
    thread = threading.Thread(target=watcher.run)
    thread.start()
    assert not token.wait(0.2)  # it goes on looking (the pipeline says the `down` itself)
    watcher.stop()
    thread.join(5)
    assert not thread.is_alive() and acted == [] and not token.is_set()


class _Recovery:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


def test_the_tee_only_displays_and_records() -> None:
    """A reporter decides nothing: the job's phase starting uploads nothing and arms nothing, and an
    epoch line pulls no checkpoint (the carry and the puller are the run's policy's,
    run/controller.py; the follow path tells it the epochs, run/follow.py)."""
    inner, recovery = _Reporter(), _Recovery()
    tee: Any = Tee(inner, recovery)
    tee.phase_start("run")
    tee.phase_end("run", 1.0)
    tee.log_line("epoch 2/8  loss 0.5")
    tee.progress({"cloudtrain": "progress", "type": "epoch", "epoch": 3})
    assert inner.said == [("start", "run"), ("end", "run", "", "True"), ("line", "epoch 2/8  loss 0.5"),
                          ("progress", "3")]
    assert recovery.lines[0] == "epoch 2/8  loss 0.5" and len(recovery.lines) == 2
    assert not hasattr(recovery, "epoch") and not hasattr(recovery, "following")
