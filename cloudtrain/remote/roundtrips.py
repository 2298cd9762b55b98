"""Counting the sequential round trips the laptop makes to a node: what a link's latency multiplies.

A round trip is a turn of the conversation: the laptop sent something (a channel open, an exec
request, a command's input, a request to the node helper) and then blocks until the node answers.
Several requests sent before the first wait are ONE round trip (pipelining, or channels opened
concurrently); a response that streams on after the first bytes costs none. The counter is told
of every send and every blocking wait by remote/ssh.py, remote/channel.py and remote/helper.py, so
the figure is counted, never estimated. A turn counts when the answer is read, whether the reader
blocked for it or found it already in (a busy laptop reads late; the node's latency was paid).

`CLOUDTRAIN_ROUNDTRIPS_LOG=FILE` appends one JSON line per closed SSH transport (node, connects,
round_trips after connecting, waits, sessions, and `turns`: what each round trip waited for): how
benchmarks/run_loop.py and the tests read a CLI subprocess's count, and how to see which exchange
a regression added.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass

LOG_ENV = "CLOUDTRAIN_ROUNDTRIPS_LOG"


@dataclass(frozen=True)
class RoundTripReport:
    node: str
    connects: int  # SSH connections opened (their handshakes are not counted below)
    round_trips: int  # sequential request -> answer turns after connecting
    waits: int  # blocking waits on the node (>= round_trips: a wait with nothing new sent is no trip)
    sessions: int  # SSH channels opened (each is a session on the node: PAM, a shell)
    turns: tuple[str, ...] = ()  # what each round trip waited for, in order
    reused: str = ""  # the connection was kept from an earlier command: "mux" (its process), "process" (parked)


class RoundTrips:
    """Thread-safe: channels of one connection run concurrently, and their turns merge."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = False  # something was sent that the laptop has not waited for yet
        self.round_trips = 0
        self.waits = 0
        self.sessions = 0
        self.turns: list[str] = []

    def sent(self) -> None:
        with self._lock:
            self._pending = True

    def waiting(self, what: str = "") -> None:
        """The laptop is about to block until the node answers (`what`: for the log of turns)."""
        with self._lock:
            self.waits += 1
            if self._pending:
                self._pending = False
                self.round_trips += 1
                self.turns.append(what or "?")

    def answered(self, what: str = "") -> None:
        """An answer was read that was already in (the caller did not block for it): if something
        was sent since the last turn, that turn was still paid, only while the laptop was busy."""
        with self._lock:
            if self._pending:
                self._pending = False
                self.round_trips += 1
                self.turns.append(what or "?")

    def session(self) -> None:
        with self._lock:
            self.sessions += 1

    def report(self, node: str, connects: int, reused: str = "") -> RoundTripReport:
        with self._lock:
            return RoundTripReport(node, connects, self.round_trips, self.waits, self.sessions, tuple(self.turns),
                                   reused)


def log_report(report: RoundTripReport) -> None:
    """Append the report to $CLOUDTRAIN_ROUNDTRIPS_LOG, if set (one JSON object per line)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(report)) + "\n")
