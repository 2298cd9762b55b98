"""Typed rows of the state database (one frozen dataclass per table) and the status enums."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ClusterStatus(StrEnum):
    PROVISIONING = "provisioning"
    UP = "up"
    STOPPED = "stopped"
    TERMINATED = "terminated"
    LAUNCH_FAILED = "launch-failed"  # cleanup could not reach the cloud: `down` or `gc` must finish it
    DOWN_FAILED = "down-failed"  # a node could not be cleaned: `down` again, or `down --forget`


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the job succeeded and its results and logs are home, verified
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"  # the `cloudtrain run` process died without finishing the row



@dataclass(frozen=True)
class ClusterRecord:
    name: str
    provider: str
    status: str
    region: str | None
    zone: str | None
    instance_type: str | None
    hourly_price: float
    num_nodes: int
    recipe_path: str | None
    recipe_digest: str | None
    owner: str
    created_at: float
    updated_at: float
    last_error: str | None
    spot: int = 0


@dataclass(frozen=True)
class NodeRecord:
    cluster: str
    rank: int
    instance_id: str
    state: str
    public_ip: str | None
    private_ip: str | None
    ssh_user: str | None
    ssh_port: int | None
    ssh_key: str | None
    proxy_command: str | None
    started_at: float | None


@dataclass(frozen=True)
class RunRecord:
    id: str
    cluster: str
    recipe_path: str | None
    recipe_digest: str | None
    run_dir: str | None
    status: str
    exit_code: int | None
    provider: str | None
    instance_type: str | None
    hourly_price: float
    cost_usd: float
    started_at: float
    ended_at: float | None
    pid: int | None = None
    result_paths: str | None = None  # JSON list, relative to the workdir
    error: str | None = None  # why the run failed (job, collect, teardown), one line

    def driver_alive(self) -> bool:
        """Whether the cloudtrain process that drives this run is still running on this machine."""
        if self.pid is None:
            return False
        import os

        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@dataclass(frozen=True)
class JobRecord:
    id: str
    cluster: str
    run_id: str | None
    job_dir: str
    status: str
    command: str | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None


@dataclass(frozen=True)
class BillingRecord:
    id: int
    cluster: str
    cloud: str
    instance_id: str
    kind: str  # "running" | "stopped"
    hourly_price: float  # USD per hour for this node in this state
    started_at: float
    ended_at: float | None  # None: still billing

    def cost(self, until: float, since: float = 0.0) -> float:
        """USD billed between `since` and `until` (clipped to this interval)."""
        start = max(self.started_at, since)
        end = min(self.ended_at if self.ended_at is not None else until, until)
        return max(0.0, end - start) * self.hourly_price / 3600.0


@dataclass(frozen=True)
class EventRecord:
    id: int
    ts: float
    cluster: str | None
    kind: str
    message: str


@dataclass(frozen=True)
class SweepRecord:
    id: str
    name: str
    recipe_path: str
    recipe_digest: str
    status: str  # running | stopping | done | stopped | failed
    pid: int | None  # the process driving it
    results_dir: str
    spec: str  # JSON: costs, limits, metric, goal (fixed when the sweep starts)
    created_at: float
    updated_at: float
    ended_at: float | None = None
    error: str | None = None
    next_slot: int = 0
    boot_failures: int = 0
    stop_reason: str | None = None
    ended_reason: str | None = None


@dataclass(frozen=True)
class SweepTrialRow:
    sweep: str
    number: int
    params: str  # JSON object
    state: str
    attempts: int
    failures: int
    value: float | None
    error: str | None
    created_at: float
    ended_at: float | None


@dataclass(frozen=True)
class SweepAttemptRow:
    sweep: str
    trial: int
    attempt: int
    vm: str
    started_at: float
    deadline_at: float
    hourly_usd: float
    state: str
    ended_at: float | None
    value: float | None
    error: str | None
    stopping: str | None


@dataclass(frozen=True)
class SweepVmRow:
    sweep: str
    id: str
    slot: int
    state: str
    hourly_usd: float
    launched_at: float
    lease_end: float
    ready_at: float | None
    release_at: float | None
    gone_at: float | None
    trial: int | None
    attempt: int | None
    runs: int
    error: str | None
