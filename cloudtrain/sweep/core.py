"""The sweep scheduler: a pure state machine with an injected clock. No I/O, no threads, no sleeps.

`Scheduler.step(events)` applies what happened (VMs ready or gone, attempts ended, progress), decides
what to do next, writes every changed record to its `Journal` and only then returns the actions
(launch a VM, start an attempt on one, cancel one, release a VM) for a `Backend` to carry out. So a
CLI killed at any point leaves a journal that says at least as much as the world: `sweep resume`
rebuilds the scheduler from it, the backend reports what happened meanwhile (`Backend.recover`),
and nothing is started twice.

Money. Every VM holds a lease: the time by which it is gone, whatever happens (its on-node watchdog
deletes it then, CLI or not). Until the backend confirms a VM gone, its worst-case cost is price x
(lease end - launch), at least the cloud's minimum billed time per start (`Costs.min_s`): asking for
a release frees no money, because a release can fail or go unconfirmed (`ReleaseFailed`: the VM
stays counted and the release is asked again). Once gone, it counts what it cost (price x (gone -
launch), at least the minimum), with `gone` the time the cloud says it went. The sum over all VMs
is what the sweep can cost at most; an action that would lengthen a lease (a VM for a new trial, a
trial on a warm VM) is taken only if that sum stays within the budget. A trial on a VM gets
    prep_s (sync, setup) + deadline_s (the job, a hard deadline on the node) + post_s (collect)
and a new VM boot_s before that; release_s covers tearing a VM down. The backend promises that an
attempt ends by its `deadline_at`, that a VM not ready by its `ready_by` is given up, and that a VM
is gone by its lease end. Then the spend can never pass the budget: the property test
(tests/sweep/test_properties.py) checks it against random prices, durations, failures, preemptions,
CLI crashes and a backend that lies the way clouds do. This account is the budget guard only: what
a sweep reports as spent comes from the billed intervals in state (cloudtrain/sweep/ledger.py).

Trials. The sampler (Optuna in the CLI) gives each new trial its number and parameters. An attempt
is one run of a trial on one VM; each (trial, attempt) starts at most once, a trial has at most one
attempt running, and none after it ended for good. Failed, preempted or lost attempts are retried
up to `max_retries` times; an attempt that provably never started is retried without counting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from cloudtrain.sweep.model import (
    Action, Attempt, AttemptEnded, Backend, Cancel, Clock, Costs, Counters, Event, Journal, Launch, Limits,
    Outcome, Progress, Release, ReleaseFailed, Sampler, Snapshot, Start, StopRequested, Trial, TrialState, Vm,
    VmFailed, VmGone, VmReady, VmState,
)

# Admission keeps this share of the budget unused, so rounding in sums of float costs can never
# tip a spend that is exactly at the budget over it.
_SLACK = 1e-9


class Scheduler:
    def __init__(self, costs: Costs, limits: Limits, sampler: Sampler, clock: Clock,
                 journal: Journal | None = None, snapshot: Snapshot | None = None) -> None:
        self.costs = costs
        self.limits = limits
        self.sampler = sampler
        self.clock = clock
        self.journal = journal
        self.trials: dict[int, Trial] = {}
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.vms: dict[str, Vm] = {}
        self.counters = Counters()
        self._live: dict[str, Vm] = {}
        self._running: dict[tuple[int, int], Attempt] = {}
        self._pending: set[int] = set()
        self._gone_usd = 0.0
        self._exhausted = False
        self._dirty_trials: dict[int, Trial] = {}
        self._dirty_attempts: dict[tuple[int, int], Attempt] = {}
        self._dirty_vms: dict[str, Vm] = {}
        self._dirty_counters = False
        self._reissue = snapshot is not None
        if snapshot is not None:
            for trial in snapshot.trials:
                self._put_trial(trial)
            for attempt in snapshot.attempts:
                self._put_attempt(attempt)
            for vm in snapshot.vms:
                self._put_vm(vm)
            self.counters = snapshot.counters
            self._clear_dirty()

    # views -----------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.counters.ended is not None and not self._live and not self._running

    def running_attempts(self) -> list[Attempt]:
        return list(self._running.values())

    def live_vms(self) -> list[Vm]:
        return sorted(self._live.values(), key=lambda v: v.slot)

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(self.trials.values()), tuple(self.attempts.values()), tuple(self.vms.values()),
                        self.counters)

    def committed_usd(self) -> float:
        """The most the sweep can cost given what exists and is promised now: the budget guard.
        (What was spent is the ledger's to say: cloudtrain/sweep/ledger.py.)"""
        return self._gone_usd + sum(vm.worst_usd(self.costs) for vm in self._live.values())

    def best(self, goal: str) -> Trial | None:
        done = [t for t in self.trials.values() if t.state == TrialState.SUCCEEDED and t.value is not None]
        if not done:
            return None
        return (max if goal == "max" else min)(done, key=lambda t: (t.value, -t.number))  # type: ignore[arg-type]

    # the step --------------------------------------------------------------------------------------

    def step(self, events: Iterable[Event] = ()) -> list[Action]:
        now = self.clock()
        actions: list[Action] = []
        for event in events:
            self._apply(event, now, actions)
        if self._reissue:
            self._reissue = False
            self._reissue_pending_work(actions)
        self._plan(now, actions)
        self._flush()
        return actions

    def _reissue_pending_work(self, actions: list[Action]) -> None:
        """After a restart, what the dead CLI asked for may not have happened: ask again (both idempotent)."""
        for vm in sorted(self._live.values(), key=lambda v: v.slot):
            if vm.state in (VmState.RELEASING, VmState.RELEASE_FAILED):
                actions.append(Release(vm.id))
        for attempt in self._running.values():
            if attempt.stopping is not None:
                actions.append(Cancel(attempt.vm, attempt.trial, attempt.attempt, attempt.stopping))

    # applying events -------------------------------------------------------------------------------

    def _apply(self, event: Event, now: float, actions: list[Action]) -> None:
        if isinstance(event, VmReady):
            vm = self._live.get(event.vm)
            if vm is None or vm.state != VmState.BOOTING:
                return
            price = vm.hourly_usd if event.hourly_usd is None else event.hourly_usd
            self._put_vm(replace(vm, state=VmState.IDLE, ready_at=event.at, hourly_usd=price))
        elif isinstance(event, VmFailed):
            vm = self._live.get(event.vm)
            if vm is None:
                return
            if vm.state == VmState.BOOTING:
                self._set_counters(boot_failures=self.counters.boot_failures + 1)
            self._vm_gone(vm, event.at, event.error, Outcome.LOST)
        elif isinstance(event, VmGone):
            vm = self._live.get(event.vm)
            if vm is None:
                return
            self._vm_gone(vm, event.at, None if event.reason == "released" else event.reason, Outcome.PREEMPTED)
        elif isinstance(event, ReleaseFailed):
            vm = self._live.get(event.vm)
            if vm is None:
                return
            if vm.state == VmState.BOOTING:
                # The backend gave its boot up and could not take down what it left.
                self._set_counters(boot_failures=self.counters.boot_failures + 1)
            if vm.trial is not None and vm.attempt is not None:
                self._attempt_ended(vm.trial, vm.attempt, max(event.at, vm.launched_at), Outcome.PREEMPTED, None,
                                    f"VM {vm.id} is going: {event.error}")
                vm = self.vms[vm.id]
            # Still counted to its lease end (bound_end): the money is not free until it is confirmed gone.
            self._put_vm(replace(vm, state=VmState.RELEASE_FAILED, trial=None, attempt=None,
                                 release_at=vm.release_at if vm.release_at is not None else event.at,
                                 error=f"release failed: {event.error}"))
            actions.append(Release(vm.id))
        elif isinstance(event, AttemptEnded):
            self._attempt_ended(event.trial, event.attempt, event.at, event.outcome, event.value, event.error)
        elif isinstance(event, Progress):
            attempt = self._running.get((event.trial, event.attempt))
            if attempt is None or attempt.stopping is not None or not math.isfinite(event.value):
                return
            if self.sampler.report(event.trial, event.step, event.value):
                self._put_attempt(replace(attempt, stopping=TrialState.PRUNED.value))
                actions.append(Cancel(attempt.vm, attempt.trial, attempt.attempt, TrialState.PRUNED.value))
        elif isinstance(event, StopRequested):
            if self.counters.stop is not None or self.counters.ended is not None:
                return
            self._set_counters(stop=event.reason)
            for attempt in list(self._running.values()):
                if attempt.stopping is None:
                    self._put_attempt(replace(attempt, stopping=TrialState.STOPPED.value))
                    actions.append(Cancel(attempt.vm, attempt.trial, attempt.attempt, TrialState.STOPPED.value))
            self._stop_pending(now, event.reason)

    def _vm_gone(self, vm: Vm, at: float, error: str | None, outcome: Outcome) -> None:
        at = max(at, vm.launched_at)
        if vm.trial is not None and vm.attempt is not None:
            why = f"VM {vm.id} gone: {error}" if error else f"VM {vm.id} gone"
            self._attempt_ended(vm.trial, vm.attempt, at, outcome, None, why)
            vm = self.vms[vm.id]
        self._put_vm(replace(vm, state=VmState.GONE, gone_at=at, trial=None, attempt=None, error=error or vm.error))

    def _attempt_ended(self, trial_no: int, attempt_no: int, at: float, outcome: Outcome, value: float | None,
                       error: str | None) -> None:
        attempt = self._running.get((trial_no, attempt_no))
        if attempt is None:
            return
        if attempt.stopping is not None and outcome not in (Outcome.SUCCEEDED, Outcome.NOT_STARTED):
            outcome = Outcome(attempt.stopping)
        if value is not None and not math.isfinite(value):
            value, error = None, error or f"the metric is {value}"
        at = max(at, attempt.started_at)
        self._put_attempt(replace(attempt, state=outcome, ended_at=at, value=value, error=error))
        vm = self._live.get(attempt.vm)
        if vm is not None and vm.trial == trial_no and vm.attempt == attempt_no:
            self._put_vm(replace(vm, state=VmState.IDLE if vm.state == VmState.BUSY else vm.state, trial=None,
                                 attempt=None))
        trial = self.trials[trial_no]
        stopping = self.counters.stop is not None or self.counters.ended is not None
        if outcome == Outcome.SUCCEEDED:
            if value is None:
                self._final(trial, TrialState.FAILED, at, None, error or "the job succeeded but reported no metric")
            else:
                self._final(trial, TrialState.SUCCEEDED, at, value, None)
        elif outcome == Outcome.PRUNED:
            self._final(trial, TrialState.PRUNED, at, None, error)
        elif outcome == Outcome.STOPPED:
            self._final(trial, TrialState.STOPPED, at, None, self.counters.stop or error)
        elif outcome == Outcome.TIMEOUT:
            self._final(trial, TrialState.TIMEOUT, at, None, error or "the job hit its deadline")
        elif outcome == Outcome.NOT_STARTED:
            if stopping:
                self._final(trial, TrialState.STOPPED, at, None, self.counters.stop or self.counters.ended)
            else:
                self._put_trial(replace(trial, state=TrialState.PENDING))
        else:  # failed, preempted, lost: retried while retries last
            failures = trial.failures + 1
            trial = replace(trial, failures=failures, error=error)
            if failures > self.limits.max_retries:
                self._final(trial, TrialState.FAILED, at, None, error)
            elif stopping:
                self._final(trial, TrialState.STOPPED, at, None, self.counters.stop or self.counters.ended)
            else:
                self._put_trial(replace(trial, state=TrialState.PENDING))

    def _final(self, trial: Trial, state: TrialState, at: float, value: float | None, error: str | None) -> None:
        self._put_trial(replace(trial, state=state, value=value, error=error, ended_at=at))
        self.sampler.tell(trial.number, state, value)

    def _stop_pending(self, now: float, reason: str) -> None:
        for number in sorted(self._pending):
            self._final(self.trials[number], TrialState.STOPPED, now, None, reason)

    # deciding --------------------------------------------------------------------------------------

    def _plan(self, now: float, actions: list[Action]) -> None:
        if self.counters.stop is not None or self.counters.ended is not None:
            for vm in sorted(self._live.values(), key=lambda v: v.slot):
                if vm.state in (VmState.IDLE, VmState.BOOTING):
                    self._release(vm, now, actions)
            if self.counters.ended is None and not self._live and not self._running:
                self._set_counters(ended=f"stopped: {self.counters.stop}")
            return
        for vm in sorted(self._live.values(), key=lambda v: v.slot):
            if vm.state == VmState.IDLE and not self._assign(vm, now, actions):
                self._release(vm, now, actions)
        while self._should_launch():
            self._launch(now, actions)
        if not self._live and not self._running:
            reason = None
            if self._work() == 0:
                reason = "done"
            elif self.counters.boot_failures >= self.limits.max_boot_failures:
                reason = f"{self.counters.boot_failures} VM(s) failed to boot"
            elif not self._fits(self.costs.new_vm_usd()):
                reason = "budget exhausted"
            if reason is not None:
                self._set_counters(ended=reason)
                if reason != "done":
                    self._stop_pending(now, reason)

    def _work(self) -> int:
        """Trials that could still start: pending ones, plus new ones the sampler may give."""
        cap = self.limits.max_trials
        capacity = self.sampler.capacity()
        if capacity is not None:
            cap = min(cap, capacity)
        new = 0 if self._exhausted else max(0, cap - len(self.trials))
        return len(self._pending) + new

    def _fits(self, extra_usd: float) -> bool:
        return self.committed_usd() + extra_usd <= self.costs.budget_usd * (1 - _SLACK)

    def _should_launch(self) -> bool:
        if len(self._live) >= self.limits.max_parallel:
            return False
        if self.counters.boot_failures >= self.limits.max_boot_failures:
            return False
        booting = sum(1 for vm in self._live.values() if vm.state == VmState.BOOTING)
        return self._work() > booting and self._fits(self.costs.new_vm_usd())

    def _launch(self, now: float, actions: list[Action]) -> None:
        c = self.costs
        slot = self.counters.next_slot
        self._set_counters(next_slot=slot + 1)
        lease_end = now + c.boot_s + c.window_s + c.release_s
        vm = Vm(id=f"v{slot}", slot=slot, state=VmState.BOOTING, hourly_usd=c.hourly_usd, launched_at=now,
                lease_end=lease_end)
        self._put_vm(vm)
        actions.append(Launch(vm.id, slot, ready_by=lease_end - c.release_s, lease_end=lease_end))

    def _assign(self, vm: Vm, now: float, actions: list[Action]) -> bool:
        """Start the next trial on an idle VM if its longer lease fits the budget."""
        if self._work() == 0:
            return False
        c = self.costs
        lease_end = max(vm.lease_end, now + c.window_s + c.release_s)
        if not self._fits(replace(vm, lease_end=lease_end).worst_usd(c) - vm.worst_usd(c)):
            return False
        trial = self._next_trial(now)
        if trial is None:
            return False
        number = trial.attempts + 1
        attempt = Attempt(trial=trial.number, attempt=number, vm=vm.id, started_at=now,
                          deadline_at=now + c.window_s, hourly_usd=vm.hourly_usd)
        self._put_trial(replace(trial, state=TrialState.RUNNING, attempts=number))
        self._put_attempt(attempt)
        self._put_vm(replace(vm, state=VmState.BUSY, trial=trial.number, attempt=number, lease_end=lease_end,
                             runs=vm.runs + 1))
        actions.append(Start(vm.id, trial.number, number, trial.params, job_start_by=now + c.prep_s,
                             job_deadline_s=c.deadline_s, deadline_at=attempt.deadline_at, lease_end=lease_end))
        return True

    def _next_trial(self, now: float) -> Trial | None:
        if self._pending:
            return self.trials[min(self._pending)]
        asked = self.sampler.ask()
        if asked is None:
            self._exhausted = True
            return None
        number, params = asked
        if number in self.trials:
            raise AssertionError(f"the sampler gave trial number {number} twice")
        trial = Trial(number=number, params=tuple(params.items()), created_at=now)
        self._put_trial(trial)
        return trial

    def _release(self, vm: Vm, now: float, actions: list[Action]) -> None:
        self._put_vm(replace(vm, state=VmState.RELEASING, release_at=now))
        actions.append(Release(vm.id))

    # records and the journal -----------------------------------------------------------------------

    def _put_trial(self, trial: Trial) -> None:
        self.trials[trial.number] = trial
        if trial.state == TrialState.PENDING:
            self._pending.add(trial.number)
        else:
            self._pending.discard(trial.number)
        self._dirty_trials[trial.number] = trial

    def _put_attempt(self, attempt: Attempt) -> None:
        self.attempts[attempt.key] = attempt
        if attempt.running:
            self._running[attempt.key] = attempt
        else:
            self._running.pop(attempt.key, None)
        self._dirty_attempts[attempt.key] = attempt

    def _put_vm(self, vm: Vm) -> None:
        previous = self.vms.get(vm.id)
        self.vms[vm.id] = vm
        if vm.live:
            self._live[vm.id] = vm
        else:
            self._live.pop(vm.id, None)
            if previous is None or previous.live:
                # Gone: its cost is final, and it is what it really cost.
                self._gone_usd += vm.billed_usd(vm.gone_at or vm.launched_at, self.costs)
        self._dirty_vms[vm.id] = vm

    def _set_counters(self, **changes: object) -> None:
        self.counters = replace(self.counters, **changes)  # type: ignore[arg-type]
        self._dirty_counters = True

    def _flush(self) -> None:
        if self.journal is not None and (self._dirty_trials or self._dirty_attempts or self._dirty_vms
                                         or self._dirty_counters):
            self.journal.save(list(self._dirty_trials.values()), list(self._dirty_attempts.values()),
                              list(self._dirty_vms.values()), self.counters if self._dirty_counters else None)
        self._clear_dirty()

    def _clear_dirty(self) -> None:
        self._dirty_trials.clear()
        self._dirty_attempts.clear()
        self._dirty_vms.clear()
        self._dirty_counters = False


def drive(scheduler: Scheduler, backend: Backend, *, events: Sequence[Event] = (), poll_s: float = 0.5,
          on_step: Callable[[Scheduler, Sequence[Event], Sequence[Action]], None] | None = None,
          extra_events: Callable[[], list[Event]] | None = None) -> None:
    """Run the sweep to its end: step, hand the actions to the backend, wait for what happens.

    `extra_events` adds events from outside the backend (a stop asked by another process, Ctrl-C)."""
    pending = list(events)
    while True:
        actions = scheduler.step(pending)
        for action in actions:
            execute(backend, action)
        if on_step is not None:
            on_step(scheduler, pending, actions)
        if scheduler.finished:
            return
        pending = backend.events(poll_s)
        if extra_events is not None:
            pending += extra_events()


def execute(backend: Backend, action: Action) -> None:
    if isinstance(action, Launch):
        backend.launch(action)
    elif isinstance(action, Start):
        backend.run(action)
    elif isinstance(action, Cancel):
        backend.cancel(action)
    else:
        backend.release(action)
