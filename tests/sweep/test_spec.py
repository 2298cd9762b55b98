"""Sweep recipes: what is accepted, what is refused (one located line), the money model, trial recipes,
and the scheduler's journal in the state database."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import RecipeError, UsageError
from cloudtrain.recipe import load_recipe
from cloudtrain.state import StateStore, SweepRecord
from cloudtrain.sweep.core import Scheduler
from cloudtrain.sweep.model import Costs, Limits
from cloudtrain.sweep.sim import Scenario, SeededSampler, SimClock, SimWorld
from cloudtrain.sweep.spec import SweepSpec, check_sweep, trial_recipe
from cloudtrain.sweep.store import StoreJournal, load_snapshot
from tests.conftest import REPO

pytestmark = pytest.mark.quick

BASE = """\
name: s
job: {name: mnist_cnn, params: {epochs: 2, data: bundled}}
sweep:
"""


def write(tmp_path: Path, sweep: str, base: str = BASE) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(base + textwrap.indent(textwrap.dedent(sweep), "  "))
    return path


def check(path: Path) -> SweepSpec:
    return check_sweep(load_recipe(path, sweep=True), Config())


def test_a_grid_sweep_of_the_bundled_job(tmp_path: Path) -> None:
    spec = check(write(tmp_path, """\
        method: grid
        parameters: {lr: [0.001, 0.01], batch_size: [32, 64, 128]}
        budget_usd: 2
        metric: test_accuracy
        goal: max
        early_stopping: {method: successive_halving}
        """))
    assert spec.limits.max_trials == 6 and spec.progress_metric == "val_accuracy" and spec.max_epochs == 2
    assert spec.costs.hourly_usd == 0 and spec.costs.deadline_s == 3600
    assert SweepSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(("sweep", "expected"), [
    ("method: grid\nparameters: {lr: {uniform: [0.1, 0.2]}}\nbudget_usd: 1\nmetric: m\ngoal: max\n",
     "s.yaml:3: sweep: method grid needs a list of values for every parameter; lr is a range"),
    ("method: tpe\nparameters: {lr: [1, 2]}\nbudget_usd: 1\nmetric: m\ngoal: max\n",
     "s.yaml:3: sweep: method tpe needs max_trials"),
    ("parameters: {lr: {loguniform: [0, 1]}}\nmax_trials: 3\nbudget_usd: 1\nmetric: m\ngoal: max\n",
     "s.yaml:4: sweep.parameters.lr: loguniform needs low > 0, got 0.0"),
    ("parameters: {lr: {uniform: [1, 2], choice: [1]}}\nmax_trials: 3\nbudget_usd: 1\nmetric: m\ngoal: max\n",
     "sweep.parameters.lr: give a list of values, or exactly one of"),
    ("parameters: {lr: [1]}\nmax_trials: 3\nbudget_usd: 1\nmetric: m\ngoal: maximum\n",
     "s.yaml:8: sweep.goal: expected one of 'min' or 'max', got 'maximum'"),
    ("parameters: {lr: [1]}\nmax_trials: 3\nbudget: 1\nmetric: m\ngoal: max\n",
     "sweep.budget: unknown key 'budget'; did you mean 'budget_usd'?"),
])
def test_bad_sweep_sections_are_one_located_line(tmp_path: Path, sweep: str, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, sweep), sweep=True)
    assert expected in err.value.one_line()


@pytest.mark.parametrize(("params", "expected", "hint"), [
    ("{lrr: [0.1]}", "s.yaml:5: sweep.parameters.lrr: lrr is not a parameter of mnist_cnn", "did you mean 'lr'?"),
    ("{output: [a]}", "sweep.parameters.output: output is set by cloudtrain", None),
    ("{batch_size: {uniform: [16, 64]}}", "batch_size takes int values, not a float range", "int: [LOW, HIGH]"),
    ("{epochs: [1, 0]}", "sweep.parameters.epochs: epochs: must be >= 1, got 0", None),
    ("{device: [cpu, tpu]}", "expected one of auto, cpu, gpu, got 'tpu'", None),
])
def test_swept_job_parameters_are_checked_against_the_job(tmp_path: Path, params: str, expected: str,
                                                           hint: str | None) -> None:
    path = write(tmp_path, f"method: random\nparameters: {params}\nmax_trials: 2\nbudget_usd: 1\nmetric: m\ngoal: max\n")
    with pytest.raises(RecipeError) as err:
        check(path)
    assert expected in err.value.message
    if hint:
        assert hint in (err.value.hint or "")


def test_a_budget_below_one_trials_worst_case_is_refused_before_anything_exists(tmp_path: Path) -> None:
    base = "name: s\nresources: {cloud: aws, region: us-east-1, instance_type: g4dn.xlarge}\nrun: echo\nsweep:\n"
    path = write(tmp_path, "parameters: {X: [1]}\nmax_trials: 1\nbudget_usd: 0.05\nmetric: m\ngoal: max\n", base)
    with pytest.raises(UsageError) as err:
        check(path)
    assert ("s.yaml:7: sweep.budget_usd: $0.05 does not cover one trial's worst case: $0.69 ($0.526/h x "
            "(10 min boot + 67 min trial + 2 min release))") in err.value.message


def test_the_worst_case_price_is_the_dearest_placement_the_plan_may_fail_over_to(tmp_path: Path) -> None:
    base = "name: s\nresources: {cloud: aws, accelerators: T4:1}\nnum_nodes: 2\nrun: echo\nsweep:\n"
    spec = check(write(tmp_path, "parameters: {X: [1]}\nmax_trials: 1\nbudget_usd: 50\nmetric: m\ngoal: max\n", base))
    from cloudtrain.catalog import default_catalog
    from cloudtrain.plan import make_plan

    recipe = load_recipe(tmp_path / "s.yaml", sweep=True).recipe.model_copy(update={"sweep": None})
    plan = make_plan(recipe, default_catalog(), ["aws"])
    assert spec.costs.hourly_usd == max(p.hourly_price for p in plan.candidates) * 2
    assert spec.costs.hourly_usd > plan.candidates[0].hourly_price * 2


def test_a_sweeps_worst_case_hour_keeps_the_gpu_count_the_recipe_asked_for(tmp_path: Path) -> None:
    # Failover never moves a T4:1 trial to a T4:4 type, so admission need not price every VM at one.
    base = "name: s\nresources: {cloud: aws, accelerators: T4:1, spot: true}\nrun: echo\nsweep:\n"
    spec = check(write(tmp_path, "parameters: {X: [1]}\nmax_trials: 1\nbudget_usd: 5\nmetric: m\ngoal: max\n", base))
    assert spec.costs.hourly_usd == pytest.approx(1.2535)  # the dearest T4:1 spot: g4dn.16xlarge in eu-west-1


def test_a_trial_budget_below_one_billed_minimum_is_refused_before_anything_exists(tmp_path: Path) -> None:
    # Each trial's VM is a launch like any other: its recipe budget must cover one billed minimum.
    base = ("name: s\nresources: {cloud: aws, region: us-east-1, instance_type: p5.48xlarge}\nrun: echo\n"
            "budget: {max_usd: 0.5}\nsweep:\n")
    path = write(tmp_path, "parameters: {X: [1]}\nmax_trials: 1\nbudget_usd: 100\nmetric: m\ngoal: max\n", base)
    with pytest.raises(UsageError) as err:
        check(path)
    assert err.value.one_line() == (
        f"{path}:4: budget.max_usd: $0.50 left, below one billed minimum: one 60 s minimum of p5.48xlarge on aws "
        "costs $0.92 (raise budget.max_usd so that $0.92 of it is left, or choose a cheaper type)")


def test_a_vm_start_is_billed_the_budgets_minimum() -> None:
    from cloudtrain.budget import billed_usd

    costs = Costs(budget_usd=1, hourly_usd=3.6, boot_s=0, prep_s=0, deadline_s=1, post_s=0, release_s=0, min_s=60)
    assert costs.usd(3.6, 1) == billed_usd(3.6, 1, 60) == pytest.approx(0.06)


def test_trial_parameters_reach_the_job_as_flags_or_the_command_as_environment(tmp_path: Path) -> None:
    job = load_recipe(write(tmp_path, "parameters: {lr: [1]}\nmax_trials: 1\nbudget_usd: 1\nmetric: m\ngoal: max\n"),
                      sweep=True)
    loaded, env = trial_recipe(job, {"lr": 0.5, "batch_size": 32})
    assert loaded.recipe.job.params == {"epochs": 2, "data": "bundled", "lr": 0.5, "batch_size": 32}
    assert env == {} and job.recipe.job.params == {"epochs": 2, "data": "bundled"}
    shell = load_recipe(write(tmp_path, "parameters: {LR: [1]}\nmax_trials: 1\nbudget_usd: 1\nmetric: m\ngoal: max\n",
                              "name: s\nrun: echo $LR\nsweep:\n"), sweep=True)
    loaded, env = trial_recipe(shell, {"LR": 0.5, "FAST": True})
    assert env == {"LR": "0.5", "FAST": "true"} and loaded is shell


def test_the_bundled_sweep_recipes_check() -> None:
    local = check_sweep(load_recipe(REPO / "recipes" / "sweep-mnist-local.yaml", sweep=True), Config())
    assert local.limits.max_trials == 4 and local.limits.max_parallel == 2 and local.costs.hourly_usd == 0
    cloud = check_sweep(load_recipe(REPO / "recipes" / "sweep-mnist-aws.yaml", sweep=True), Config())
    assert cloud.early_stopping and cloud.max_epochs == 5 and cloud.log_params == ("lr",)
    assert cloud.costs.new_vm_usd() * cloud.limits.max_parallel <= cloud.costs.budget_usd


def test_the_journal_in_state_gives_back_what_the_scheduler_wrote(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    store.insert_sweep(SweepRecord(id="abc123", name="s", recipe_path="r", recipe_digest="d", status="running",
                                   pid=None, results_dir=str(tmp_path), spec="{}", created_at=1.0, updated_at=1.0))
    costs = Costs(budget_usd=10, hourly_usd=1, boot_s=60, prep_s=60, deadline_s=600, post_s=60, release_s=60)
    clock = SimClock()
    world = SimWorld(costs, Scenario(seed=3), clock)
    scheduler = Scheduler(costs, Limits(max_trials=3, max_parallel=2), SeededSampler(3), clock,
                          StoreJournal(store, "abc123"))
    events: list = []
    for _ in range(6):
        for action in scheduler.step(events):
            from cloudtrain.sweep.core import execute

            execute(world, action)
        events = world.events(1.0)
    row = store.get_sweep("abc123")
    assert row is not None and row.next_slot == scheduler.counters.next_slot
    assert load_snapshot(store, row) == scheduler.snapshot().__class__(
        tuple(sorted(scheduler.trials.values(), key=lambda t: t.number)),
        tuple(sorted(scheduler.attempts.values(), key=lambda a: (a.started_at, a.trial, a.attempt))),
        tuple(sorted(scheduler.vms.values(), key=lambda v: v.slot)), scheduler.counters)


@pytest.mark.parametrize(("xs", "log_distributed", "scale"), [
    ([0.1, 0.01, 0.001, 0.0001], False, "log"),  # a learning rate from a choice list (issue 24.11)
    ([16, 32, 64, 128], False, "linear"),  # batch sizes: within two orders of magnitude
    ([0.01, 0.02], True, "log"),  # sampled log-uniformly
    ([-1.0, 10.0, 1000.0], False, "linear"),  # not all positive: no log axis
    ([], False, "linear"),
])
def test_a_parameters_plot_axis(xs: list, log_distributed: bool, scale: str) -> None:
    from cloudtrain.sweep.results import x_scale

    assert x_scale(xs, log_distributed) == scale
