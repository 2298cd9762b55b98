"""Stopping an attempt: a token, never an exception injected into another thread (issue 36.1).

Whoever decides an attempt must end (the cloud watcher of a recovering run or of a sweep seeing its
machine gone, a sweep's scheduler pruning a trial) sets the attempt's StopToken, once, with why. The
pipeline checks it between phases (run/pipeline.py `_PhaseClock.phase`): no phase of a stopped
attempt starts. A phase in progress is not interrupted; when the machine is gone the token hands the
loss to the attempt's SSH transports (remote/gone.py `give_up_cluster`): their reconnect loops and
connects waiting for a booting machine end, open connections close, so the phase fails at its next
command instead of waiting out the SSH retry window. The run's thread then ends the attempt itself,
as with any error, holding no lock that a landed exception could have left held (an injected
`PyThreadState_SetAsyncExc` could, and one use of it hung CI once).

The first `stop` wins: a watcher and the attempt's own failure both seeing the loss report it once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

from cloudtrain.errors import CloudtrainError


class StopKind(Enum):
    NODE_GONE = "node gone"  # the cloud says the attempt's machine went (run/gone.py)
    STOPPED = "stopped"  # the controller ended it: a sweep's scheduler pruned or stopped the trial


@dataclass(frozen=True)
class Stop:
    kind: StopKind
    detail: str  # the cloud's words (run/gone.py Gone), or the scheduler's reason

    @property
    def note(self) -> str:
        """What the phase it ended says on its end line (recovery says the loss itself, once)."""
        return "the node is gone" if self.kind is StopKind.NODE_GONE else self.detail


class AttemptStopped(CloudtrainError):
    """Raised by the pipeline, in its own thread, at the first phase boundary after a stop."""

    def __init__(self, stop: Stop) -> None:
        if stop.kind is StopKind.NODE_GONE:
            message = f"the cloud says the node is gone: {stop.detail}"
        else:
            message = f"the attempt was stopped ({stop.detail or 'by its controller'})"
        super().__init__(message)
        self.stop = stop
        self.phase_note = stop.note


class StopToken:
    """One attempt's stop: set once by whoever decides, read by the pipeline and the controller.
    `cluster`: the attempt's cluster, whose transports in this process give up when its machine is
    gone (None: nothing to hand over, e.g. a token of a run on no cluster yet)."""

    def __init__(self, cluster: str | None = None) -> None:
        self.cluster = cluster
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._stop: Stop | None = None

    def stop(self, kind: StopKind, detail: str = "") -> bool:
        """Stop the attempt; True when this call did (the caller reports it), False when it was
        stopped already (whoever stopped it first reports it)."""
        with self._lock:
            if self._stop is not None:
                return False
            self._stop = Stop(kind, detail)
            self._set.set()
        if kind is StopKind.NODE_GONE and self.cluster is not None:
            from cloudtrain.remote import gone

            # Outside the lock: a transport's close waits for a reconnect loop's attempt to end.
            gone.give_up_cluster(self.cluster, close=True)
        return True

    @property
    def reason(self) -> Stop | None:
        return self._stop

    def is_set(self) -> bool:
        return self._set.is_set()

    def gone(self) -> str | None:
        """Why the machine is gone, when that is why the attempt stopped (collect stops retrying)."""
        stop = self._stop
        return stop.detail if stop is not None and stop.kind is StopKind.NODE_GONE else None

    def check(self) -> None:
        """Between phases: raise AttemptStopped when the attempt was stopped."""
        stop = self._stop
        if stop is not None:
            raise AttemptStopped(stop)

    def wait(self, timeout_s: float) -> bool:
        return self._set.wait(timeout_s)
