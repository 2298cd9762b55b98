"""Round trips of answers that were already in when read (remote/helper.py, remote/channel.py): the
turn is paid when an answer to something sent arrives, whether or not the reader had to block for it.

On a loaded machine the node answered before the caller first read, and reading found the answer
waiting: two commands sent together and read out of order counted no round trip at all (CI:
tests/remote/test_round_trips.py, `3 == 2 + 2`)."""

from __future__ import annotations

import json

import pytest

from cloudtrain.remote.channel import RemoteProcess
from cloudtrain.remote.helper import HEADER, NodeHelper
from cloudtrain.remote.roundtrips import RoundTrips

pytestmark = pytest.mark.quick


class _Alive:
    def alive(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None


class _Channel:
    """A paramiko channel whose node has answered everything already: its bytes are in."""

    def __init__(self) -> None:
        self.sent = b""
        self.inbox = b""
        self.eof_received = False
        self.closed = False

    def sendall(self, data: bytes) -> None:
        self.sent += bytes(data)

    def shutdown_write(self) -> None:
        pass

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_ready(self) -> bool:
        return bool(self.inbox)

    def recv(self, size: int) -> bytes:
        data, self.inbox = self.inbox[:size], self.inbox[size:]
        return data

    def answer(self, kind: bytes, rid: int, payload: bytes) -> None:
        self.inbox += HEADER.pack(kind, rid, len(payload)) + payload


def test_helper_answers_already_in_count_one_round_trip_per_turn() -> None:
    counter = RoundTrips()
    chan = _Channel()
    helper = NodeHelper("node", _Alive(), chan, counter)  # type: ignore[arg-type]
    chan.answer(b"H", 0, json.dumps({"home": "/home/u", "commands": {"python3": True}}).encode())
    helper.ensure_hello()
    first, second = helper.submit(["echo", "a"]), helper.submit(["echo", "b"])
    for rid, text in ((first.rid, b"a\n"), (second.rid, b"b\n")):
        chan.answer(b"O", rid, text)
        chan.answer(b"C", rid, b"0")
    assert second.read_all() == b"b\n" and first.read_all() == b"a\n"
    assert counter.round_trips == 1, counter.turns  # the two requests went together: one turn
    third = helper.submit(["true"])
    chan.answer(b"C", third.rid, b"0")
    assert third.wait() == 0
    assert counter.round_trips == 2, counter.turns


def test_a_command_output_already_in_counts_its_round_trip() -> None:
    counter = RoundTrips()
    chan = _Channel()
    proc = RemoteProcess("node", _Alive(), chan, "cat", None, counter)  # type: ignore[arg-type]
    proc.feed(b"question")
    chan.inbox = b"answer"
    assert proc.read() == b"answer"
    assert (counter.round_trips, counter.turns) == (1, ["cat"])
    chan.inbox = b" streams on"
    assert proc.read() == b" streams on"
    assert counter.round_trips == 1  # what streams on after the first bytes is no new turn
