"""Process identity beyond a bare pid: (boot id, pid, start time).

A pid alone lies after a reboot (the same small pids come back) or once the kernel reuses it: a run
row whose driver died would read as "busy" forever, and a signal meant for it could reach a
stranger. All three together name one process for as long as this machine has been up.
On systems without /proc (macOS) the boot id and start time are unknown and only the pid is
compared, the best those systems allow without a subprocess.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def boot_id() -> str:
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 on (the command name, field 2, may hold spaces and parentheses:
    split after its last ')'); [] where there is no /proc or no such process."""
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def identity(pid: int | None = None) -> str:
    """`boot:pid:start` of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    return f"{boot_id()}:{pid}:{'' if ticks is None else ticks}"


def parse(value: str) -> tuple[str, int, int | None] | None:
    parts = value.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2]) if parts[2].isdigit() else None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    fields = _stat_fields(pid)
    return not fields or fields[0] != "Z"  # a zombie has ended; only its exit status is left


def alive(value: str | None, pid: int | None = None) -> bool:
    """Whether the process named by `value` (from `identity()`) still runs on this machine. Rows
    written before identities existed carry only a pid: then the pid alone is checked."""
    if not value:
        return pid is not None and _pid_exists(pid)
    parsed = parse(value)
    if parsed is None:
        return False
    boot, pid_, ticks = parsed
    here = boot_id()
    if boot and here and boot != here:
        return False  # recorded before this machine last booted
    if not _pid_exists(pid_):
        return False
    if ticks is None:
        return True
    now = start_ticks(pid_)
    return now is None or now == ticks
