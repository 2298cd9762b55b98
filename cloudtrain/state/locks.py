"""Per-cluster file locks so two CLI processes never provision or tear down one cluster at once."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cloudtrain import paths


@contextmanager
def cluster_lock(cluster: str) -> Iterator[None]:
    from cloudtrain.names import check_cluster_name

    # Defence in depth: the name becomes a file name here.
    check_cluster_name(cluster)
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
