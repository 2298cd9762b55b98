"""Detached jobs on a node through any Transport, driving templates/runner.sh."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

from cloudtrain import paths
from cloudtrain.errors import RemoteError
from cloudtrain.remote.transport import Transport

class JobState(StrEnum):
    """As templates/runner.sh reports it."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"  # the supervisor is gone without an exit code: the node rebooted or was killed


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.LOST})


@dataclass(frozen=True)
class NodeLayout:
    """Where cloudtrain's files live on a node: ~/.cloudtrain/<cluster>/..."""

    root: str

    @classmethod
    def for_cluster(cls, transport: Transport, cluster: str) -> NodeLayout:
        return cls(f"{transport.home}/.cloudtrain/{cluster}")

    @property
    def runner(self) -> str:
        return f"{self.root}/runtime/runner.sh"

    @property
    def runtime(self) -> str:
        return f"{self.root}/runtime"

    @property
    def workdir(self) -> str:
        return f"{self.root}/workdir"

    def job_dir(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}"


@dataclass(frozen=True)
class JobStatus:
    state: str  # pending | running | succeeded | failed | killed | lost
    pid: int | None
    exit_code: int | None
    started_at: float | None
    ended_at: float | None
    log_bytes: int

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def install_runtime(transport: Transport, layout: NodeLayout) -> None:
    runner = (paths.templates_dir() / "runner.sh").read_bytes()
    transport.put_file(runner, layout.runner, mode=0o755)


def env_script(env: Mapping[str, str]) -> bytes:
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    return ("\n".join(lines) + "\n").encode()


DEADLINE_ENV = "CLOUDTRAIN_DEADLINE_S"


def submit(transport: Transport, layout: NodeLayout, job_id: str, script: str, env: Mapping[str, str],
           deadline_s: float | None = None) -> int:
    """Write the job's files and start it detached; return its pid (process group id).

    `deadline_s` (default: the job's CLOUDTRAIN_DEADLINE_S, if set): the node ends the job after that
    many seconds (whole, rounded down) even if the CLI is gone; it then fails with exit code 124."""
    job_dir = layout.job_dir(job_id)
    deadline = _deadline(deadline_s if deadline_s is not None else env.get(DEADLINE_ENV))
    # env.sh may hold secrets from the recipe's envs: readable by the node's user only.
    transport.put_file(env_script({"CLOUDTRAIN_WORKDIR": layout.workdir, **env}), f"{job_dir}/env.sh", mode=0o600)
    # cmd.sh and the start in one round trip (the edit-run loop pays for every one). The script
    # starts only if all of it arrived: a pipe closed early (Ctrl-C, a dropped link) looks like a
    # short script to `cat`, and a truncated job must never run.
    body = script.encode()
    start = ('umask 077 && mkdir -p "$1" && cat > "$1/cmd.sh.part" && [ "$(wc -c < "$1/cmd.sh.part")" -eq "$3" ] '
             '&& mv "$1/cmd.sh.part" "$1/cmd.sh" && exec sh "$2" start "$1" "$4" "$5"')
    result = transport.run(["sh", "-c", start, "sh", job_dir, layout.runner, str(len(body)), str(KILL_GRACE_S),
                            str(deadline or "")], input=body, what="starting the job")
    try:
        return int(result.text.strip())
    except ValueError:
        raise RemoteError(f"{transport.label}: runner printed {result.text!r} instead of a pid") from None


def _deadline(value: float | str | None) -> int | None:
    """Whole seconds (at least 1) for the runner, or None for no deadline."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        from cloudtrain.errors import UsageError

        raise UsageError(f"{DEADLINE_ENV} must be a number of seconds, got {value!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        from cloudtrain.errors import UsageError

        raise UsageError(f"{DEADLINE_ENV} must be more than 0 seconds, got {value!r}")
    return max(1, int(seconds))


def status(transport: Transport, layout: NodeLayout, job_id: str) -> JobStatus:
    result = transport.run(["sh", layout.runner, "status", layout.job_dir(job_id)], what="checking the job's state")
    try:
        data = json.loads(result.text)
        return JobStatus(
            state=data["state"],
            pid=data["pid"],
            exit_code=data["exit_code"],
            started_at=data["started_at"],
            ended_at=data["ended_at"],
            log_bytes=int(data["log_bytes"]),
        )
    except (ValueError, RecursionError, KeyError, TypeError):  # the node's answer is data, never trusted
        raise RemoteError(f"{transport.label}: unreadable job status {result.text[:300]!r}") from None


# Seconds a job gets between TERM and KILL; the runner waits a little longer for the supervisor.
KILL_GRACE_S = 10


def kill(transport: Transport, layout: NodeLayout, job_id: str, grace_s: int = KILL_GRACE_S) -> None:
    """End the job and every process it started (TERM, then KILL after grace_s); idempotent."""
    transport.run(["sh", layout.runner, "kill", layout.job_dir(job_id), str(grace_s)], timeout=grace_s + 30,
                  what="stopping the job")


def kill_all(transport: Transport, layout: NodeLayout, grace_s: int = KILL_GRACE_S) -> None:
    """End every job of the cluster on this node (`down`, `cancel --all`)."""
    script = '[ -f "$1" ] || exit 0; exec sh "$1" kill-all "$2" "$3"'
    transport.run(["sh", "-c", script, "sh", layout.runner, f"{layout.root}/jobs", str(grace_s)], timeout=None,
                  what="stopping the cluster's jobs")


def stream_log(transport: Transport, layout: NodeLayout, job_id: str, offset: int) -> Iterator[bytes]:
    """The job's log from byte `offset`, as it is written, until the job is over (runner.sh follow)."""
    return transport.stream(["sh", layout.runner, "follow", layout.job_dir(job_id), str(offset)],
                            what="following the job log")


def read_log(transport: Transport, layout: NodeLayout, job_id: str, offset: int, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of the job's log starting at byte `offset` (empty when nothing new)."""
    log = f"{layout.job_dir(job_id)}/log"
    # tail -c +N is 1-based; head bounds one read so a huge log streams in chunks.
    script = 'f="$1"; [ -f "$f" ] || exit 0; tail -c +"$2" "$f" | head -c "$3"'
    result = transport.run(["sh", "-c", script, "sh", log, str(offset + 1), str(limit)], what="reading the job log")
    return result.stdout
