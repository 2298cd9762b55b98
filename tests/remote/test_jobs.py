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
    got, data = jobs.poll(_Answers(answer), LAYOUT, "a", 0)  # type: ignore[arg-type]
    assert (got.state, data) == (state, log)


def test_poll_with_an_unreadable_state_is_one_remote_error() -> None:
    with pytest.raises(RemoteError, match="unreadable job status"):
        jobs.poll(_Answers(b"garbage\nlog"), LAYOUT, "a", 0)  # type: ignore[arg-type]
