"""The sweep's records: trials, attempts, VMs and their states, the events the scheduler reads and
the actions it returns, and the interfaces it drives (sampler, journal, backend).

Plain frozen data; the rules that move them from state to state are the scheduler's (sweep/core.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from cloudtrain.budget import billed_usd

ParamValue = str | int | float | bool
Params = tuple[tuple[str, ParamValue], ...]
Clock = Callable[[], float]


class TrialState(StrEnum):
    PENDING = "pending"  # waiting for a VM: new, or to be retried
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of retries, or a final error (no metric)
    PRUNED = "pruned"  # stopped early: clearly losing
    TIMEOUT = "timeout"  # the job hit its hard deadline
    STOPPED = "stopped"  # the sweep ended (stop, budget, boot failures) before it finished


FINAL_TRIAL_STATES = frozenset({TrialState.SUCCEEDED, TrialState.FAILED, TrialState.PRUNED, TrialState.TIMEOUT,
                                TrialState.STOPPED})


class Outcome(StrEnum):
    """How one attempt ended."""

    RUNNING = "running"  # not ended yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    PRUNED = "pruned"
    STOPPED = "stopped"
    PREEMPTED = "preempted"  # its VM went away under it
    LOST = "lost"  # its outcome cannot be known (the node and its files are gone)
    NOT_STARTED = "not-started"  # provably never started its job (retried without counting)


class VmState(StrEnum):
    BOOTING = "booting"
    IDLE = "idle"
    BUSY = "busy"
    RELEASING = "releasing"  # asked to go, not yet confirmed gone
    RELEASE_FAILED = "release-failed"  # its release failed or was not confirmed: asked again
    GONE = "gone"  # confirmed gone by the cloud


@dataclass(frozen=True)
class Costs:
    """The money model, fixed when the sweep starts."""

    budget_usd: float
    hourly_usd: float  # the most a new VM (all its nodes) can cost per hour
    boot_s: float  # reserved for a new VM to be ready
    prep_s: float  # reserved per attempt before its job starts (sync, setup)
    deadline_s: float  # the job's hard deadline on the node
    post_s: float  # reserved per attempt after its job (collecting results)
    release_s: float  # reserved for tearing a VM down
    min_s: float = 0.0  # the cloud bills each VM start at least this long (AWS/GCP 60 s, Azure 300 s)

    @property
    def window_s(self) -> float:
        """What one attempt may take on a ready VM, at most."""
        return self.prep_s + self.deadline_s + self.post_s

    def usd(self, hourly_usd: float, seconds: float) -> float:
        """What one VM start billed for `seconds` costs: at least the cloud's minimum (the budget's
        own rule, budget.billed_usd: a VM whose minimum does not fit is never admitted)."""
        return billed_usd(hourly_usd, seconds, self.min_s)

    def new_vm_usd(self) -> float:
        """The worst-case cost of one trial on a VM booted for it."""
        return self.usd(self.hourly_usd, self.boot_s + self.window_s + self.release_s)


@dataclass(frozen=True)
class Limits:
    max_trials: int
    max_parallel: int
    max_retries: int = 1
    max_boot_failures: int = 3


@dataclass(frozen=True)
class Trial:
    number: int
    params: Params
    state: TrialState = TrialState.PENDING
    attempts: int = 0  # attempts started; the next one is attempts + 1
    failures: int = 0  # attempts that count against max_retries
    value: float | None = None
    error: str | None = None
    created_at: float = 0.0
    ended_at: float | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_TRIAL_STATES

    def param_dict(self) -> dict[str, ParamValue]:
        return dict(self.params)


@dataclass(frozen=True)
class Attempt:
    trial: int
    attempt: int
    vm: str
    started_at: float
    deadline_at: float  # the attempt is over by then (job deadline + reserved prep and collect)
    hourly_usd: float  # of its VM
    state: Outcome = Outcome.RUNNING
    ended_at: float | None = None
    value: float | None = None
    error: str | None = None
    stopping: str | None = None  # "pruned" | "stopped": the scheduler asked it to end

    @property
    def key(self) -> tuple[int, int]:
        return (self.trial, self.attempt)

    @property
    def running(self) -> bool:
        return self.state == Outcome.RUNNING

    def cost_usd(self, now: float) -> float:
        """VM time while this attempt held it (boot, idle and release time are the sweep's)."""
        end = self.ended_at if self.ended_at is not None else now
        return self.hourly_usd * max(0.0, end - self.started_at) / 3600.0


@dataclass(frozen=True)
class Vm:
    id: str
    slot: int  # the n-th VM of the sweep; names its cluster
    state: VmState
    hourly_usd: float
    launched_at: float
    lease_end: float  # gone by then, whatever happens
    ready_at: float | None = None
    release_at: float | None = None
    gone_at: float | None = None
    trial: int | None = None  # the attempt running on it
    attempt: int | None = None
    runs: int = 0  # attempts started on it
    error: str | None = None

    @property
    def live(self) -> bool:
        return self.state != VmState.GONE

    def bound_end(self) -> float:
        """The latest it can still be billed. Until the cloud confirms it gone that is its lease end,
        also while it is being released: a release may fail, or never be confirmed."""
        if self.state == VmState.GONE:
            return self.gone_at if self.gone_at is not None else self.launched_at
        return self.lease_end

    def worst_usd(self, costs: Costs) -> float:
        """The most it can cost: to its bound, at least the cloud's minimum per start."""
        return costs.usd(self.hourly_usd, self.bound_end() - self.launched_at)

    def billed_usd(self, now: float, costs: Costs) -> float:
        """What it cost until `now` (or until it went), at least the cloud's minimum per start."""
        end = self.gone_at if self.gone_at is not None else now
        return costs.usd(self.hourly_usd, end - self.launched_at)


@dataclass(frozen=True)
class Counters:
    next_slot: int = 0
    boot_failures: int = 0
    stop: str | None = None  # why the sweep was asked to stop
    ended: str | None = None  # why no more trials start: done | budget | stop | boot failures


@dataclass(frozen=True)
class Snapshot:
    """Everything the scheduler knows; what the journal holds."""

    trials: tuple[Trial, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    vms: tuple[Vm, ...] = ()
    counters: Counters = Counters()


# events: what the backend saw ----------------------------------------------------------------------


@dataclass(frozen=True)
class VmReady:
    vm: str
    at: float
    hourly_usd: float | None = None  # the price it really has, if known


@dataclass(frozen=True)
class VmFailed:
    """The VM could not be made ready; nothing of it is left (billed until `at`)."""

    vm: str
    at: float
    error: str


@dataclass(frozen=True)
class VmGone:
    """The VM is gone: released, preempted, or its lease ran out."""

    vm: str
    at: float
    reason: str = "released"


@dataclass(frozen=True)
class ReleaseFailed:
    """Taking the VM down failed, or the cloud still lists it afterwards. It may bill until its lease
    end (its watchdog deletes it then): it stays in the committed spend and its release is asked
    again. One that was still booting counts as a boot failure; an attempt on it ends as preempted."""

    vm: str
    at: float
    error: str


@dataclass(frozen=True)
class AttemptEnded:
    trial: int
    attempt: int
    at: float
    outcome: Outcome
    value: float | None = None  # the sweep metric, for a succeeded attempt
    error: str | None = None


@dataclass(frozen=True)
class Progress:
    """An intermediate value of the metric (per epoch), for early stopping."""

    trial: int
    attempt: int
    step: int
    value: float


@dataclass(frozen=True)
class StopRequested:
    reason: str = "stopped by the user"


Event = VmReady | VmFailed | VmGone | ReleaseFailed | AttemptEnded | Progress | StopRequested


# actions: what the backend must do ------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    vm: str
    slot: int
    ready_by: float  # give up booting then; the VM is gone by lease_end
    lease_end: float


@dataclass(frozen=True)
class Start:
    vm: str
    trial: int
    attempt: int
    params: Params
    job_start_by: float  # the job must have started by then (prep_s after the start), else fail it
    job_deadline_s: float  # the hard deadline the node gives the job
    deadline_at: float  # everything, collect included, is over by then
    lease_end: float


@dataclass(frozen=True)
class Cancel:
    vm: str
    trial: int
    attempt: int
    reason: str  # pruned | stopped


@dataclass(frozen=True)
class Release:
    """Take the VM down; answered by VmGone once the cloud confirms it, else ReleaseFailed. A Release
    asked again after a ReleaseFailed is a retry: the backend paces retries."""

    vm: str


Action = Launch | Start | Cancel | Release


class Sampler(Protocol):
    """Where trials come from (Optuna in the CLI, a seeded stub in tests)."""

    def capacity(self) -> int | None:
        """How many distinct trials it can give (a grid's size), None when unbounded."""

    def ask(self) -> tuple[int, Mapping[str, ParamValue]] | None:
        """A new trial's number and parameters; None when there are no more."""

    def report(self, trial: int, step: int, value: float) -> bool:
        """Record an intermediate value; True when the trial should be pruned."""

    def tell(self, trial: int, state: TrialState, value: float | None) -> None:
        """The trial ended for good (called again after a resume: must be idempotent)."""


class Journal(Protocol):
    def save(self, trials: Sequence[Trial], attempts: Sequence[Attempt], vms: Sequence[Vm],
             counters: Counters | None) -> None:
        """Persist changed records atomically (counters None: unchanged)."""


class Backend(Protocol):
    """Carries out the scheduler's actions and reports what happens. Never blocks in an action."""

    def launch(self, action: Launch) -> None: ...

    def run(self, action: Start) -> None: ...

    def cancel(self, action: Cancel) -> None: ...

    def release(self, action: Release) -> None: ...

    def events(self, timeout_s: float) -> list[Event]:
        """What happened since the last call; waits up to timeout_s for something."""

    def recover(self, snapshot: Snapshot) -> list[Event]:
        """After a restart: what happened to the snapshot's VMs and attempts while no one watched."""
