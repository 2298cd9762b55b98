"""What the cloud fakes share: a book of the requests they saw, the faults to answer some with, and
gates that park a request so a test can act between two API calls (or kill the CLI mid-call).

Each fake keeps its own request and fault records, because the clouds' requests and errors differ;
what "this request is that action" means is the fake's too (EC2's Action, GCE's "instances.insert"
or "write", ARM's "vm.create"), handed to the book as `action_matches`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

# Bounded, so a test that forgets to release a gate cannot hang a fake server forever.
GATE_LIMIT_S = 600.0


class _Fault(Protocol):
    hits: int

    def matches(self, request: Any) -> bool: ...


RequestT = TypeVar("RequestT")
FaultT = TypeVar("FaultT", bound=_Fault)


@dataclass
class Gate:
    """Parks matching requests until released. `after`: the fake acts first and the answer waits
    (the caller never hears back in time); `when`: a further filter on the request."""

    action: str
    after: bool = False
    when: Callable[[Any], bool] | None = None
    _released: threading.Event = field(default_factory=threading.Event)
    _held: threading.Event = field(default_factory=threading.Event)

    def park(self) -> None:
        self._held.set()
        self._released.wait(timeout=GATE_LIMIT_S)

    def wait_held(self, timeout: float) -> bool:
        """True once a request is parked here."""
        return self._held.wait(timeout)

    def release(self) -> None:
        self._released.set()


class RequestBook(Generic[RequestT, FaultT]):
    """The requests a fake saw, its faults and gates, under one lock (fakes serve from threads)."""

    def __init__(self, action_matches: Callable[[str, RequestT], bool]) -> None:
        self.faults: list[FaultT] = []
        self.gates: list[Gate] = []
        self.requests: list[RequestT] = []
        self.lock = threading.Lock()
        self._action_matches = action_matches

    def add_fault(self, fault: FaultT) -> FaultT:
        with self.lock:
            self.faults.append(fault)
        return fault

    def hold(self, action: str, *, after: bool = False, when: Callable[[Any], bool] | None = None) -> Gate:
        """Park matching requests until `gate.release()`."""
        gate = Gate(action, after, when)
        with self.lock:
            self.gates.append(gate)
        return gate

    def matching(self, action: str, where: Callable[[RequestT], bool] | None = None) -> list[RequestT]:
        """The requests of `action` so far (`where`: a further filter), oldest first."""
        with self.lock:
            return [r for r in self.requests if self._action_matches(action, r) and (where is None or where(r))]

    def clear(self) -> None:
        """Forget faults, requests and gates (released first: nothing stays parked)."""
        with self.lock:
            for gate in self.gates:
                gate.release()
            self.gates.clear()
            self.faults.clear()
            self.requests.clear()

    def record(self, request: RequestT) -> Gate | None:
        """Log `request`; the gate it must wait at, if any."""
        with self.lock:
            self.requests.append(request)
            return next((g for g in self.gates
                         if self._action_matches(g.action, request) and (g.when is None or g.when(request))), None)

    def take_fault(self, request: RequestT) -> FaultT | None:
        """The fault that answers `request` (counted as a hit), if any."""
        with self.lock:
            fault = next((f for f in self.faults if f.matches(request)), None)
            if fault is not None:
                fault.hits += 1
            return fault

    def record_and_match(self, request: RequestT) -> tuple[FaultT | None, Gate | None]:
        """`record`, and the fault decided now (before any gate parks the request)."""
        gate = self.record(request)
        return self.take_fault(request), gate


def kill_cli_at(gate: Gate, args: Sequence[str], env: Mapping[str, str], *, within_s: float = 120.0) -> None:
    """Run `cloudtrain ARGS...` and SIGKILL it once a request of its is parked at `gate`, the gate
    then released: the CLI dies at that exact point of its conversation with the cloud (with
    `after=True`: the cloud acted, the CLI never heard). Raises AssertionError if it never got there."""
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], env=dict(env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_held(gate, proc, args, within_s)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        gate.release()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    if proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"`cloudtrain {' '.join(args)}` ended by itself ({proc.returncode}) before the kill")


def signal_cli_at(gate: Gate, args: Sequence[str], env: Mapping[str, str], signum: int, *,
                  within_s: float = 120.0, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """Run `cloudtrain ARGS...`, send it `signum` (SIGINT, SIGTERM, SIGHUP: a user's Ctrl-C, a
    `kill`, a closed terminal) once a request of its is parked at `gate`, release the gate, and
    let it clean up and exit by itself. Returns what it printed and its exit code."""
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        _wait_held(gate, proc, args, within_s)
        os.kill(proc.pid, signum)
    finally:
        gate.release()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _wait_held(gate: Gate, proc: subprocess.Popen, args: Sequence[str], within_s: float) -> None:
    """Until the CLI's request is parked at `gate`; fails at once, with what the CLI said, if the
    CLI ends before it gets there."""
    deadline = time.monotonic() + within_s
    while not gate.wait_held(0.2):
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr is not None else ""
            raise AssertionError(f"`cloudtrain {' '.join(args)}` ended ({proc.returncode}) before {gate.action}: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"`cloudtrain {' '.join(args)}` never reached {gate.action}")


def _default_signals() -> None:
    # Started from a test run in the background, SIGINT may be inherited ignored: a user's is not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# ---------------------------------------------------------------------- a node's commands

_COMMAND_GATE = """#!/bin/sh
# cloudtrain.testing.faults.NodeCommandGate: parks the first {command} whose arguments match, until
# the test releases it; every other call (and every call after the first match) runs the real one.
match=1
for want in {wanted}; do
  case " $* " in *" $want "*) ;; *) match= ;; esac
done
if [ -n "$match" ] && mkdir {held} 2>/dev/null; then
  i=0
  while [ ! -e {released} ] && [ "$i" -lt {ticks} ]; do sleep 0.1; i=$((i + 1)); done
fi
exec {real} "$@"
"""


@dataclass
class NodeCommandGate:
    """Parks one command on a fake node (an sshd VM of cloudtrain/testing/sshd.py) at a chosen
    point of the conversation: a wrapper of the same name in the VM's bin/ (first on its PATH)
    holds the first call whose argv has every word of `argv_has`, until `release()`. A transfer
    that streams a command's output (collect's `tar ... -cf -`) is then parked before its first
    byte, so a test can preempt the node exactly while that transfer is under way. A VM that is
    powered off kills the parked command with its session, as a real machine going away would."""

    command: str
    argv_has: tuple[str, ...]
    state_dir: Path

    @classmethod
    def install(cls, bin_dir: Path, command: str, argv_has: Sequence[str], state_dir: Path) -> NodeCommandGate:
        import shlex
        import shutil

        # The real command: the first on the VM's PATH after the VM's own bin/ (where the wrapper goes).
        real = shutil.which(command, path=os.defpath + ":/usr/local/bin:/usr/bin:/bin")
        if real is None:
            raise RuntimeError(f"no {command} on this machine to wrap")
        state_dir.mkdir(parents=True, exist_ok=True)
        gate = cls(command, tuple(argv_has), state_dir)
        wrapper = bin_dir / command
        wrapper.write_text(_COMMAND_GATE.format(
            command=command, wanted=" ".join(shlex.quote(w) for w in gate.argv_has),
            held=shlex.quote(str(gate._held)), released=shlex.quote(str(gate._released)),
            ticks=int(GATE_LIMIT_S * 10), real=shlex.quote(real)))
        wrapper.chmod(0o755)
        return gate

    @property
    def _held(self) -> Path:
        return self.state_dir / "held"

    @property
    def _released(self) -> Path:
        return self.state_dir / "released"

    @property
    def held(self) -> bool:
        """True once a matching call is parked (or was: the gate parks only the first)."""
        return self._held.exists()

    def release(self) -> None:
        self._released.touch()
