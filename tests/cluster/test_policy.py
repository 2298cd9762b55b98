"""Limits that hold (issue 39.4): the config's `policy:` floors, refused in one line for a recipe
(preflight: validate, plan, up, run) and for `cloudtrain autostop` (a live change), exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import UsageError
from cloudtrain.policy import Policy, check_autostop, effective_policy, recipe_refusal
from cloudtrain.recipe import Recipe
from tests.conftest import cloudtrain

FLOOR = Policy(max_idle_minutes=60, max_hours=24)
AWS = {"cloud": "aws", "instance_type": "t3.medium"}


def recipe(**fields: Any) -> Recipe:
    return Recipe.model_validate({"name": "p", "run": "true", "resources": fields.pop("resources", AWS), **fields})


@pytest.mark.parametrize("fields,policy,refused", [
    # autostop: at the floor passes, above it and off are refused; the default (30) is under 60.
    ({"autostop": {"idle_minutes": 60}, "budget": {"max_hours": 24}}, FLOOR, None),
    ({"budget": {"max_hours": 2}}, FLOOR, None),
    ({"autostop": {"idle_minutes": 61}, "budget": {"max_hours": 1}}, FLOOR,
     ("autostop.idle_minutes", "61 is more than policy max_idle_minutes 60 (config)")),
    ({"autostop": False, "budget": {"max_hours": 1}}, FLOOR,
     ("autostop", "autostop: false turns autostop off, which policy max_idle_minutes 60 (config) does not allow")),
    ({"budget": {"max_hours": 2}}, Policy(max_idle_minutes=20), ("autostop.idle_minutes", "30 is more than "
                                                                  "policy max_idle_minutes 20 (config)")),
    # budget: a missing one or max_usd alone has no hour limit; more hours than the floor.
    ({}, FLOOR, ("budget", "no budget.max_hours, which policy max_hours 24 (config) requires")),
    ({"budget": {"max_usd": 5}}, FLOOR, ("budget", "no budget.max_hours, which policy max_hours 24 (config) requires")),
    ({"budget": {"max_hours": 24.5}}, FLOOR, ("budget.max_hours", "24.5 is more than policy max_hours 24 (config)")),
    # No policy, or a cloud that bills nothing: nothing to hold.
    ({"autostop": False}, Policy(), None),
    ({"resources": {"cloud": "local"}}, FLOOR, None),
])
def test_recipe_refusals(fields: dict[str, Any], policy: Policy, refused: tuple[str, str] | None) -> None:
    found = recipe_refusal(recipe(**fields), policy)
    assert (found[:2] if found else None) == refused


@pytest.mark.parametrize("idle,cancel,refused", [
    (60, False, None),
    (61, False, "autostop -i 61: more than policy max_idle_minutes 60 (config)"),
    (None, True, "autostop --cancel: policy max_idle_minutes 60 (config) does not allow turning autostop off"),
])
def test_autostop_refusals(idle: int | None, cancel: bool, refused: str | None) -> None:
    if refused is None:
        check_autostop("c", idle, cancel, FLOOR)
        check_autostop("c", None, True, Policy(max_hours=3))  # no idle floor: --cancel is the user's
        return
    with pytest.raises(UsageError) as caught:
        check_autostop("c", idle, cancel, FLOOR)
    assert caught.value.message == refused and "-i 60" in (caught.value.hint or "")


def test_the_config_key_is_validated_and_is_the_policy_in_force() -> None:
    config = Config.model_validate({"policy": {"max_idle_minutes": 60, "max_hours": 24}})
    assert effective_policy(config) == FLOOR
    assert effective_policy(Config()).empty
    with pytest.raises(ValueError):
        Config.model_validate({"policy": {"max_idle_minutes": 0}})
    with pytest.raises(ValueError):
        Config.model_validate({"policy": {"max_minutes": 5}})


@pytest.fixture
def floor(cloudtrain_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text("policy: {max_idle_minutes: 60, max_hours: 24}\n")
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    return tmp_path


def test_a_recipe_cannot_lift_the_floor(floor: Path) -> None:
    path = floor / "r.yaml"
    path.write_text("name: p\nresources: {cloud: aws, instance_type: t3.medium}\nrun: 'true'\n"
                    "autostop: {idle_minutes: 120}\nbudget: {max_hours: 2}\n")
    refused = cloudtrain("validate", str(path))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{path}:4: autostop.idle_minutes: 120 is more than policy max_idle_minutes 60 " \
                                "(config)" in lines[0], refused.stderr
    path.write_text(path.read_text().replace("120", "45"))
    assert cloudtrain("validate", str(path)).returncode == 0


def test_autostop_cancel_cannot_lift_the_floor(floor: Path) -> None:
    refused = cloudtrain("autostop", "some-cluster", "--cancel")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "autostop --cancel: policy max_idle_minutes 60 (config) does not allow turning " \
                               "autostop off" in lines[0], refused.stderr
