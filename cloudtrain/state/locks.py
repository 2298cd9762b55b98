"""Per-cluster locks so two CLI processes never provision or tear down one cluster at once.

On this machine's state: a file lock per cluster. With a team database (state_url): a PostgreSQL
session advisory lock per cluster name, so two laptops are kept apart as two terminals are; the
server frees it when the holder's connection ends, a CLI killed with SIGKILL included (no stale
lock files). It takes a connection of its own for as long as it is held: a lock held by the
store's connection would be released by nothing but that connection's end, and the store's is
shared by the command's threads.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cloudtrain import paths

# The advisory lock's first key (the second is the cluster name's hash): cluster locks only.
CLUSTER_LOCK_SPACE = 0x6374


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

    conn = pg.connect(url)
    try:
        # Blocking, as the file lock: the second holder waits, then sees the first one's result.
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (CLUSTER_LOCK_SPACE, cluster))
        yield
        conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (CLUSTER_LOCK_SPACE, cluster))
    finally:
        conn.close()  # ends the session: the server drops any lock it still holds
