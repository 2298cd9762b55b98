"""While a recovering run's attempt goes on (run/recover.py): the cloud watcher and the reporter tee.

- `Watcher`: a thread with its own store and lifecycle that asks the cloud every `recover.watch_s`
  whether the attempt's nodes are still there (`gone_reason`), from the moment its incarnation is up
  (the nodes may still be booting). Seeing them gone, it records why, makes the attempt's
  connections give up at once (those still waiting for a booting machine too) and, while a job is being followed, raises
  `NodeGone` in the run's thread: the follower may be inside a reconnect loop that began before
  the loss and would otherwise wait out its SSH retries.
- `Tee`: the run's reporter while it recovers: everything goes on to the user's reporter; epochs
  feed the checkpoint puller, job lines the attempt's log, the job's phase uploads the checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from cloudtrain.errors import CloudtrainError
from cloudtrain.remote import gone
from cloudtrain.run.checkpoints import epoch_event
from cloudtrain.run.gone import Gone, GoneKind, ask



class NodeGone(CloudtrainError):
    """Raised in the run's thread by the watcher: the cloud says the node is gone (not a RemoteError,
    which the log follower would retry). Raised as a class, so it makes its own message."""

    phase_note = "the node is gone"

    def __init__(self, message: str = "the cloud says the node is gone", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)


class Watcher:
    """Asks the cloud every watch_s whether the attempt's nodes are still there (its own thread,
    store and lifecycle). Seeing them gone, it records why and makes the attempt's connections give
    up at once (no reconnect window), so the pipeline fails now instead of after its SSH retries."""

    def __init__(self, recovery: Any, attempt: Any) -> None:  # run/recover.py: Recovery, Attempt
        self.recovery = recovery
        self.attempt = attempt
        self.lost: Gone | None = None
        self.detected_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"recover watch {recovery.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(30)

    def _loop(self) -> None:
        from cloudtrain.cluster.lifecycle import Lifecycle
        from cloudtrain.state import ClusterStatus, StateStore

        rec = self.recovery
        lc = Lifecycle(StateStore(rec.ex.store.path), rec.ex.config)
        try:
            while not self._stop.wait(rec.settings.watch_s):
                record = lc.store.get_cluster(rec.name)
                # Only an incarnation that is up (its launch, under lifecycle's lock, is not ours to
                # race); its nodes may still be booting, their connects waiting (remote/gone.py).
                if record is None or record.status != ClusterStatus.UP:
                    continue
                why = lost_now(lc, rec.name, rec.ex.reporter.warn)
                if why is not None:
                    self.detected_at = time.time()
                    self.lost = why  # said once, by the recover phase that follows
                    with rec.follow_lock:
                        if rec.following:
                            # The job's follower may be inside a reconnect loop that began before the
                            # loss (tens of seconds of retries, holding its transport's lock, so this
                            # comes first): end it now, in the run's thread.
                            raise_in(rec.main_thread, NodeGone)
                    give_up_connections(rec.r.nodes)
                    # Connects still waiting for a booting machine: no node was handed over yet.
                    gone.give_up_cluster(rec.name)
                    return
        finally:
            lc.store.close()


def lost_now(lc: Any, name: str, warn: Any) -> Gone | None:
    """A recovering run's reading of the one rule (run/gone.py): the cluster's machines went. A row
    another command's `down` removed is not a loss to recover from (the pipeline says so itself)."""
    found = ask(lc, name, warn)
    return None if found is None or found.kind is GoneKind.TAKEN_DOWN else found


def raise_in(thread_id: int, error: type[BaseException]) -> None:
    """Raise `error` in another thread at its next Python instruction (CPython's async exception)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(error))


def give_up_connections(nodes: list) -> None:
    """The node is gone: every later command on it fails at its first connect attempt."""
    from cloudtrain.remote.ssh import SSHTransport

    for node in list(nodes):
        transport = node.transport
        if isinstance(transport, SSHTransport):
            # First, without the transport's lock: a reconnect loop (a collect's, a sync's) holds it.
            transport.give_up()
        transport.close()


class Tee:
    """The run's reporter while it recovers: everything goes on to the user's reporter; epochs feed
    the checkpoint puller, job lines the attempt's log, and the job's phase uploads the checkpoint."""

    def __init__(self, inner: Any, recovery: Any) -> None:
        self.inner = inner
        self.recovery = recovery

    def phase_start(self, phase: str, detail: str = "") -> None:
        self.inner.phase_start(phase, detail)
        if phase == "run":
            self.recovery.job_starting()
        # Not collect: an exception landing in a transfer's lock handling could leave a lock held
        # (a run hung so once under load); a collect whose link broke before the watcher saw the
        # loss waits out the transport's reconnect window instead (ssh.connect_retries_s).
        if phase in ("setup", "run"):
            with self.recovery.follow_lock:
                self.recovery.following = True

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        with self.recovery.follow_lock:
            self.recovery.following = False
        self.inner.phase_end(phase, seconds, detail=detail, ok=ok)

    def log_line(self, line: str, node: int = 0) -> None:
        self.inner.log_line(line, node)
        if node == 0:
            self.recovery.line(line)
            event = epoch_event(line)
            if event is not None:
                self.recovery.epoch(event["epoch"])

    def progress(self, event: dict[str, Any]) -> None:
        self.inner.progress(event)
        self.recovery.line(json.dumps(event))
        epoch = event.get("epoch")
        if event.get("type") == "epoch" and isinstance(epoch, int) and not isinstance(epoch, bool):
            self.recovery.epoch(epoch)

    def info(self, message: str) -> None:
        self.inner.info(message)

    def warn(self, message: str) -> None:
        self.inner.warn(message)

    def __getattr__(self, name: str) -> Any:
        # Reporters may carry more than the protocol (the CLI's progress bar): pass it through.
        return getattr(self.inner, name)
