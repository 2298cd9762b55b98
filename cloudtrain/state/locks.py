"""Per-cluster locks so two CLI processes never provision or tear down one cluster at once.

On this machine's state: a file lock per cluster. With a team database (state_url): a PostgreSQL
session advisory lock per cluster name, so two laptops are kept apart as two terminals are; the
server frees it when the holder's connection ends, a CLI killed with SIGKILL included (no stale
lock files). It is taken on the CLI's one connection (state/pg.py: every store of the process
shares it), so a CLI holding clusters needs no second connection. Two consequences, handled here:
a session's advisory locks are re-entrant, so threads of one process are kept apart by a lock of
the process's own first; and the session is shared, so waiting for a teammate's lock is a
`pg_try_advisory_lock` tried again (never a blocking call that would stop the process's other
threads' statements), and the lock is given back explicitly on leaving, whatever happened.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cloudtrain import paths

if TYPE_CHECKING:
    from cloudtrain.state.records import ClusterRecord

# The advisory lock's first key (the second is the cluster name's hash): cluster locks only.
CLUSTER_LOCK_SPACE = 0x6374
# How often a waiter asks again for a team cluster lock another CLI holds, at most.
_RETRY_MAX_S = 0.5

_in_process: dict[str, threading.Lock] = {}
_in_process_lock = threading.Lock()


@contextmanager
def cluster_lock(cluster: str) -> Iterator[None]:
    from cloudtrain.names import check_cluster_name
    from cloudtrain.state.location import state_url

    # Defence in depth: the name becomes a file name here.
    check_cluster_name(cluster)
    url = state_url()
    if url is not None:
        with _team_lock(url, cluster):
            yield
        return
    lock_dir = paths.home() / "locks"
    lock_dir.mkdir(exist_ok=True)
    fd = os.open(lock_dir / f"{cluster}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        # Blocking: the second process waits for the first to finish, then sees its result in state.
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def _team_lock(url: str, cluster: str) -> Iterator[None]:
    from cloudtrain.state import pg

    with _in_process_lock:
        mine = _in_process.setdefault(cluster, threading.Lock())
    # Blocking, as the file lock: the second holder waits, then sees the first one's result.
    with mine:
        conn = pg.open_store(url)
        key = (CLUSTER_LOCK_SPACE, cluster)
        try:
            pause = 0.02
            while not conn.execute("SELECT pg_try_advisory_lock(?, hashtext(?))", key).fetchone()[0]:
                time.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
            try:
                yield
            finally:
                # The session outlives this lock (it is the CLI's): give the lock back ourselves.
                # A session that is gone has lost it already, with the connection.
                try:
                    conn.execute("SELECT pg_advisory_unlock(?, hashtext(?))", key)
                except pg.StateUnavailable as exc:
                    logging.getLogger(__name__).debug("cluster lock %s: freed with the session (%s)", cluster, exc)
        finally:
            conn.close()


def launch_in_flight(record: ClusterRecord, now: float | None = None) -> bool:
    """Whether another process is creating this cluster right now (`gc`, `cost` and `down` leave
    it alone). Every launch runs under its cluster's lock (cluster/lifecycle.py `up`), so on a team
    database the lock is the answer for a launcher on another machine, whose process this machine
    cannot look up: the server frees a dead CLI's session lock at once, where the heartbeat's word
    would stand for two minutes (ClusterRecord.launch_in_flight). Where the lock cannot be asked
    (this machine's file lock: the process table already answers), the record's rule stands."""
    if not record.launch_in_flight(time.time() if now is None else now):
        return False
    from cloudtrain import procid

    if record.driver is None or procid.alive(record.driver):
        return True  # a launcher this machine can see, alive (this process's own included)
    return _held_elsewhere(record.name) is not False


def _held_elsewhere(cluster: str) -> bool | None:
    """Whether another session holds the cluster's team lock; None: not a team database, or no answer."""
    from cloudtrain.state.location import state_url

    url = state_url()
    if url is None:
        return None
    from cloudtrain.state import pg

    conn = pg.open_store(url)
    try:
        # pg_try_advisory_lock(int4, int4) shows in pg_locks as classid, objid (as oid), objsubid 2.
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                           "AND objsubid = 2 AND classid = (?)::int4::oid AND objid = hashtext(?)::oid "
                           "AND pid <> pg_backend_pid())", (CLUSTER_LOCK_SPACE, cluster)).fetchone()
        return bool(row[0])
    except pg.StateUnavailable as exc:
        logging.getLogger(__name__).debug("who holds %s's lock: %s", cluster, exc)
        return None
    finally:
        conn.close()
