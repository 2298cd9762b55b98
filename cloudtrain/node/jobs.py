"""Job state and process identity, as templates/runner.sh's files say (one rule, three readers:
`runner.sh status` on the node, the watchdog here, the laptop's run/jobstate.py for local nodes).

Process identity beyond a bare pid: (boot id, pid, start time), written BOOT:PID:TICKS. A pid alone
lies after a reboot (the same small pids come back) or once the kernel reuses it: a job whose
supervisor died would read as running forever, and a signal meant for it could reach a stranger.
All three together name one process for as long as the machine has been up. Without /proc (macOS,
for the laptop's own processes) the boot id and start time are unknown and only the pid is compared.

A job's state: exit_code present means over (succeeded, killed: cancelled or 143, else failed); no
pid yet means pending; a supervisor that lives (its identity matching) means running; else lost.
Whether the supervisor lives is asked before exit_code is read: it writes exit_code, then exits.
"""

from __future__ import annotations

import json
import os
import subprocess

from .protocol import (
    JOB_CANCELLED,
    JOB_ENDED_AT,
    JOB_EXIT_CODE,
    JOB_IDENTITY,
    JOB_PID,
    KILLED_BY_TERM,
    JobState,
    Paths,
)

PROC = "/proc"
PENDING_GRACE_S = 120.0  # a job dir without a pid counts as "starting" this long


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


# ------------------------------------------------------------------------------------ process identity


def boot_id() -> str:
    """This boot of the machine ("" without /proc): a monotonic reading means nothing after a reboot."""
    return _read(os.path.join(PROC, "sys/kernel/random/boot_id")) or ""


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 on (the command name, field 2, may hold spaces and parentheses:
    split after its last ')'); [] where there is no /proc or no such process."""
    return (_read(os.path.join(PROC, str(pid), "stat")) or "").rsplit(")", 1)[-1].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def identity(pid: int | None = None) -> str:
    """`boot:pid:start` of `pid` (default: this process), as runner.sh's proc_identity writes it."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    return "{}:{}:{}".format(boot_id(), pid, "" if ticks is None else ticks)


def parse(value: str) -> tuple[str, int, int | None] | None:
    """(boot, pid, ticks or None) of an identity, or None where it is not one."""
    parts = value.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2]) if parts[2].isdigit() else None


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    fields = _stat_fields(pid)
    return not fields or fields[0] != "Z"  # a zombie has ended; only its exit status is left


def alive(value: str | None, pid: int | None = None) -> bool:
    """Whether the process named by `value` (from `identity()`) still runs on this machine. Records
    written before identities existed carry only a pid: then the pid alone is checked."""
    if not value:
        return pid is not None and pid_exists(pid)
    parsed = parse(value)
    if parsed is None:
        return False
    boot, pid_, ticks = parsed
    here = boot_id()
    if boot and here and boot != here:
        return False  # recorded before this machine last booted
    if not pid_exists(pid_):
        return False
    if ticks is None:
        return True
    now = start_ticks(pid_)
    return now is None or now == ticks


# ------------------------------------------------------------------------------------ job state


class JobView:
    """One job as its files say: state, exit code, end time (whole epoch seconds)."""

    __slots__ = ("state", "exit_code", "ended_at")

    def __init__(self, state: JobState, exit_code: int | None = None, ended_at: float | None = None) -> None:
        self.state, self.exit_code, self.ended_at = state, exit_code, ended_at

    def __repr__(self) -> str:
        return f"JobView({self.state.value}, exit_code={self.exit_code}, ended_at={self.ended_at})"


def ended(job_dir: str) -> JobView | None:
    """The job as its exit_code says it ended; None while there is none."""
    code_text = _read(os.path.join(job_dir, JOB_EXIT_CODE))
    if not code_text:
        return None
    code = int(code_text) if code_text.lstrip("-").isdigit() else None
    if code == 0:
        state = JobState.SUCCEEDED
    elif os.path.exists(os.path.join(job_dir, JOB_CANCELLED)) or code == KILLED_BY_TERM:
        state = JobState.KILLED
    else:
        state = JobState.FAILED
    text = _read(os.path.join(job_dir, JOB_ENDED_AT)) or ""
    return JobView(state, code, float(text) if text.isdigit() else None)


def supervisor_alive(pid: int, job_dir: str) -> bool:
    """The job's supervisor, `pid`, still runs: a pid that lives but is another process now (reused
    after a reboot) is not it (its recorded identity says so)."""
    return alive(_read(os.path.join(job_dir, JOB_IDENTITY)), pid)


def read_job(job_dir: str) -> JobView:
    """The job's state from its files, as `runner.sh status` reads them."""
    pid_text = _read(os.path.join(job_dir, JOB_PID)) or ""
    # Asked before exit_code is read: read the other way round, a job ending between the reads is "lost".
    live = pid_text.isdigit() and supervisor_alive(int(pid_text), job_dir)
    done = ended(job_dir)
    if done is not None:
        return done
    if not pid_text:
        return JobView(JobState.PENDING)
    return JobView(JobState.RUNNING if live else JobState.LOST)


def job_state(job_dir: str, runner: str) -> JobState:
    """The job's state: `runner.sh status` where the runner is installed, else read here (the same rule)."""
    done = ended(job_dir)
    if done is not None:
        return done.state  # exit_code is written last: the job and everything it started are over
    if os.path.exists(runner):
        try:
            out = subprocess.run(["sh", runner, "status", job_dir], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, timeout=30, check=False).stdout
            return JobState(json.loads(out.decode("utf-8", "replace"))["state"])
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            pass  # no answer from the runner: read the files here
    return read_job(job_dir).state


def observe_jobs(paths: Paths, now: float) -> dict:
    """Job ids of this cluster on this node by what they count for: all, running, starting, over."""
    found = {"all": [], "running": [], "starting": [], "over": []}  # type: dict
    try:
        names = sorted(os.listdir(paths.jobs))
    except OSError:
        return found
    for name in names:
        job_dir = os.path.join(paths.jobs, name)
        if not os.path.isdir(job_dir):
            continue
        found["all"].append(name)
        state = job_state(job_dir, paths.runner)
        if state.over:
            found["over"].append(name)
        elif state == JobState.RUNNING:
            found["running"].append(name)
        elif state == JobState.PENDING:
            # Being started right now; a start that failed must not keep the machine up forever.
            try:
                age = now - os.stat(job_dir).st_mtime
            except OSError:
                continue
            if age < PENDING_GRACE_S:
                found["starting"].append(name)
    return found
