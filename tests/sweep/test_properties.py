"""The scheduler's promises, against random worlds (hypothesis), all in memory with a controlled clock.

Random prices, boot/setup/training/collect/release times, boot failures, job failures, timeouts,
preemptions, pruning and CLI crashes (the scheduler thrown away mid-step with only some of its
actions carried out, the world going on for a while, a new scheduler resumed from the journal),
each cloud's minimum billed time per start, and a backend that lies the way clouds do: releases
that fail (some VMs never let go: they run to their lease end), VMs that vanish under a trial,
the CLI dying while VMs boot, describe answers that lag behind what happened.
Whatever happens:
- the money really billed (the world's truth, not the scheduler's belief) never exceeds budget_usd;
- what the sweep reports as spent (the ledger, through cloudtrain/sweep/ledger.py) is within 1% of it;
- no attempt starts twice, no trial runs two attempts at once or again after it ended for good,
  and no trial has more failed attempts than 1 + max_retries;
- when the sweep ends, no VM is left running, and every trial is in a final state.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cloudtrain.sweep.model import Costs, Limits, Outcome, TrialState
from cloudtrain.sweep.sim import Crash, Scenario, SeededSampler, simulate


# The strategies that depend on no earlier draw, built once: a strategy built inside `worlds` is
# built (and its properties worked out by hypothesis) again for every one of the 3,000 histories.
# The draws, and so the histories, are the same.
DEADLINE_S = st.floats(60, 1800)
HOURLY_USD = st.floats(0.05, 30)
BOOT_S = st.floats(10, 300)
PREP_S = st.floats(5, 120)
POST_S = st.floats(1, 60)
RELEASE_S = st.floats(1, 120)
MIN_S = st.sampled_from([0.0, 60.0, 300.0])
BUDGET_SHARE = st.floats(0.5, 8)
MAX_TRIALS = st.integers(1, 30)
MAX_PARALLEL = st.integers(1, 6)
MAX_RETRIES = st.integers(0, 3)
MAX_BOOT_FAILURES = st.integers(1, 5)
LOW_BOOT = st.floats(1, 200)
SEED = st.integers(0, 2**31)
PRICE_SHARE = st.floats(0.1, 1.0)
BOOT_SPREAD = st.floats(0, 400)
BOOT_FAIL_P = st.sampled_from([0.0, 0.1, 0.5])
OVERRUN = st.floats(0.5, 1.5)
FAIL_P = st.sampled_from([0.0, 0.2, 0.6])
PREEMPT_P = st.sampled_from([0.0, 0.2, 0.7])
KILL_S = st.floats(0, 30)
EPOCHS = st.integers(1, 5)
RELEASE_FAIL_P = st.sampled_from([0.0, 0.3, 0.8])
RELEASE_STUCK_P = st.sampled_from([0.0, 0.2, 1.0])
DESCRIBE_LAG = st.sampled_from([0.0, 30.0, 300.0])
RETRY_S = st.floats(1, 120)
# Early steps are while the first VMs boot: a CLI dying there leaves VMs only their lease ends.
CRASH_STEPS = st.lists(st.one_of(st.integers(1, 4), st.integers(1, 200)), max_size=4)
EXECUTED = st.integers(0, 4)
PRUNE_P = st.sampled_from([0.0, 0.3])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Costs, Limits, Scenario, list[Crash], float]:
    deadline = draw(DEADLINE_S)
    costs = Costs(
        budget_usd=0.0,  # set below, from one trial's worst case
        hourly_usd=draw(HOURLY_USD),
        boot_s=draw(BOOT_S),
        prep_s=draw(PREP_S),
        deadline_s=deadline,
        post_s=draw(POST_S),
        release_s=draw(RELEASE_S),
        min_s=draw(MIN_S),
    )
    # From less than one trial's worst case (nothing may start) to several VMs' worth.
    costs = replace(costs, budget_usd=costs.new_vm_usd() * draw(BUDGET_SHARE))
    limits = Limits(
        max_trials=draw(MAX_TRIALS),
        max_parallel=draw(MAX_PARALLEL),
        max_retries=draw(MAX_RETRIES),
        max_boot_failures=draw(MAX_BOOT_FAILURES),
    )
    low_boot = draw(LOW_BOOT)
    low_job = draw(st.floats(1, deadline))
    scenario = Scenario(
        seed=draw(SEED),
        price_share=(draw(PRICE_SHARE), 1.0),
        boot=(low_boot, low_boot + draw(BOOT_SPREAD)),  # may take longer than boot_s
        boot_fail_p=draw(BOOT_FAIL_P),
        prep=(1.0, costs.prep_s * draw(OVERRUN)),  # may overrun prep_s
        job=(low_job, low_job + draw(st.floats(0, 2 * deadline))),  # may hit the deadline
        post=(0.5, costs.post_s * 2),
        release=(0.5, costs.release_s * 2),
        fail_p=draw(FAIL_P),
        preempt_p=draw(PREEMPT_P),
        kill_s=draw(KILL_S),
        epochs=draw(EPOCHS),
        release_fail_p=draw(RELEASE_FAIL_P),
        release_stuck_p=draw(RELEASE_STUCK_P),
        describe_lag=(0.0, draw(DESCRIBE_LAG)),
        retry_s=draw(RETRY_S),
    )
    crashes = [Crash(after_step=step, executed=draw(EXECUTED), downtime_s=draw(st.floats(0, 3 * deadline)))
               for step in sorted(set(draw(CRASH_STEPS)))]
    prune_p = draw(PRUNE_P)
    return costs, limits, scenario, crashes, prune_p


# 3,000 histories, the same ones on every run (derandomize): about 15 s on a 2-core machine.
@settings(max_examples=3000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_spend_stays_within_budget_no_trial_runs_twice_and_no_vm_outlives_the_sweep(world) -> None:
    costs, limits, scenario, crashes, prune_p = world
    sampler = SeededSampler(scenario.seed, prune_p=prune_p)
    report = simulate(costs, limits, scenario, sampler=sampler, crashes=crashes)
    truth, scheduler = report.world, report.scheduler
    event(f"VMs booted: {min(report.booted, 5)}{'+' if report.booted >= 5 else ''}")
    for lie in truth.lies:
        event(lie)  # `pytest --hypothesis-show-statistics` shows how many histories told each

    assert truth.spent_usd() <= costs.budget_usd, (truth.spent_usd(), costs.budget_usd)
    assert truth.violations == []
    assert sampler.violations == []
    assert truth.alive() == [], "VMs outlived the sweep"
    assert truth.unconfirmed() == [], "the sweep ended before the cloud said its VMs were gone"

    assert scheduler.finished
    assert all(t.final for t in scheduler.trials.values())
    assert len(scheduler.trials) <= limits.max_trials
    for trial in scheduler.trials.values():
        attempts = [a for a in scheduler.attempts.values() if a.trial == trial.number]
        counted = [a for a in attempts if a.state not in (Outcome.NOT_STARTED, Outcome.SUCCEEDED, Outcome.PRUNED,
                                                          Outcome.STOPPED, Outcome.TIMEOUT)]
        assert len(counted) <= 1 + limits.max_retries
        assert all(not a.running for a in attempts)
        # What the scheduler believes matches what really ran.
        for a in attempts:
            real = truth.attempts.get(a.key)
            if real is not None and a.state == Outcome.SUCCEEDED:
                assert real.outcome == Outcome.SUCCEEDED and real.value == a.value
        if trial.state == TrialState.SUCCEEDED:
            assert sampler.told[trial.number] == (TrialState.SUCCEEDED, trial.value)
    # What the sweep reports (the ledger) is the truth within 1%; the guard never counted less.
    assert abs(truth.reported_usd() - truth.spent_usd()) <= 0.01 * truth.spent_usd() + 1e-12
    assert scheduler.committed_usd() >= truth.spent_usd() * (1 - 1e-9)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 8), st.integers(1, 60))
def test_trials_that_fit_the_budget_all_run_on_at_most_max_parallel_vms(seed: int, parallel: int, trials: int) -> None:
    """Warm reuse: with money for everything and nothing failing, no VM is booted beyond max_parallel,
    and every trial succeeds exactly once."""
    costs = Costs(budget_usd=1e6, hourly_usd=3.0, boot_s=120, prep_s=60, deadline_s=900, post_s=30, release_s=60)
    limits = Limits(max_trials=trials, max_parallel=parallel)
    report = simulate(costs, limits, Scenario(seed=seed))
    assert report.booted <= parallel
    assert [t.state for t in report.scheduler.trials.values()] == [TrialState.SUCCEEDED] * trials
    assert len(report.world.attempts) == trials
    assert report.world.alive() == []


def test_a_budget_for_exactly_one_worst_case_trial_runs_one_at_a_time() -> None:
    costs = Costs(budget_usd=1.0, hourly_usd=1.0, boot_s=600, prep_s=300, deadline_s=1800, post_s=300, release_s=600)
    one = costs.new_vm_usd()
    costs = Costs(**{**costs.__dict__, "budget_usd": one * 1.5})
    report = simulate(costs, Limits(max_trials=5, max_parallel=4), Scenario(seed=1, job=(60, 120)))
    # Never two VMs at once: the second's worst case would not fit.
    vms = sorted(report.world.vms.values(), key=lambda v: v.launched_at)
    for a, b in itertools.pairwise(vms):
        assert b.launched_at >= a.gone_at  # type: ignore[operator]
    assert report.world.spent_usd() <= costs.budget_usd


def test_nothing_fits_means_nothing_is_launched() -> None:
    costs = Costs(budget_usd=0.01, hourly_usd=10.0, boot_s=60, prep_s=60, deadline_s=600, post_s=60, release_s=60)
    report = simulate(costs, Limits(max_trials=3, max_parallel=2), Scenario())
    assert report.world.vms == {}
    assert report.scheduler.counters.ended == "budget exhausted"
    assert report.scheduler.trials == {}  # never asked the sampler for a trial it could not pay for
