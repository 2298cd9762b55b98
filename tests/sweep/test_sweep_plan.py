"""A sweep's plan is its trials' as they run (issue 36.1, left over): trials run without the
pipeline's recovery (the scheduler owns a lost trial's retry), so a spot sweep's plan promises no
`recover: up to N relaunch(es)`; `retry_line` says what the sweep does instead."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cloudtrain.config import Config
from cloudtrain.preflight import preflight
from cloudtrain.recipe import LoadedRecipe, load_recipe
from cloudtrain.sweep.spec import base_recipe, check_sweep, retry_line, trial_base, trial_plan

pytestmark = pytest.mark.quick

SWEEP = """\
sweep:
  method: grid
  parameters: {LR: [0.1, 0.2]}
  budget_usd: 20
  metric: accuracy
  goal: max
"""


def _load(tmp_path: Path, resources: str, extra: str = "", sweep: str = SWEEP) -> LoadedRecipe:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nresources: {resources}\nrun: echo $LR\n{extra}" + textwrap.dedent(sweep))
    return load_recipe(path, sweep=True)


SPOT = "{cloud: aws, accelerators: T4:1, spot: true}"


def test_a_spot_sweeps_plan_promises_no_relaunch(tmp_path: Path) -> None:
    loaded = _load(tmp_path, SPOT)  # recover: left out, so on by default for spot (3 relaunches)
    as_written = preflight(base_recipe(loaded), Config())
    assert as_written is not None and "recover: up to 3 relaunch(es)" in as_written.summary()  # what it used to say
    plan = trial_plan(loaded, Config())
    assert plan is not None and plan.max_restarts is None and "relaunch" not in plan.summary()
    # Only the promise changed: the same placements, so the same worst-case hour for admission.
    assert plan.candidates == as_written.candidates
    spec = check_sweep(loaded, Config())
    assert spec.costs.hourly_usd == max(p.hourly_price for p in plan.candidates)


def test_a_trial_runs_without_the_recipes_recovery(tmp_path: Path) -> None:
    loaded = _load(tmp_path, SPOT, extra="recover: {max_restarts: 5, watch_s: 3}\n")
    assert loaded.recipe.recovery is not None and loaded.recipe.recovery.max_restarts == 5
    trial = trial_base(loaded)
    assert trial.recipe.recovery is None and trial.recipe.sweep is None
    assert loaded.recipe.recovery.max_restarts == 5  # the loaded recipe is left as written (the watcher's watch_s)


@pytest.mark.parametrize(("resources", "extra", "retries", "expected"), [
    (SPOT, "", 1, "retries: the sweep runs a failed, preempted or lost trial again, up to 1 time(s), on a VM it "
                  "counts against the budget (a preempted or lost one carries its kept checkpoint over); the "
                  "recipe's recover: (up to 3 relaunch(es)) does not apply to trials"),
    (SPOT, "recover: {max_restarts: 5}\n", 3, "up to 3 time(s)"),
    (SPOT, "recover: {max_restarts: 5}\n", 3, "the recipe's recover: (up to 5 relaunch(es)) does not apply"),
    ("{cloud: aws, accelerators: T4:1}", "", 2, "up to 2 time(s), on a VM it counts against the budget (a preempted "
                                                "or lost one carries its kept checkpoint over)"),
    ("{cloud: aws, accelerators: T4:1}", "", 0, "retries: none (sweep.max_retries: 0): a failed, preempted or lost "
                                                "trial ends failed"),
])
def test_the_retry_line_says_what_the_sweep_does_with_a_lost_trial(tmp_path: Path, resources: str, extra: str,
                                                                   retries: int, expected: str) -> None:
    loaded = _load(tmp_path, resources, extra, SWEEP + f"  max_retries: {retries}\n")
    spec = check_sweep(loaded, Config())
    assert spec.limits.max_retries == retries
    line = retry_line(loaded, spec)
    assert expected in line
    if loaded.recipe.recovery is None:
        assert "recover:" not in line  # on-demand without recover: nothing to disclaim
