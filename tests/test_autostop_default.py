"""Issue 24.8: a priced cluster whose recipe says nothing about autostop gets the default one, shown
in `plan`; `autostop: false` opts out; clusters that cost nothing, and sweeps (bounded by their lease),
get none."""

from __future__ import annotations

import pytest

from cloudtrain.cli.plan import autostop_line
from cloudtrain.recipe import DEFAULT_AUTOSTOP, Recipe, bundled_recipes, load_recipe


def _recipe(cloud: str, **extra: object) -> Recipe:
    resources: dict[str, object] = {"cloud": cloud}
    if cloud == "ssh":
        resources["hosts"] = [{"address": "127.0.0.1"}]
    return Recipe.model_validate({"name": "x", "run": "true", "resources": resources, **extra})


@pytest.mark.parametrize(("cloud", "extra", "idle", "is_default"), [
    ("aws", {}, DEFAULT_AUTOSTOP.idle_minutes, True),
    ("gcp", {}, DEFAULT_AUTOSTOP.idle_minutes, True),
    ("azure", {}, DEFAULT_AUTOSTOP.idle_minutes, True),
    ("any", {}, DEFAULT_AUTOSTOP.idle_minutes, True),
    ("aws", {"autostop": False}, None, False),
    ("aws", {"autostop": {"idle_minutes": 5}}, 5, False),
    ("gcp", {"autostop": {"idle_minutes": 45, "down": True}}, 45, False),
    ("local", {}, None, False),
    ("ssh", {}, None, False),
])
def test_default_autostop(cloud: str, extra: dict, idle: int | None, is_default: bool) -> None:
    recipe = _recipe(cloud, **extra)
    assert (recipe.autostop.idle_minutes if recipe.autostop else None) == idle
    assert recipe.autostop_is_default is is_default
    line = autostop_line(recipe)
    assert ("the default for priced clusters" in line) is is_default
    assert line.startswith("autostop: off" if idle is None else "autostop: ")


def test_an_explicit_mapping_equal_to_the_default_is_the_users_choice() -> None:
    recipe = _recipe("aws", autostop={"idle_minutes": DEFAULT_AUTOSTOP.idle_minutes})
    assert recipe.autostop == DEFAULT_AUTOSTOP and not recipe.autostop_is_default


def test_a_sweep_recipe_gets_no_default_autostop() -> None:
    # The bundled AWS sweep names no autostop: its trials' VMs are bounded by the sweep's lease.
    recipe = load_recipe(bundled_recipes()["sweep-mnist-aws"], sweep=True).recipe
    assert recipe.resources.cloud == "aws" and recipe.autostop is None


def test_the_plan_line_names_every_armed_signal() -> None:
    recipe = _recipe("aws", autostop={"idle_minutes": 20, "gpu_util_below": 10, "delete_after_stopped_days": 7})
    line = autostop_line(recipe)
    assert line.startswith("autostop: stop after 20 min idle")
    assert "a job or an SSH session" in line and "every GPU under 10%" in line and "7 day(s) after the stop" in line
    jobs_only = autostop_line(_recipe("aws", autostop={"idle_minutes": 5, "wait_for": "jobs", "down": True}))
    assert jobs_only.startswith("autostop: delete after 5 min idle (busy while a job runs)")
