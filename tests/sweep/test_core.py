"""The scheduler's decisions, step by step, with a hand-driven clock."""

from __future__ import annotations

import pytest

from cloudtrain.sweep.core import Scheduler
from cloudtrain.sweep.model import (
    AttemptEnded, Cancel, Costs, Launch, Limits, Outcome, Progress, Release, ReleaseFailed, Start,
    StopRequested, TrialState, VmFailed, VmGone, VmReady, VmState,
)
from cloudtrain.sweep.sim import MemoryJournal, SeededSampler

pytestmark = pytest.mark.quick

COSTS = Costs(budget_usd=100, hourly_usd=1.0, boot_s=60, prep_s=60, deadline_s=600, post_s=60, release_s=60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(limits: Limits, costs: Costs = COSTS, prune: bool = False) -> tuple[Scheduler, Clock, SeededSampler,
                                                                             MemoryJournal]:
    clock, sampler, journal = Clock(), SeededSampler(0, prune_p=1.0 if prune else 0.0), MemoryJournal()
    return Scheduler(costs, limits, sampler, clock, journal), clock, sampler, journal


def test_one_vm_is_booted_and_reused_for_every_trial_then_released() -> None:
    s, clock, sampler, _ = make(Limits(max_trials=3, max_parallel=1))
    (launch,) = s.step()
    assert isinstance(launch, Launch) and launch.lease_end == 1000 + 60 + 720 + 60
    clock.now += 30
    (start,) = s.step([VmReady(launch.vm, clock.now, 0.5)])
    assert isinstance(start, Start) and start.trial == 0 and start.job_deadline_s == 600
    for trial in (0, 1, 2):
        clock.now += 100
        actions = s.step([AttemptEnded(trial, 1, clock.now, Outcome.SUCCEEDED, value=trial / 10)])
        if trial < 2:
            (nxt,) = actions
            assert isinstance(nxt, Start) and nxt.vm == launch.vm and nxt.trial == trial + 1
        else:
            assert actions == [Release(launch.vm)]
    assert not s.finished
    s.step([VmGone(launch.vm, clock.now + 5)])
    assert s.finished and s.counters.ended == "done"
    assert [t.state for t in s.trials.values()] == [TrialState.SUCCEEDED] * 3
    assert s.best("max").number == 2 and sampler.told[2] == (TrialState.SUCCEEDED, 0.2)
    # Once gone, the guard counts it at the real price from launch to gone.
    assert abs(s.committed_usd() - 0.5 * (clock.now + 5 - 1000) / 3600) < 1e-12


def test_a_failed_attempt_is_retried_then_the_trial_fails() -> None:
    s, clock, _, _ = make(Limits(max_trials=1, max_parallel=1, max_retries=1))
    (launch,) = s.step()
    s.step([VmReady(launch.vm, clock.now)])
    (second,) = s.step([AttemptEnded(0, 1, clock.now, Outcome.FAILED, error="exit 1")])
    assert (second.trial, second.attempt) == (0, 2)
    assert s.step([AttemptEnded(0, 2, clock.now, Outcome.FAILED, error="exit 1")]) == [Release(launch.vm)]
    assert s.trials[0].state == TrialState.FAILED and s.trials[0].failures == 2


def test_a_losing_trial_is_pruned() -> None:
    s, clock, sampler, _ = make(Limits(max_trials=1, max_parallel=1), prune=True)
    (launch,) = s.step()
    s.step([VmReady(launch.vm, clock.now)])
    (cancel,) = s.step([Progress(0, 1, 1, 0.3)])
    assert cancel == Cancel(launch.vm, 0, 1, "pruned")
    assert s.step([AttemptEnded(0, 1, clock.now, Outcome.STOPPED)]) == [Release(launch.vm)]
    assert s.trials[0].state == TrialState.PRUNED and sampler.told[0] == (TrialState.PRUNED, None)


def test_a_preempted_trial_runs_again_on_a_new_vm() -> None:
    s, clock, _, _ = make(Limits(max_trials=1, max_parallel=1, max_retries=1))
    (launch,) = s.step()
    s.step([VmReady(launch.vm, clock.now)])
    clock.now += 50
    (again,) = s.step([VmGone(launch.vm, clock.now, "preempted")])
    assert isinstance(again, Launch) and again.vm != launch.vm
    assert s.attempts[(0, 1)].state == Outcome.PREEMPTED and s.trials[0].state == TrialState.PENDING


def test_stop_cancels_running_trials_marks_the_rest_and_releases_everything() -> None:
    s, clock, _, _ = make(Limits(max_trials=5, max_parallel=2))
    a, b = s.step()
    s.step([VmReady(a.vm, clock.now), VmReady(b.vm, clock.now)])
    actions = s.step([StopRequested("test")])
    assert sorted(actions, key=str) == sorted([Cancel(a.vm, 0, 1, "stopped"), Cancel(b.vm, 1, 1, "stopped")], key=str)
    releases = s.step([AttemptEnded(0, 1, clock.now, Outcome.FAILED), AttemptEnded(1, 1, clock.now, Outcome.SUCCEEDED, 1.0)])
    assert set(releases) == {Release(a.vm), Release(b.vm)}
    s.step([VmGone(a.vm, clock.now), VmGone(b.vm, clock.now)])
    assert s.finished and s.counters.ended == "stopped: test"
    assert [s.trials[n].state for n in (0, 1)] == [TrialState.STOPPED, TrialState.SUCCEEDED]
    assert len(s.trials) == 2  # no trial was asked for after the stop


def test_admission_counts_every_lease_and_waits_for_money_to_free_up() -> None:
    one = COSTS.new_vm_usd()
    costs = Costs(**{**COSTS.__dict__, "budget_usd": one * 1.5})
    s, clock, _, _ = make(Limits(max_trials=2, max_parallel=2), costs)
    (launch,) = s.step()  # the second VM's worst case would not fit next to the first
    s.step([VmReady(launch.vm, clock.now, 1.0)])
    assert s.committed_usd() <= costs.budget_usd
    clock.now += 100
    (nxt,) = s.step([AttemptEnded(0, 1, clock.now, Outcome.SUCCEEDED, 0.5)])
    # Warm reuse extends the lease by only what passed: it fits where a second VM did not.
    assert isinstance(nxt, Start) and nxt.vm == launch.vm and s.committed_usd() <= costs.budget_usd


def test_a_resumed_scheduler_asks_again_for_what_the_dead_one_asked() -> None:
    s, clock, sampler, journal = make(Limits(max_trials=2, max_parallel=1))
    (launch,) = s.step()
    s.step([VmReady(launch.vm, clock.now)])
    s.step([StopRequested("test")])  # the cancel was asked, then the CLI died
    resumed = Scheduler(COSTS, Limits(max_trials=2, max_parallel=1), sampler, clock, journal, journal.snapshot())
    assert resumed.step() == [Cancel(launch.vm, 0, 1, "stopped")]
    assert resumed.step([AttemptEnded(0, 1, clock.now, Outcome.STOPPED)]) == [Release(launch.vm)]
    again = Scheduler(COSTS, Limits(max_trials=2, max_parallel=1), sampler, clock, journal, journal.snapshot())
    assert again.step() == [Release(launch.vm)]
    assert again.vms[launch.vm].state == VmState.RELEASING


def test_each_vm_start_is_counted_at_least_the_clouds_minimum() -> None:
    """Billing rules: AWS/GCP bill 60 s, Azure 300 s per start, however short the VM's life."""
    cases = [  # (min_s, seconds the VM lived, hours the guard counts)
        (0, 10, 10 / 3600),
        (60, 10, 60 / 3600),
        (300, 10, 300 / 3600),
        (300, 400, 400 / 3600),
    ]
    for min_s, lived, hours in cases:
        costs = Costs(**{**COSTS.__dict__, "min_s": min_s})
        s, clock, _, _ = make(Limits(max_trials=1, max_parallel=1, max_boot_failures=1), costs)
        (launch,) = s.step()
        s.step([VmFailed(launch.vm, clock.now + lived, "boot failed")])
        assert abs(s.committed_usd() - COSTS.hourly_usd * hours) < 1e-12, (min_s, lived)


def test_a_new_vms_worst_case_is_at_least_the_minimum() -> None:
    short = Costs(budget_usd=1, hourly_usd=3.6, boot_s=10, prep_s=10, deadline_s=30, post_s=10, release_s=10)
    assert abs(short.new_vm_usd() - 0.07) < 1e-12
    assert abs(Costs(**{**short.__dict__, "min_s": 300}).new_vm_usd() - 0.3) < 1e-12


def test_a_release_frees_no_money_until_the_vm_is_confirmed_gone() -> None:
    """The bug of issue 22 item 7: a failed `down` reported the VM gone and its money was reused."""
    one = COSTS.new_vm_usd()
    costs = Costs(**{**COSTS.__dict__, "budget_usd": one * 1.5})
    s, clock, _, _ = make(Limits(max_trials=3, max_parallel=2, max_retries=0), costs)
    (launch,) = s.step()
    s.step([VmReady(launch.vm, clock.now, 1.0)])
    worst = s.committed_usd()
    clock.now += 10
    # Its trial failed at once; nothing else fits on it... but the next trial does, on the same VM.
    (nxt,) = s.step([AttemptEnded(0, 1, clock.now, Outcome.FAILED)])
    assert isinstance(nxt, Start) and nxt.vm == launch.vm
    s.step([StopRequested("test")])
    (release,) = s.step([AttemptEnded(1, 1, clock.now, Outcome.STOPPED)])
    assert release == Release(launch.vm)
    assert s.committed_usd() >= worst  # asked to go is not gone: still counted to its lease end
    clock.now += 30
    (again,) = s.step([ReleaseFailed(launch.vm, clock.now, "RequestLimitExceeded")])
    assert again == Release(launch.vm)  # asked again
    vm = s.vms[launch.vm]
    assert vm.state == VmState.RELEASE_FAILED and "RequestLimitExceeded" in (vm.error or "")
    assert s.committed_usd() >= worst and not s.finished
    clock.now += 60
    assert s.step([VmGone(launch.vm, clock.now)]) == []
    assert s.finished and abs(s.committed_usd() - (clock.now - 1000) / 3600) < 1e-12


def test_release_failed_while_booting_is_a_boot_failure_and_while_busy_ends_the_attempt() -> None:
    s, clock, _, _ = make(Limits(max_trials=2, max_parallel=2, max_retries=1))
    a, b = s.step()
    s.step([VmReady(b.vm, clock.now)])
    actions = s.step([ReleaseFailed(a.vm, clock.now, "boot given up; delete failed")])
    assert Release(a.vm) in actions and s.counters.boot_failures == 1
    actions = s.step([ReleaseFailed(b.vm, clock.now, "vanished; delete failed")])
    assert Release(b.vm) in actions
    assert s.attempts[(0, 1)].state == Outcome.PREEMPTED and s.trials[0].state == TrialState.PENDING
    assert {s.vms[a.vm].state, s.vms[b.vm].state} == {VmState.RELEASE_FAILED}


def test_a_resumed_scheduler_asks_again_for_a_release_that_failed() -> None:
    s, clock, sampler, journal = make(Limits(max_trials=1, max_parallel=1))
    (launch,) = s.step()
    s.step([ReleaseFailed(launch.vm, clock.now, "no answer")])
    resumed = Scheduler(COSTS, Limits(max_trials=1, max_parallel=1), sampler, clock, journal, journal.snapshot())
    assert Release(launch.vm) in resumed.step()
