"""What a node says about its job is data: an answer we cannot read is one RemoteError, never a crash."""

from __future__ import annotations

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import NodeLayout
from cloudtrain.remote.transport import CommandResult

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
