"""Process identity beyond a bare pid: (boot id, pid, start time).

A pid alone lies after a reboot (the same small pids come back) or once the kernel reuses it: a run
row whose driver died would read as "busy" forever, and a signal meant for it could reach a
stranger. All three together name one process for as long as this machine has been up.
On systems without /proc (macOS) the boot id and start time are unknown and only the pid is
compared, the best those systems allow without a subprocess.

One implementation for this machine's processes and a node's job supervisors (runner.sh writes the
same `boot:pid:start`): cloudtrain/node/jobs.py, read here.
"""

from __future__ import annotations

from cloudtrain.node import jobs as _jobs


def boot_id() -> str:
    return _jobs.boot_id()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    return _jobs.start_ticks(pid)


def identity(pid: int | None = None) -> str:
    """`boot:pid:start` of `pid` (default: this process)."""
    return _jobs.identity(pid)


def parse(value: str) -> tuple[str, int, int | None] | None:
    return _jobs.parse(value)


def alive(value: str | None, pid: int | None = None) -> bool:
    """Whether the process named by `value` (from `identity()`) still runs on this machine. Rows
    written before identities existed carry only a pid: then the pid alone is checked."""
    return _jobs.alive(value, pid)
