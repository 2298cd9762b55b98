"""Run one hostile-input case in a fresh interpreter under enforced limits (issue 29: "within 1 s and 100 MB").

The limits are the kernel's, not a stopwatch's: RLIMIT_CPU counts CPU seconds, so a loaded machine
makes the case slower in wall time without failing it; RLIMIT_AS caps the address space the case
may add. Both are set after `setup` (imports, building the input), so only the parser is measured.
The wall-clock timeout only stops a runaway child; it is far above the CPU limit.

`limits()` is the in-process form for fuzz tests, one input at a time: CPU time by ITIMER_PROF (a
signal after that much CPU, however loaded the machine) and the address space by lowering the soft
RLIMIT_AS for the duration (restored after; the hard limit is never touched).
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import resource, sys
{setup}
def _address_space():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
_ru = resource.getrusage(resource.RUSAGE_SELF)
# RLIMIT_CPU is whole seconds since the process started: one more than setup used, rounded up,
# plus the case's own allowance.
_cpu = int(_ru.ru_utime + _ru.ru_stime) + 1 + {cpu_s}
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
_mem = _address_space() + {mem_mb} * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
{action}
print("BOUNDED-CASE-DONE")
"""


def run_bounded(setup: str, action: str, *, cpu_s: int = 1, mem_mb: int = 100, wall_s: float = 120) -> str:
    """Run setup, then action under cpu_s CPU seconds and mem_mb MiB more address space; its stdout.

    Fails the test (AssertionError) if the child is killed by a limit or raises.
    """
    code = _CHILD.format(setup=textwrap.dedent(setup), action=textwrap.dedent(action), cpu_s=cpu_s, mem_mb=mem_mb)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=wall_s,
                          check=False)
    assert proc.returncode == 0 and "BOUNDED-CASE-DONE" in proc.stdout, (
        f"exit {proc.returncode} (negative: killed by that signal; -24 is SIGXCPU, the CPU limit)\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    )
    return proc.stdout


class OverLimit(AssertionError):
    """One input took more CPU than its limit allowed."""


def _address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextmanager
def limits(cpu_s: float = 1.0, mem_mb: int = 100) -> Iterator[None]:
    """Run the body under cpu_s CPU seconds (OverLimit) and mem_mb MiB more address space (MemoryError)."""

    # ITIMER_PROF counts the whole process's CPU; in a pytest-xdist worker other threads (fake
    # servers left by earlier tests, their tickers) share it. The limit is this thread's: when the
    # timer fires early because of them, it is set again for what this thread has left.
    started = time.thread_time()

    def over(signum: int, frame: object) -> None:
        used = time.thread_time() - started
        if used < cpu_s:
            signal.setitimer(signal.ITIMER_PROF, max(cpu_s - used, 0.01))
            return
        raise OverLimit(f"more than {cpu_s} CPU s for one input")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    ceiling = _address_space() + mem_mb * 1024 * 1024
    previous = signal.signal(signal.SIGPROF, over)
    resource.setrlimit(resource.RLIMIT_AS, (ceiling if hard == resource.RLIM_INFINITY else min(ceiling, hard), hard))
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGPROF, previous)
