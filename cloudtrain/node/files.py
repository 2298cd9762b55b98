"""Reading and writing the node's small files: JSON written atomically, the decision log, the
loop's lock. Standard library only, Python 3.8+."""

from __future__ import annotations

import errno
import json
import os
import sys
import time

from .protocol import Paths

LOG_MAX_BYTES = 1 << 20


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def read_json(path: str):  # noqa: ANN201 - whatever the file holds, or None
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: object, mode: int = 0o600) -> None:
    """Atomically: readers see the old file or the new one, whole."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


class Log:
    """watchdog.log: `<UTC time> <decision> <detail>` per line, kept under LOG_MAX_BYTES (one .1 kept)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, decision: str, detail: str) -> None:
        line = f"{utc_now()} {decision} {detail}\n"
        try:
            if os.path.getsize(self.path) > LOG_MAX_BYTES:
                os.replace(self.path, self.path + ".1")
        except OSError:
            pass  # no log yet: nothing to rotate
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError:
            sys.stderr.write(line)


def try_lock(paths: Paths):  # noqa: ANN201 - the open lock file, or None
    """The loop's lock file, held; None if another process holds it."""
    import fcntl

    try:
        handle = open(paths.lock, "a+")  # noqa: SIM115 - held for as long as the loop runs
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return handle


def running_pid(paths: Paths) -> int | None:
    """The pid of the loop holding the lock, or None when none runs."""
    if not os.path.exists(paths.lock):
        return None
    lock = try_lock(paths)
    if lock is not None:
        lock.close()
        return None
    try:
        return int(read_text(paths.pid))
    except ValueError:
        return -1  # held, pid file not written yet
