"""`logs -f` on a recovering run: which attempt it follows, and what to do when that node goes.

`logs -f NAME` follows the job of the cluster's current incarnation, i.e. one attempt. When the
node goes (preempted, lost) the run's own CLI relaunches elsewhere and takes the old node down, so
the follower cannot reconnect; instead of the connection's error (which would blame the SSH key the
teardown removed), it ends saying which attempt it followed, that the run is recovering, and how to
follow the next attempt. runs/<run>/job.log holds every attempt's lines once the run ends.
It ends as soon as the run records the attempt ended (`watching`), not after its own reconnects
(minutes: the follower's link to a machine that is gone retries before it gives up).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError
from cloudtrain.state import RunStatus

if TYPE_CHECKING:
    from cloudtrain.state import StateStore

ATTEMPTS_FILE = "attempts.json"  # run/recover.py writes it in the run directory as attempts go


@dataclass(frozen=True)
class Followed:
    run_id: str
    run_dir: Path
    attempt: int  # the attempt running when the follow began


def _attempts(run_dir: Path) -> list[dict]:
    try:
        data = json.loads((run_dir / ATTEMPTS_FILE).read_text())
    except FileNotFoundError:
        return []  # a run without recovery: the connection's own error says it all
    except (OSError, ValueError):
        return []  # being rewritten (it is replaced whole) or damaged: no claim made from it
    return [a for a in data if isinstance(a, dict)] if isinstance(data, list) else []


def followed_attempt(store: StateStore, cluster: str) -> Followed | None:
    """The recovering run on `cluster` and its running attempt, or None (no run with `recover:` running)."""
    runs = store.list_runs(cluster, limit=1)
    if not runs or runs[0].status != RunStatus.RUNNING or not runs[0].run_dir:
        return None
    run_dir = Path(runs[0].run_dir)
    running = [a.get("number") for a in _attempts(run_dir) if a.get("outcome") == "running"]
    if not running or not isinstance(running[-1], int):
        return None
    return Followed(runs[0].id, run_dir, running[-1])


def attempt_ended(followed: Followed, cluster: str, cause: CloudtrainError) -> CloudtrainError | None:
    """The error `logs -f` ends with when the attempt it followed ended because its node went
    (run/recover.py recorded it preempted or lost); None when it did not (the cause stands)."""
    ended = next((a for a in _attempts(followed.run_dir) if a.get("number") == followed.attempt), None)
    if ended is None or ended.get("outcome") not in ("preempted", "lost"):
        return None
    return CloudtrainError(
        f"stopped following attempt {followed.attempt} of run {followed.run_id}: {ended['outcome']} "
        f"({ended.get('reason') or cause.message}); the run goes on with a new attempt unless its "
        "restarts or budget are spent",
        hint=f"`cloudtrain logs {cluster} -f` follows the next attempt once its job starts; "
             f"{followed.run_dir / 'job.log'} holds every attempt's lines when the run ends")


# How often `logs -f` looks at the run's attempts.json while it follows.
WATCH_S = 1.0


@contextmanager
def watching(followed: Followed | None, cluster: str) -> Iterator[None]:
    """While `logs -f` follows `followed`: once the run records that attempt ended because its node
    went, the follower's connections to the cluster give up (remote/gone.py) and close, so the
    follow ends now and `attempt_ended` says why, instead of reconnecting to a machine that is gone."""
    if followed is None:
        yield
        return
    done = threading.Event()

    def look() -> None:
        from cloudtrain.remote import gone

        while not done.wait(WATCH_S):
            if attempt_ended(followed, cluster, CloudtrainError("")) is not None:
                gone.give_up_cluster(cluster, close=True)
                return

    thread = threading.Thread(target=look, name=f"logs watch {cluster}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
