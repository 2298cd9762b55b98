"""Typed rows of the state database (one frozen dataclass per table) and the status enums."""

from __future__ import annotations

import math

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
    INTERRUPTED = "interrupted"  # Ctrl-C, `kill` or a closed terminal of the `cloudtrain run` itself
    CANCELLED = "cancelled"  # its job was killed from outside (`cancel`, `down` elsewhere, a scheduler)
    ABANDONED = "abandoned"  # the `cloudtrain run` process died without finishing the row


class BillKind(StrEnum):
    """What a billed interval pays for. Compute bills while the machine runs (per start, with the
    cloud's minimum); its disks bill from creation to deletion, running or stopped."""

    RUNNING = "running"  # compute, at the placement's price
    DISK = "disk"  # the node's disks, at the storage price, for as long as they exist
    STOPPED = "stopped"  # before v5: disks while stopped only (kept for old rows)


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
    # The incarnation: a new cluster of a reused name gets a new uid and a clean history.
    uid: str | None = None
    # While provisioning: the process launching it (procid.identity) and its last heartbeat.
    driver: str | None = None
    heartbeat_at: float | None = None
    # The latest moment its machines can live: the launch request's deadline (None: none given).
    deadline_at: float | None = None

    def launch_in_flight(self, now: float, stale_s: float = 120.0) -> bool:
        """Whether a live process is creating this cluster right now (another terminal's `up`):
        `gc` and `down` of other terminals must not take it for a leak."""
        if self.status != ClusterStatus.PROVISIONING or not self.driver:
            return False
        from cloudtrain import procid

        if procid.alive(self.driver):
            return True
        return self.heartbeat_at is not None and now - self.heartbeat_at < stale_s and not _same_machine(self.driver)


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
    incarnation: str | None = None
    driver: str | None = None  # procid.identity() of the `cloudtrain run` process

    def driver_alive(self) -> bool:
        """Whether the cloudtrain process that drives this run is still running on this machine:
        the same boot, pid and start time (a reused pid after a reboot is somebody else)."""
        from cloudtrain import procid

        return procid.alive(self.driver, self.pid)


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
    incarnation: str | None = None


@dataclass(frozen=True)
class BillingRecord:
    id: int
    cluster: str
    cloud: str
    instance_id: str
    kind: str  # BillKind
    hourly_price: float  # USD per hour for this node in this state
    started_at: float
    ended_at: float | None  # None: still billing
    incarnation: str | None = None
    min_s: float = 0.0  # the cloud bills at least this long per start (AWS/GCP 60 s, Azure 300 s)
    source: str | None = None  # where started_at came from (reconcile.Source)

    def billed_by(self, t: float) -> float:
        """Seconds billed from the start up to `t`. The start is billed at least `min_s` the moment
        it happens (the cloud charges it even if the machine goes within a second), then by the
        second once the machine has run longer than that."""
        if t <= self.started_at:  # windows are (since, until]: one starting at the start holds it
            return 0.0
        end = self.ended_at if self.ended_at is not None else t
        return max(min(t, end) - self.started_at, self.min_s)

    def billed_seconds(self, until: float, since: float = 0.0) -> float:
        """Seconds billed between `since` and `until`: additive, so that windows that split a
        period (the runs on one cluster) add up to the period's bill. The minimum belongs to the
        window holding the start; a window after it pays only the time beyond the minimum. Ledger
        times are whole seconds (a start at 100.9 is booked at 100): a window from 100.6 holds it."""
        return max(0.0, self.billed_by(until) - self.billed_by(math.floor(since)))

    def cost(self, until: float, since: float = 0.0) -> float:
        """USD billed between `since` and `until`."""
        return self.billed_seconds(until, since) * self.hourly_price / 3600.0


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


def _same_machine(driver: str) -> bool:
    from cloudtrain import procid

    parsed = procid.parse(driver)
    return parsed is not None and bool(parsed[0]) and parsed[0] == procid.boot_id()
