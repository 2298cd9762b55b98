"""What a node says about its job is data: an answer we cannot read is one RemoteError, never a crash."""

from __future__ import annotations

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import NodeLayout
from cloudtrain.remote.transport import CommandResult

pytestmark = pytest.mark.quick

GOOD = b'{"state": "running", "pid": 7, "exit_code": null, "started_at": 1.0, "ended_at": null, "log_bytes": 12}'


class _Answers:
    label = "fake-node"

    def __init__(self, stdout: bytes) -> None:
        self.stdout = stdout

    def run(self, argv, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return CommandResult(tuple(argv), 0, self.stdout, b"")


# (node's answer) - issue 29: everything from a node is bounded, a status answer included
HOSTILE_STATUS = [
    b"not json",
    b"[" * 100_000 + b"]" * 100_000,  # nested past json's depth: RecursionError before
    b"[1, 2]",  # not an object: TypeError before
    b'{"state": "running"}',  # fields missing: KeyError before
    GOOD.replace(b"12}", b'"many"}'),  # int() of text: ValueError
]


@pytest.mark.parametrize("answer", HOSTILE_STATUS, ids=range(len(HOSTILE_STATUS)))
def test_unreadable_status_is_one_remote_error(answer: bytes) -> None:
    with pytest.raises(RemoteError) as info:
        jobs.status(_Answers(answer), NodeLayout("/home/u/.cloudtrain/c"), "r1-run")  # type: ignore[arg-type]
    line = info.value.one_line()
    assert "fake-node: unreadable job status" in line and len(line) < 600


def test_a_good_status_reads() -> None:
    got = jobs.status(_Answers(GOOD), NodeLayout("/home/u/.cloudtrain/c"), "r1-run")  # type: ignore[arg-type]
    assert (got.state, got.pid, got.log_bytes) == ("running", 7, 12)


LAYOUT = NodeLayout("/home/u/.cloudtrain/c")

# (node's answer to read_logs for jobs a and b, what the error says) - one command brings every log
HOSTILE_LOGS = [
    (b"", "unreadable log listing"),
    (GOOD + b"\n", "unreadable log listing"),  # no size line
    (GOOD + b"\nmany\nxx", "unreadable log listing"),
    (GOOD + b"\n5\nab", "arrived cut short"),  # fewer bytes than announced
    (b"not json\n0\n", "unreadable job status"),
    (GOOD + b"\n2\nab" + GOOD, "unreadable log listing"),  # the second job's record cut short
]


@pytest.mark.parametrize(("answer", "says"), HOSTILE_LOGS, ids=range(len(HOSTILE_LOGS)))
def test_unreadable_logs_are_one_remote_error(answer: bytes, says: str) -> None:
    with pytest.raises(RemoteError) as info:
        jobs.read_logs(_Answers(answer), LAYOUT, ["a", "b"])  # type: ignore[arg-type]
    line = info.value.one_line()
    assert says in line and len(line) < 600


def test_every_log_and_state_read_from_one_answer() -> None:
    pending = GOOD.replace(b'"running"', b'"pending"')
    got = jobs.read_logs(_Answers(GOOD + b"\n6\nline\n\n" + pending + b"\n0\n"), LAYOUT, ["a", "b"])  # type: ignore[arg-type]
    assert got["a"][0].state == "running" and got["a"][1] == b"line\n\n"
    assert got["b"][0].state == "pending" and got["b"][1] == b""


@pytest.mark.parametrize(("answer", "state", "log"), [
    (GOOD + b"\n", "running", b""),
    (GOOD + b"\nsome\nlines", "running", b"some\nlines"),
])
def test_poll_reads_the_state_then_the_log(answer: bytes, state: str, log: bytes) -> None:
    got, data, events = jobs.poll(_Answers(answer), LAYOUT, "a", 0)  # type: ignore[arg-type]
    assert (got.state, data, events) == (state, log, b"")


def test_poll_with_events_reads_them_before_the_log() -> None:
    event = b'{"cloudtrain":"progress","type":"epoch","epoch":1}\n'
    answer = GOOD + b"\n" + str(len(event)).encode() + b"\n" + event + b"epoch 1/2\n"
    got, log, events = jobs.poll(_Answers(answer), LAYOUT, "a", 0, events=0)  # type: ignore[arg-type]
    assert (got.state, log, events) == ("running", b"epoch 1/2\n", event)


@pytest.mark.parametrize("rest", [b"", b"many\nx", b"9\nshort"])
def test_poll_with_unreadable_events_is_one_remote_error(rest: bytes) -> None:
    with pytest.raises(RemoteError, match="unreadable job events"):
        jobs.poll(_Answers(GOOD + b"\n" + rest), LAYOUT, "a", 0, events=0)  # type: ignore[arg-type]


FRAMED = b"L 6\nline 1P 3\nabcL 1\n\nP 2\nde"


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_a_framed_follow_reads_the_same_in_chunks_of_any_size(size: int) -> None:
    deframer = jobs.Deframer("fake-node")
    pieces = [p for at in range(0, len(FRAMED), size) for p in deframer.feed(FRAMED[at : at + size])]
    deframer.close()
    joined: dict[bytes, bytes] = {jobs.LOG: b"", jobs.EVENTS: b""}
    for kind, data in pieces:
        joined[kind] += data
    assert joined == {jobs.LOG: b"line 1\n", jobs.EVENTS: b"abcde"}


@pytest.mark.parametrize(("data", "says"), [
    (b"X 3\nabc", "unreadable job follow"),
    (b"L many\n", "unreadable job follow"),
    (b"L" * 100, "unreadable job follow"),  # a header without its newline, past any real one
])
def test_an_unreadable_follow_is_one_remote_error(data: bytes, says: str) -> None:
    with pytest.raises(RemoteError, match=says):
        list(jobs.Deframer("fake-node").feed(data))


def test_a_follow_that_ends_inside_a_frame_says_so() -> None:
    deframer = jobs.Deframer("fake-node")
    assert list(deframer.feed(b"L 5\nab")) == [(jobs.LOG, b"ab")]
    with pytest.raises(RemoteError, match="ended inside a frame"):
        deframer.close()


def test_poll_with_an_unreadable_state_is_one_remote_error() -> None:
    with pytest.raises(RemoteError, match="unreadable job status"):
        jobs.poll(_Answers(b"garbage\nlog"), LAYOUT, "a", 0)  # type: ignore[arg-type]
