"""Round trips of a command fed input (remote/channel.py): the input counts as sent when the caller
hands it over, not when the thread writing it first runs."""

from __future__ import annotations

import threading

import pytest

from cloudtrain.remote.channel import RemoteProcess
from cloudtrain.remote.roundtrips import RoundTrips

pytestmark = pytest.mark.quick


class _Senders(RoundTrips):
    def __init__(self) -> None:
        super().__init__()
        self.senders: list[threading.Thread] = []

    def sent(self) -> None:
        self.senders.append(threading.current_thread())
        super().sent()


class _Channel:
    """The part of a paramiko channel the writer uses; its send waits until the test lets it."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.received = b""

    def sendall(self, data: bytes) -> None:
        self.go.wait(10)
        self.received += bytes(data)

    def shutdown_write(self) -> None:
        pass


class _Alive:
    def alive(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None


def test_input_is_counted_as_sent_before_the_caller_first_waits() -> None:
    # On a loaded machine the writer thread ran after the caller's wait, and the answer came within
    # that one wait: the tar a sync sends counted no round trip at all (CI: `turns == []`).
    counter = _Senders()
    chan = _Channel()
    proc = RemoteProcess("node", _Alive(), chan, "tar", None, counter)  # type: ignore[arg-type]
    proc.feed(b"the workdir's tar")
    assert counter.senders == [threading.current_thread()]  # before the writer thread's first step
    counter.waiting("tar")
    assert (counter.round_trips, counter.turns) == (1, ["tar"])
    chan.go.set()
    assert proc._writer is not None
    proc._writer.join(10)
    assert chan.received == b"the workdir's tar" and counter.round_trips == 1
