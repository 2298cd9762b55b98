"""The attempt's stop token inside the job's follow (issue 36.1, left over): the follow's backoff
after a dropped link and its polls wait on the token, so a stopped attempt's phase ends at its next
wait instead of sitting out up to 0.5 + 1 + 2 + 4 s of sleeps. No timing threshold decides these
tests: they count the tries made and fail if the follow ever calls time.sleep with a token."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cloudtrain.remote.channel import ConnectionLostError
from cloudtrain.remote.jobs import JobState, NodeLayout
from cloudtrain.run import follow, job
from cloudtrain.run.stop import AttemptStopped, StopKind, StopToken

pytestmark = pytest.mark.quick


class _DeadTransport:
    """A node whose link is down: every command fails as a dropped SSH connection does."""

    label = "node0 (10.0.0.9)"

    def __init__(self) -> None:
        self.tries = 0

    def _lost(self, *args: Any, **kwargs: Any) -> Any:
        self.tries += 1
        raise ConnectionLostError(f"{self.label}: connection lost")

    run = stream = _lost


class _RunningTransport:
    """A node whose job keeps running (runner.sh status answers `running`)."""

    label = "node1 (10.0.0.10)"

    def __init__(self) -> None:
        self.polls = 0

    ANSWER = '{"state": "running", "pid": 42, "exit_code": null, "started_at": 1.0, "ended_at": null, "log_bytes": 0}'

    def run(self, argv: list[str], **kwargs: Any) -> Any:
        # `status` reads .text; `poll` reads .stdout: the status line, then the log's news (none).
        self.polls += 1
        return SimpleNamespace(text=self.ANSWER, stdout=self.ANSWER.encode() + b"\n")


def _node(transport: Any, rank: int = 0) -> Any:
    return SimpleNamespace(rank=rank, transport=transport, layout=NodeLayout("/home/u/.cloudtrain/c1"))


class _Reporter:
    def log_line(self, line: str, node: int = 0) -> None:
        raise AssertionError(f"no line was read: {line!r}")

    def progress(self, event: dict[str, Any]) -> None:
        raise AssertionError(f"no event was read: {event!r}")


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every time.sleep the follow makes, recorded and not slept (the follow module's own `time`)."""
    slept: list[float] = []
    fake = SimpleNamespace(sleep=slept.append, monotonic=follow.time.monotonic)
    monkeypatch.setattr(follow, "time", fake)
    return slept


def _stopped(kind: StopKind = StopKind.STOPPED) -> StopToken:
    token = StopToken()  # no cluster: nothing to hand to transports (this test has none tracked)
    token.stop(kind, "trial 3 pruned" if kind is StopKind.STOPPED else "aws reports i-1 terminated")
    return token


def test_without_a_token_the_follow_backs_off_as_before(sleeps: list[float]) -> None:
    transport = _DeadTransport()
    with pytest.raises(ConnectionLostError):
        follow._follow_streaming(_node(transport), "j1", 0, _Reporter(), None, None)  # type: ignore[arg-type]
    assert transport.tries == 5 and sleeps == [0.5, 1.0, 2.0, 4.0]  # the 7.5 s a stopped attempt no longer waits


@pytest.mark.parametrize("kind", list(StopKind))
def test_a_stopped_attempts_follow_fails_at_its_first_lost_try_without_sleeping(sleeps: list[float],
                                                                               kind: StopKind) -> None:
    transport = _DeadTransport()
    with pytest.raises(ConnectionLostError):  # the error it got: the phase says why from the token
        follow._follow_streaming(_node(transport), "j1", 0, _Reporter(), None, None,  # type: ignore[arg-type]
                                 stop=_stopped(kind))
    assert transport.tries == 1 and sleeps == []


def test_a_stop_during_a_try_ends_the_retry_after_it() -> None:
    token = StopToken()
    tries: list[int] = []

    def poll() -> None:
        tries.append(1)
        if len(tries) == 1:
            token.stop(StopKind.NODE_GONE, "aws reports i-1 terminated")  # the watcher, while this try ran
        raise ConnectionLostError("node0: connection lost")

    with pytest.raises(ConnectionLostError):
        follow._retry(poll, stop=token)  # a real Event wait: set, it returns at once
    assert tries == [1]


def test_a_token_not_set_lets_the_retry_reconnect(sleeps: list[float]) -> None:
    token = StopToken()
    tries: list[int] = []

    def poll() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionLostError("node0: connection lost")
        return "status"

    waits: list[float] = []
    token.wait = lambda seconds: waits.append(seconds) or False  # type: ignore[method-assign]
    assert follow._retry(poll, stop=token) == "status"
    assert len(tries) == 3 and waits == [0.5, 1.0] and sleeps == []  # waited on the token, never slept


def test_a_multinode_follow_stops_polling_once_stopped(sleeps: list[float]) -> None:
    # Rank 0 runs, its log is quiet; the poll's pause waits on the token and ends the follow.
    rank0, rank1 = _RunningTransport(), _RunningTransport()
    with pytest.raises(AttemptStopped) as caught:
        follow.follow(_node(rank0), "j1", 0, _Reporter(), others=[_node(rank1, 1)],  # type: ignore[arg-type]
                      stop=_stopped())
    assert rank0.polls == 1 and sleeps == [] and caught.value.phase_note == "trial 3 pruned"


def test_waiting_for_the_other_ranks_stops_once_stopped(sleeps: list[float]) -> None:
    rank1 = _RunningTransport()
    with pytest.raises(AttemptStopped):
        job._wait_finished(_node(rank1, 1), "j1", _Reporter(), stop=_stopped(StopKind.NODE_GONE))  # type: ignore[arg-type]
    assert rank1.polls == 1 and sleeps == []


def test_the_running_answer_is_read_as_running() -> None:
    # The fake's answer is runner.sh's status format: a test that polled a finished job would prove nothing.
    status = follow.status_retrying(_node(_RunningTransport()), "j1")  # type: ignore[arg-type]
    assert status.state == JobState.RUNNING and not status.finished
