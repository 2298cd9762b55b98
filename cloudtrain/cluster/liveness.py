"""Liveness marks: proof, visible from any state, that a cloudtrain process is doing a machine's work.

`gc` finds cloudtrain's machines by tag, and a machine that this state does not know may still be
someone's live run: another CLOUDTRAIN_HOME of the same owner (a second laptop, a CI runner that
logs in as the same user), a run driven from elsewhere. Presuming it dead ended live runs. So the
machine says it is alive where every state can see it, on the machine itself: its TAG_ALIVE tag
(label) holds the whole epoch second of the last mark. The launch request carries the first one;
while a command holds the cluster (`run`, a sweep's trials, `up`, `exec`) the mark is renewed every
MARK_EVERY_S. A mark younger than LIVE_FOR_S is live work: `gc` shows it and leaves it alone.

The node renews it too while it works, with no CLI holding it (a detached job, a closed laptop):
its watchdog, every MARK_EVERY_S, with the machine's own identity where it has one that may
(MarksItself.mark_action; cloudtrain/run/watchdog.py sends the call and the period). AWS nodes and
GCP VMs that run as no service account do not: only the commands here mark them.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError
from cloudtrain.node.protocol import MARK_EVERY_S  # the node's watchdog renews the mark as often
from cloudtrain.providers.base import InstanceState, MarksAlive, supports

if TYPE_CHECKING:
    from cloudtrain.config import Config

log = logging.getLogger(__name__)

# Four marks missed (a laptop asleep for a moment, an API error or two) before work counts as gone.
LIVE_FOR_S = 4 * MARK_EVERY_S
# How often the holder looks for new machines (a relaunch, a recovery's new incarnation) to mark.
_LOOK_EVERY_S = 15.0
# A command shorter than this marks nothing: a warm `exec` or `run` must not pay for a cloud SDK's
# import and a tagging call (seconds on GCP and Azure), and a launch carries its own first mark.
FIRST_AFTER_S = 20.0


def is_live(alive_at: float | None, now: float) -> bool:
    return alive_at is not None and now - alive_at < LIVE_FOR_S


def evidence(alive_at: float | None, now: float) -> str:
    """What `gc` shows of a machine's mark: `alive 2 min ago`, `last alive 3 h ago`, `never marked`."""
    if alive_at is None:
        return "never marked"
    ago = _ago(max(0.0, now - alive_at))
    return f"alive {ago} ago" if is_live(alive_at, now) else f"last alive {ago} ago"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def mark(store_path: Path | None, config: Config, cluster: str, now: float | None = None) -> list[str] | None:
    """Renew the mark on the cluster's live machines once; the ids marked, None where the cluster's
    backend has no marks (this machine, given hosts: nothing there for another state to end)."""
    from cloudtrain.providers import get_provider
    from cloudtrain.state import StateStore

    store = StateStore(store_path)
    try:
        record = store.get_cluster(cluster)
        if record is None:
            return []
        ids = [n.instance_id for n in store.get_nodes(cluster)
               if n.state not in (InstanceState.TERMINATED.value, InstanceState.STOPPED.value)]
    finally:
        store.close()
    provider = get_provider(record.provider, config)
    if not supports(provider, MarksAlive):
        return None
    if not ids:
        return []
    provider.mark_alive(ids, time.time() if now is None else now)
    return ids


class AliveMarks:
    """While a command holds CLUSTER: from `first_after_s` on, its machines' mark, renewed every
    `every_s` and at once for machines it has not marked yet (a relaunch). Its own state connection (SQLite connections stay in their
    thread); stopped with a token, `stop()`."""

    def __init__(self, store_path: Path | None, config: Config, cluster: str, every_s: float = MARK_EVERY_S,
                 look_every_s: float = _LOOK_EVERY_S, first_after_s: float = FIRST_AFTER_S) -> None:
        self._path, self._config, self._cluster = store_path, config, cluster
        self._every, self._look, self._first = every_s, look_every_s, first_after_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> AliveMarks:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"alive-marks-{self._cluster}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        from cloudtrain.state import StateStore

        marked: set[str] = set()
        last = 0.0
        failing = False
        if self._stop.wait(self._first):
            return
        store = StateStore(self._path)
        try:
            while True:
                ids = {n.instance_id for n in store.get_nodes(self._cluster)
                       if n.state not in (InstanceState.TERMINATED.value, InstanceState.STOPPED.value)}
                if ids and (not ids <= marked or time.time() - last >= self._every):
                    try:
                        done = mark(self._path, self._config, self._cluster)
                        if done is None:
                            return
                        marked, last, failing = set(done), time.time(), False
                    except CloudtrainError as exc:
                        # The next look tries again; four missed marks in a row before anyone may
                        # take the machines for a leak (LIVE_FOR_S). Said once per streak.
                        (log.debug if failing else log.warning)(
                            "could not renew the liveness mark of %s: %s", self._cluster, exc.one_line())
                        failing = True
                if self._stop.wait(self._look):
                    return
        finally:
            store.close()
