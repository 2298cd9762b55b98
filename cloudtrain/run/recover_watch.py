"""While an attempt goes on: the one cloud watcher (a recovering run's, run/recover.py, and a sweep
trial's, sweep/backend.py) and the recovering run's reporter tee.

- `Watcher`: asks the cloud every `every_s` whether the attempt's cluster is still there, by the
  one rule (run/gone.py), with its own store and lifecycle (it runs in a thread of its own). Seeing
  it gone, it records why and sets the attempt's stop token (run/stop.py), which makes the
  attempt's connections give up at once (those still waiting for a booting machine too): the run's
  thread fails at its next command and ends the attempt itself. A controller that acts on the loss
  from here (a sweep: take the VM down, tell the scheduler) passes `on_gone`; it runs only when
  this watcher was the one that stopped the attempt, so a loss is acted on once.
- `Tee`: the run's reporter while it recovers: everything goes on to the user's reporter; job lines
  also go to the attempt's log. It decides nothing: epochs reach the checkpoint puller through the
  run's policy (the follow path calls its `epoch`, run/controller.py), and so does the checkpoint
  carry before a relaunched job (its `before_job`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cloudtrain.run.gone import Gone, GoneKind, ask
from cloudtrain.run.stop import StopKind, StopToken

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Lifecycle


def lost_now(lc: Any, name: str, warn: Callable[[str], None]) -> Gone | None:
    """A recovering run's reading of the one rule (run/gone.py): the cluster's machines went. A row
    another command's `down` removed is not a loss to recover from (the pipeline says so itself)."""
    found = ask(lc, name, warn)
    return None if found is None or found.kind is GoneKind.TAKEN_DOWN else found


class Watcher:
    """Asks the cloud every `every_s` whether cluster `name` is still there. `recovering`: only while
    state has it up (its launch, under lifecycle's lock, is not ours to race; its nodes may still be
    booting, their connects waiting), and a `down` by another command is no loss (`lost_now`).
    Otherwise (a sweep's VM, up before its trial starts) any gone counts, a row removed too."""

    def __init__(self, open_lc: Callable[[], Lifecycle], name: str, every_s: float, token: StopToken,
                 warn: Callable[[str], None], *, recovering: bool = True,
                 on_gone: Callable[[Gone], None] | None = None) -> None:
        self.open_lc = open_lc
        self.name = name
        self.every_s = every_s
        self.token = token
        self.warn = warn
        self.recovering = recovering
        self.on_gone = on_gone
        self.lost: Gone | None = None
        self.detected_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Watch in a thread of its own (a caller with its own thread accounting calls `run`)."""
        self._thread = threading.Thread(target=self.run, name=f"watch {self.name}", daemon=True)
        self._thread.start()

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        thread = self._thread
        if join and thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(30)

    def run(self) -> None:
        from cloudtrain.state import ClusterStatus

        lc = self.open_lc()
        try:
            # Ends when stopped, when the attempt was stopped by someone else, or at the loss it saw.
            while not self._stop.wait(self.every_s) and not self.token.is_set():
                if self.recovering:
                    record = lc.store.get_cluster(self.name)
                    if record is None or record.status != ClusterStatus.UP:
                        continue
                    found = lost_now(lc, self.name, self.warn)
                else:
                    found = ask(lc, self.name, self.warn)
                if found is None:
                    continue
                self.detected_at = time.time()
                self.lost = found  # said once, by whoever acts on the loss
                if self.token.stop(StopKind.NODE_GONE, str(found)) and self.on_gone is not None:
                    self.on_gone(found)
                return
        finally:
            lc.store.close()


class Tee:
    """The run's reporter while it recovers: everything goes on to the user's reporter; job lines
    also go to the attempt's log. Display and record only."""

    def __init__(self, inner: Any, recovery: Any) -> None:
        self.inner = inner
        self.recovery = recovery

    def phase_start(self, phase: str, detail: str = "") -> None:
        self.inner.phase_start(phase, detail)

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        self.inner.phase_end(phase, seconds, detail=detail, ok=ok)

    def log_line(self, line: str, node: int = 0) -> None:
        self.inner.log_line(line, node)
        if node == 0:
            self.recovery.line(line)

    def progress(self, event: dict[str, Any]) -> None:
        self.inner.progress(event)
        self.recovery.line(json.dumps(event))

    def info(self, message: str) -> None:
        self.inner.info(message)

    def warn(self, message: str) -> None:
        self.inner.warn(message)

    def __getattr__(self, name: str) -> Any:
        # Reporters may carry more than the protocol (the CLI's progress bar): pass it through.
        return getattr(self.inner, name)
