"""Slurm job states, as `scontrol show job` reports them, and what each means for cloudtrain.

One table: the run's job state (JobState), the exit code the job ends with (the submit script on
the login node exits with it, so `run`, `logs -f` and run.json see it), and a plain meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from cloudtrain.remote.jobs import JobState


class SlurmState(StrEnum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    DEADLINE = "DEADLINE"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    BOOT_FAIL = "BOOT_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"


@dataclass(frozen=True)
class Meaning:
    job_state: JobState
    # The exit code a job that ended so gets; None: the job's own (ExitCode=X:Y from Slurm).
    exit_code: int | None
    words: str

    @property
    def terminal(self) -> bool:
        return self.job_state not in (JobState.PENDING, JobState.RUNNING)


_RUNNING = Meaning(JobState.RUNNING, None, "running")
MEANINGS: dict[SlurmState, Meaning] = {
    SlurmState.PENDING: Meaning(JobState.PENDING, None, "waiting in the queue"),
    SlurmState.CONFIGURING: Meaning(JobState.RUNNING, None, "nodes allocated, booting"),
    SlurmState.RUNNING: _RUNNING,
    SlurmState.COMPLETING: Meaning(JobState.RUNNING, None, "finishing"),
    SlurmState.SUSPENDED: Meaning(JobState.RUNNING, None, "suspended by the scheduler"),
    SlurmState.REQUEUED: Meaning(JobState.PENDING, None, "requeued"),
    SlurmState.RESIZING: _RUNNING,
    SlurmState.SIGNALING: _RUNNING,
    SlurmState.STAGE_OUT: Meaning(JobState.RUNNING, None, "staging out"),
    SlurmState.COMPLETED: Meaning(JobState.SUCCEEDED, 0, "completed"),
    SlurmState.FAILED: Meaning(JobState.FAILED, None, "failed"),
    # The runner's own deadline ends a job with 124 too (remote/jobs.py): one code for "out of time".
    SlurmState.TIMEOUT: Meaning(JobState.FAILED, 124, "time limit reached"),
    SlurmState.DEADLINE: Meaning(JobState.FAILED, 124, "deadline reached"),
    SlurmState.CANCELLED: Meaning(JobState.KILLED, 143, "cancelled"),
    SlurmState.PREEMPTED: Meaning(JobState.KILLED, 143, "preempted by the scheduler"),
    SlurmState.NODE_FAIL: Meaning(JobState.LOST, 1, "a node of the allocation failed"),
    SlurmState.BOOT_FAIL: Meaning(JobState.LOST, 1, "a node failed to boot"),
    SlurmState.OUT_OF_MEMORY: Meaning(JobState.FAILED, 137, "out of memory"),
}

# Why a job waits, in words, for the reasons users meet most (squeue's REASON column).
PENDING_REASONS = {
    "Resources": "the nodes it needs are busy",
    "Priority": "jobs of higher priority are ahead of it",
    "Dependency": "it waits for another job",
    "PartitionDown": "its partition is down",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit is above its partition's",
    "QOSMaxJobsPerUserLimit": "its QOS's per-user job limit is reached",
    "AssocGrpGRES": "its account's GPU limit is reached",
    "ReqNodeNotAvail": "a node it needs is unavailable",
    "BeginTime": "its start time has not come",
}


def meaning(state: str) -> Meaning | None:
    """What a state (as Slurm writes it; 'CANCELLED by 0' reads as CANCELLED) means; None: unknown."""
    head = state.split()[0] if state.strip() else ""
    try:
        return MEANINGS[SlurmState(head)]
    except ValueError:
        return None


def exit_code(state: str, slurm_exit: str) -> int:
    """The exit code of a job that ended in `state` with Slurm's ExitCode `X:Y` (code:signal)."""
    known = meaning(state)
    if known is not None and known.exit_code is not None:
        return known.exit_code
    match = re.fullmatch(r"(\d+):(\d+)", slurm_exit.strip())
    code, sig = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    return code or (128 + sig if sig else 1)


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol -o show job ID` (one line of Key=Value) as a dict."""
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", text))


def describe_pending(reason: str) -> str:
    words = PENDING_REASONS.get(reason)
    return f"{reason} ({words})" if words else reason


def shell_table() -> str:
    """The state -> exit code table for templates/slurm_submit.sh: `STATE=CODE ...` (`-`: the job's
    own code), terminal states only. Generated here, so the shell and the enum never disagree."""
    return " ".join(f"{s.value}={'-' if m.exit_code is None else m.exit_code}"
                    for s, m in MEANINGS.items() if m.terminal)


def shell_reasons() -> str:
    """PENDING_REASONS for the submit script: one `Reason=words` per line."""
    return "\n".join(f"{k}={v}" for k, v in PENDING_REASONS.items())
