"""An in-memory world for the scheduler: VMs, trials and a clock, all simulated.

`SimWorld` is a `Backend` driven by a discrete-event queue on a `SimClock`: VMs boot (or fail to),
get preempted, end at their lease (what the on-VM watchdog guarantees); attempts take random
setup, training and collect times, fail, time out, report per-epoch progress and can be cancelled.
It keeps the ground truth (what really ran, what was really billed) apart from what the scheduler
believes, and records every broken promise in `violations`: an attempt started twice, two attempts
of one trial at once, an attempt after the trial ended for good. `simulate` runs a whole sweep with
CLI crashes (the scheduler thrown away, the world going on, a new scheduler resumed from the
journal). The property test and benchmarks/sweep_overhead.py use it.

The world can lie the way clouds do (Scenario's `release_fail_p`, `release_stuck_p`,
`describe_lag`, `preempt_p`, and crashes while VMs boot): a release fails (or, for a stuck VM,
always fails: the VM then runs to its lease end), a VM vanishes under a trial, the cloud goes on
listing a VM that is gone for a while. Like the real backend, it tells the scheduler a VM is gone
only once the cloud says so, with the time the cloud says it went, and keeps a ledger of billed
intervals (`SimLedger`, a `BillingSource`) from those observations alone: what the sweep reports as
spent is `cloudtrain.sweep.ledger` over it, the code `sweep status` runs over the state database.
"""

from __future__ import annotations

import heapq
import random
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from cloudtrain.state.records import BillingRecord
from cloudtrain.sweep.core import Scheduler, execute
from cloudtrain.sweep.ledger import cluster_name, sweep_spend
from cloudtrain.sweep.model import (
    Action, Attempt, AttemptEnded, Cancel, Costs, Counters, Event, Launch, Limits, Outcome, ParamValue,
    Progress, Release, ReleaseFailed, Snapshot, Start, Trial, TrialState, Vm, VmFailed, VmGone, VmReady,
)

SIM_SWEEP = "sim"


class SimStuck(AssertionError):
    """The scheduler waits for something while nothing can happen any more."""


class SimClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Scenario:
    """The world's odds. Times are ranges (low, high) in seconds, drawn uniformly."""

    seed: int = 0
    price_share: tuple[float, float] = (0.5, 1.0)  # a VM's real price / the quote
    boot: tuple[float, float] = (30.0, 120.0)
    boot_fail_p: float = 0.0
    prep: tuple[float, float] = (5.0, 60.0)
    job: tuple[float, float] = (60.0, 600.0)
    post: tuple[float, float] = (2.0, 30.0)  # at most costs.post_s is used
    release: tuple[float, float] = (5.0, 60.0)  # how long one release call takes until the VM is gone
    fail_p: float = 0.0
    preempt_p: float = 0.0  # per VM: it vanishes at a random time in its first two trial windows
    kill_s: float = 10.0  # a cancelled job ends within this
    epochs: int = 3  # progress reports per attempt
    # The lies:
    release_fail_p: float = 0.0  # one release call fails (the VM stays)
    release_stuck_p: float = 0.0  # per VM: every release call fails; it goes at its lease end
    describe_lag: tuple[float, float] = (0.0, 0.0)  # per VM: listed as running this long after it went
    retry_s: float = 60.0  # the backend's wait before it asks again for a release that failed


@dataclass
class _SimVm:
    id: str
    slot: int
    price: float
    launched_at: float
    lease_end: float
    lag: float  # the cloud lists it this long after it went
    stuck: bool  # every release fails
    ready_at: float | None = None
    gone_at: float | None = None
    gone_why: str = "released"
    boot_error: str | None = None  # its boot was given up
    releasing: bool = False  # a release call is in flight
    release_failures: int = 0
    confirmed: bool = False  # the backend saw it gone (ledger closed, scheduler told)
    busy: tuple[int, int] | None = None


@dataclass
class _SimAttempt:
    key: tuple[int, int]
    vm: str
    started_at: float
    end_at: float
    outcome: Outcome
    value: float | None
    token: int = 0
    ended_at: float | None = None


def _default_value(params: Mapping[str, ParamValue]) -> float:
    """A deterministic metric in [0, 1) for any parameters."""
    return (zlib.crc32(repr(sorted(params.items())).encode()) % 10_000) / 10_000


class SimLedger:
    """The billed intervals the backend learnt from the cloud (what lifecycle writes in state): opened
    at the launch, closed at the time the cloud says the VM went, once the backend has seen it go."""

    def __init__(self) -> None:
        self.rows: dict[str, BillingRecord] = {}

    def open(self, vm: _SimVm, min_s: float) -> None:
        self.rows[vm.id] = BillingRecord(id=len(self.rows) + 1, cluster=cluster_name(SIM_SWEEP, vm.slot),
                                         cloud="sim", instance_id=vm.id, kind="running", hourly_price=vm.price,
                                         started_at=vm.launched_at, ended_at=None, incarnation=f"{vm.id}-uid",
                                         min_s=min_s, source="verb")

    def close(self, vm: _SimVm, at: float) -> None:
        self.rows[vm.id] = replace(self.rows[vm.id], ended_at=at, source="cloud")

    def billing(self, cluster: str | None = None, since: float = 0.0,
                incarnation: str | None = None) -> list[BillingRecord]:
        return [r for r in self.rows.values()
                if (cluster is None or r.cluster == cluster) and (incarnation is None or r.incarnation == incarnation)
                and (r.ended_at is None or max(r.ended_at, r.started_at + r.min_s) > since)]


class SimWorld:
    """A Backend over simulated VMs; see the module docstring."""

    def __init__(self, costs: Costs, scenario: Scenario, clock: SimClock,
                 value_of: Callable[[Mapping[str, ParamValue]], float] | None = None) -> None:
        self.costs = costs
        self.s = scenario
        self.clock = clock
        self.rng = random.Random(scenario.seed)
        self.value_of = value_of or _default_value
        self.vms: dict[str, _SimVm] = {}
        self.attempts: dict[tuple[int, int], _SimAttempt] = {}
        self.running_trials: dict[int, tuple[int, int]] = {}
        self.finished_trials: set[int] = set()
        self.violations: list[str] = []
        self.lies: dict[str, int] = {}  # how often each lie was told (the property test's statistics)
        self.ledger = SimLedger()
        self.listening = True
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._outbox: list[Event] = []

    # the truth, and what is reported ----------------------------------------------------------------

    def spent_usd(self) -> float:
        """Ground truth: each VM from its launch until it really went, at least the cloud's minimum."""
        # The cloud's rule, computed here on its own (not by the scheduler's Costs.usd it checks).
        return sum(v.price * max((v.gone_at if v.gone_at is not None else self.clock.now) - v.launched_at,
                                 self.costs.min_s) / 3600.0 for v in self.vms.values())

    def reported_usd(self) -> float:
        """What the sweep reports: the ledger, through the code `sweep status` uses."""
        vms = [(v.id, v.slot) for v in self.vms.values()]
        return sweep_spend(self.ledger, SIM_SWEEP, vms, self.clock.now).usd

    def alive(self) -> list[str]:
        return [v.id for v in self.vms.values() if v.gone_at is None]

    def unconfirmed(self) -> list[str]:
        return [v.id for v in self.vms.values() if not v.confirmed]

    # Backend ---------------------------------------------------------------------------------------

    def launch(self, action: Launch) -> None:
        now = self.clock.now
        if action.vm in self.vms:
            self.violations.append(f"VM {action.vm} launched twice")
            return
        price = self.costs.hourly_usd * self.rng.uniform(*self.s.price_share)
        vm = _SimVm(action.vm, int(action.vm.lstrip("v")), price, now, action.lease_end,
                    lag=self.rng.uniform(*self.s.describe_lag), stuck=self.rng.random() < self.s.release_stuck_p)
        self.vms[vm.id] = vm
        self.ledger.open(vm, self.costs.min_s)
        if self.rng.random() < self.s.boot_fail_p:
            at = min(now + self.rng.uniform(0, self.s.boot[1]), action.ready_by)
            self._at(at, lambda: self._boot_failed(vm, "boot failed"))
        else:
            ready = now + self.rng.uniform(*self.s.boot)
            if ready >= action.ready_by:
                self._at(action.ready_by, lambda: self._boot_failed(vm, "not ready in time"))
            else:
                self._at(ready, lambda: self._ready(vm))
                if self.rng.random() < self.s.preempt_p:
                    self._at(ready + self.rng.uniform(0, 2 * self.costs.window_s),
                             lambda: self._gone(vm, "preempted"))
        # The lease is in the launch request: the VM goes by then, whatever the CLI does.
        self._at(vm.lease_end, lambda: self._lease_check(vm))

    def run(self, action: Start) -> None:
        now = self.clock.now
        key = (action.trial, action.attempt)
        vm = self.vms.get(action.vm)
        if key in self.attempts:
            self.violations.append(f"attempt {key} started twice")
            return
        if vm is not None and vm.gone_at is not None:
            # Its VM vanished and the cloud may still list it: the attempt cannot start, and the
            # backend says so when the cloud says the VM is gone (asked when SSH fails), then the VM.
            not_started = AttemptEnded(action.trial, action.attempt, now, Outcome.NOT_STARTED, error="VM gone")
            self._at(vm.gone_at + vm.lag, lambda: self._emit(replace(not_started, at=self.clock.now)))
            self._confirm(vm)
            return
        if vm is None or vm.ready_at is None or vm.busy is not None:
            self.violations.append(f"attempt {key} started on VM {action.vm}, which is not ready or busy")
            self._emit(AttemptEnded(action.trial, action.attempt, now, Outcome.NOT_STARTED, error="VM not usable"))
            return
        if action.trial in self.running_trials:
            self.violations.append(f"trial {action.trial} attempt {action.attempt} started while attempt "
                                   f"{self.running_trials[action.trial]} runs")
        if action.trial in self.finished_trials:
            self.violations.append(f"trial {action.trial} started again after it ended for good")
        vm.lease_end = max(vm.lease_end, action.lease_end)
        self._at(vm.lease_end, lambda: self._lease_check(vm))
        prep = self.rng.uniform(*self.s.prep)
        value = None
        if now + prep > action.job_start_by:
            end, outcome = action.job_start_by, Outcome.FAILED
        else:
            job_start = now + prep
            length = self.rng.uniform(*self.s.job)
            if self.rng.random() < self.s.fail_p:
                end, outcome = job_start + self.rng.uniform(0, min(length, action.job_deadline_s)), Outcome.FAILED
            elif length > action.job_deadline_s:
                end, outcome = job_start + action.job_deadline_s, Outcome.TIMEOUT
            else:
                end, outcome = job_start + length, Outcome.SUCCEEDED
                value = self.value_of(dict(action.params))
            end += min(self.rng.uniform(*self.s.post), self.costs.post_s)
            for epoch in range(1, self.s.epochs + 1):
                at = job_start + length * epoch / (self.s.epochs + 1)
                if at < end:
                    guess = self.value_of(dict(action.params)) * epoch / self.s.epochs
                    self._at(at, lambda e=epoch, g=guess: self._progress(key, e, g))
        end = min(end, action.deadline_at)
        attempt = _SimAttempt(key, vm.id, now, end, outcome, value)
        self.attempts[key] = attempt
        vm.busy = key
        self.running_trials[action.trial] = key
        self._schedule_end(attempt)

    def cancel(self, action: Cancel) -> None:
        attempt = self.attempts.get((action.trial, action.attempt))
        if attempt is None or attempt.ended_at is not None:
            return
        end = min(self.clock.now + self.rng.uniform(0, self.s.kill_s), attempt.end_at)
        if end < attempt.end_at:
            attempt.end_at, attempt.outcome, attempt.value = end, Outcome.STOPPED, None
            self._schedule_end(attempt)

    def release(self, action: Release) -> None:
        vm = self.vms.get(action.vm)
        if vm is None:
            self._emit(VmGone(action.vm, self.clock.now, "never launched"))
            return
        if vm.releasing:
            return  # its answer comes
        if vm.gone_at is not None:
            self._confirm(vm)
            return
        vm.releasing = True
        # A retry after a failure waits a while (the backend paces them); the call itself takes time.
        wait = self.s.retry_s if vm.release_failures else 0.0
        self._at(self.clock.now + wait + self.rng.uniform(*self.s.release), lambda: self._release_answered(vm))

    def events(self, timeout_s: float) -> list[Event]:
        if not self._outbox:
            self._advance_one()
        out, self._outbox = self._outbox, []
        return out

    def recover(self, snapshot: Snapshot) -> list[Event]:
        """What the real backend does after a restart: the journal's attempts from what ran, the
        journal's VMs from what the cloud lists now (lagging as it does)."""
        now = self.clock.now
        events: list[Event] = []
        for a in snapshot.attempts:
            if not a.running:
                continue
            truth = self.attempts.get(a.key)
            if truth is None:
                events.append(AttemptEnded(a.trial, a.attempt, now, Outcome.NOT_STARTED, error="never started"))
            elif truth.ended_at is not None:
                events.append(AttemptEnded(a.trial, a.attempt, truth.ended_at, truth.outcome, truth.value))
        for v in snapshot.vms:
            if not v.live:
                continue
            truth_vm = self.vms.get(v.id)
            if truth_vm is None:
                events.append(VmFailed(v.id, v.launched_at, "never launched"))
            elif truth_vm.gone_at is not None and now >= truth_vm.gone_at + truth_vm.lag:
                events.append(self._confirmed_event(truth_vm))
            elif truth_vm.gone_at is not None:
                self._confirm(truth_vm)  # the cloud still lists it: asked again until it says gone
            elif truth_vm.boot_error is not None and not truth_vm.releasing:
                self._take_down(truth_vm)  # a boot given up whose cleanup failed: again
            elif truth_vm.ready_at is not None and truth_vm.boot_error is None:
                events.append(VmReady(v.id, truth_vm.ready_at, truth_vm.price))
        return events

    # crashes ---------------------------------------------------------------------------------------

    def crash(self) -> None:
        """The CLI dies: what it has not read is lost; the world goes on without it."""
        if any(v.ready_at is None and v.gone_at is None for v in self.vms.values()):
            self._lie("CLI died while a VM booted")
        self.listening = False
        self._outbox = []

    def advance(self, seconds: float) -> None:
        until = self.clock.now + seconds
        while self._heap and self._heap[0][0] <= until:
            self._advance_one()
        self.clock.now = max(self.clock.now, until)
        self._outbox = []

    def revive(self) -> None:
        self.listening = True

    # the event queue -------------------------------------------------------------------------------

    def _at(self, at: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(at, self.clock.now), self._seq, fn))

    def _advance_one(self) -> None:
        if not self._heap:
            raise SimStuck("the scheduler waits, but nothing can happen any more")
        at, _, fn = heapq.heappop(self._heap)
        self.clock.now = max(self.clock.now, at)
        fn()
        while self._heap and self._heap[0][0] <= self.clock.now:
            _, _, fn = heapq.heappop(self._heap)
            fn()

    def _lie(self, what: str) -> None:
        self.lies[what] = self.lies.get(what, 0) + 1

    def _emit(self, event: Event) -> None:
        if self.listening:
            self._outbox.append(event)

    # VMs -------------------------------------------------------------------------------------------

    def _ready(self, vm: _SimVm) -> None:
        if vm.gone_at is not None or vm.boot_error is not None or vm.ready_at is not None:
            return
        vm.ready_at = self.clock.now
        if not vm.releasing:
            self._emit(VmReady(vm.id, vm.ready_at, vm.price))

    def _boot_failed(self, vm: _SimVm, why: str) -> None:
        if vm.gone_at is None and vm.ready_at is None and vm.boot_error is None:
            vm.boot_error = why
            if not vm.releasing:
                self._take_down(vm)

    def _take_down(self, vm: _SimVm) -> None:
        """The backend takes down what a boot it gave up left (as it does for a release)."""
        vm.releasing = True
        self._at(self.clock.now + self.rng.uniform(*self.s.release), lambda: self._release_answered(vm))

    def _release_answered(self, vm: _SimVm) -> None:
        vm.releasing = False
        if vm.gone_at is not None:
            self._confirm(vm)
            return
        if vm.stuck or self.rng.random() < self.s.release_fail_p:
            vm.release_failures += 1
            self._lie("release failed")
            self._emit(ReleaseFailed(vm.id, self.clock.now, "the cloud refused the delete"))
            return
        self._gone(vm, "released")

    def _lease_check(self, vm: _SimVm) -> None:
        if vm.gone_at is None and self.clock.now >= vm.lease_end:
            self._gone(vm, "lease ended")

    def _gone(self, vm: _SimVm, why: str) -> None:
        """The VM really goes now; the backend learns it once the cloud lists it so."""
        if vm.gone_at is not None:
            return
        vm.gone_at, vm.gone_why = self.clock.now, why
        if why != "released":
            self._lie(f"VM gone: {why}")
        if vm.lag > 0:
            self._lie("describe lagged")
        if vm.busy is not None:
            attempt = self.attempts[vm.busy]
            if attempt.ended_at is None:
                attempt.outcome, attempt.value = Outcome.PREEMPTED, None
                self._end(attempt, emit=False)
        self._confirm(vm)

    def _confirm(self, vm: _SimVm) -> None:
        """Ask the cloud until it says the VM is gone (describe lags by vm.lag), then tell the
        scheduler, with the time the cloud says it went. Nobody asks while the CLI is dead."""
        assert vm.gone_at is not None
        self._at(vm.gone_at + vm.lag, lambda: self._emit(self._confirmed_event(vm)) if self.listening else None)

    def _confirmed_event(self, vm: _SimVm) -> Event:
        assert vm.gone_at is not None
        if not vm.confirmed:
            vm.confirmed = True
            self.ledger.close(vm, vm.gone_at)
        if vm.ready_at is None or vm.boot_error is not None:
            return VmFailed(vm.id, vm.gone_at, vm.boot_error or "gone while booting")
        return VmGone(vm.id, vm.gone_at, vm.gone_why)

    # attempts --------------------------------------------------------------------------------------

    def _progress(self, key: tuple[int, int], epoch: int, value: float) -> None:
        attempt = self.attempts[key]
        if attempt.ended_at is None:
            self._emit(Progress(key[0], key[1], epoch, value))

    def _schedule_end(self, attempt: _SimAttempt) -> None:
        attempt.token += 1
        token = attempt.token
        self._at(attempt.end_at, lambda: self._end(attempt) if attempt.token == token else None)

    def _end(self, attempt: _SimAttempt, emit: bool = True) -> None:
        if attempt.ended_at is not None:
            return
        attempt.ended_at = self.clock.now
        self.running_trials.pop(attempt.key[0], None)
        if attempt.outcome in (Outcome.SUCCEEDED, Outcome.TIMEOUT) or attempt.outcome == Outcome.STOPPED:
            # A trial that succeeded, timed out or was stopped/pruned never runs again.
            self.finished_trials.add(attempt.key[0])
        vm = self.vms[attempt.vm]
        if vm.busy == attempt.key:
            vm.busy = None
        if emit:
            self._emit(AttemptEnded(attempt.key[0], attempt.key[1], self.clock.now, attempt.outcome, attempt.value))


class SeededSampler:
    """A stand-in for Optuna: random parameters, random pruning, every call recorded."""

    def __init__(self, seed: int = 0, capacity: int | None = None, prune_p: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self._capacity = capacity
        self.prune_p = prune_p
        self.next_number = 0
        self.told: dict[int, tuple[TrialState, float | None]] = {}
        self.violations: list[str] = []

    def capacity(self) -> int | None:
        return self._capacity

    def ask(self) -> tuple[int, dict[str, ParamValue]] | None:
        if self._capacity is not None and self.next_number >= self._capacity:
            return None
        number = self.next_number
        self.next_number += 1
        return number, {"lr": round(10 ** self.rng.uniform(-4, -1), 6), "width": self.rng.choice([32, 64, 128])}

    def report(self, trial: int, step: int, value: float) -> bool:
        return self.rng.random() < self.prune_p

    def tell(self, trial: int, state: TrialState, value: float | None) -> None:
        before = self.told.get(trial)
        if before is not None and before != (state, value):
            self.violations.append(f"trial {trial} told {before} then {(state, value)}")
        self.told[trial] = (state, value)


class MemoryJournal:
    """The journal as a disk that survives crashes."""

    def __init__(self) -> None:
        self.trials: dict[int, Trial] = {}
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.vms: dict[str, Vm] = {}
        self.counters = Counters()
        self.saves = 0

    def save(self, trials: Sequence[Trial], attempts: Sequence[Attempt], vms: Sequence[Vm],
             counters: Counters | None) -> None:
        self.saves += 1
        for t in trials:
            self.trials[t.number] = t
        for a in attempts:
            self.attempts[a.key] = a
        for v in vms:
            self.vms[v.id] = v
        if counters is not None:
            self.counters = counters

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(self.trials.values()), tuple(self.attempts.values()), tuple(self.vms.values()),
                        self.counters)


@dataclass(frozen=True)
class Crash:
    """The CLI dies after its `after_step`-th step, having carried out `executed` of that step's
    actions, and is resumed `downtime_s` later."""

    after_step: int
    executed: int
    downtime_s: float


@dataclass
class SimReport:
    scheduler: Scheduler
    world: SimWorld
    sampler: SeededSampler | object
    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)  # wall time of each scheduler step
    resumes: int = 0

    @property
    def booted(self) -> int:
        return len(self.world.vms)


def simulate(costs: Costs, limits: Limits, scenario: Scenario, *, sampler: object | None = None,
             crashes: Sequence[Crash] = (), journal: object | None = None, max_steps: int = 1_000_000,
             timer: Callable[[], float] = time.perf_counter) -> SimReport:
    """Run a whole sweep in the simulated world, crashing and resuming the CLI as told."""
    clock = SimClock()
    world = SimWorld(costs, scenario, clock)
    journal = journal if journal is not None else MemoryJournal()
    sampler = sampler if sampler is not None else SeededSampler(scenario.seed)
    scheduler = Scheduler(costs, limits, sampler, clock, journal)  # type: ignore[arg-type]
    report = SimReport(scheduler, world, sampler)
    todo = sorted(crashes, key=lambda c: c.after_step)
    events: list[Event] = []
    while report.steps < max_steps:
        t0 = timer()
        actions: list[Action] = scheduler.step(events)
        report.step_seconds.append(timer() - t0)
        report.steps += 1
        crash = todo.pop(0) if todo and todo[0].after_step <= report.steps else None
        for action in actions[: crash.executed if crash else len(actions)]:
            execute(world, action)
        if crash is not None:
            world.crash()
            world.advance(crash.downtime_s)
            world.revive()
            snapshot = journal.snapshot()  # type: ignore[attr-defined]
            scheduler = Scheduler(costs, limits, sampler, clock, journal, snapshot=snapshot)  # type: ignore[arg-type]
            report.scheduler = scheduler
            report.resumes += 1
            events = world.recover(snapshot)
            continue
        if scheduler.finished:
            return report
        events = world.events(1.0)
    raise SimStuck(f"no end after {max_steps} steps")
