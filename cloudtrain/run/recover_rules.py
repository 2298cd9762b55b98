"""The pure rules of a run's recovery (run/recover.py): what a loss rules out, what is left of the budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError

if TYPE_CHECKING:
    from cloudtrain.plan import Placement
    from cloudtrain.recipe import Budget


class NodeLostError(CloudtrainError):
    """The run's node went away and recovery could not (or may no longer) relaunch it."""


def budget_left(budget: Budget, spent_usd: float, hours: float) -> Budget:
    """What the next attempt may spend: the budget less what every attempt so far spent and the
    time the run has taken. Raises NodeLostError when nothing is left. The relaunch is planned with
    it, so no placement whose first billed minimum is over what is left is tried (plan.make_plan,
    budget.minimum_fits): $0.36 left never starts a machine whose minimum costs $1.64."""
    from cloudtrain.recipe import Budget

    left_usd = budget.max_usd - spent_usd if budget.max_usd is not None else None
    left_h = budget.max_hours - hours if budget.max_hours is not None else None
    if (left_usd is not None and left_usd <= 0) or (left_h is not None and left_h <= 0):
        raise NodeLostError(f"not relaunched: the budget is spent (${spent_usd:.4f} and {hours:.2f} h so far)")
    # (Constructed: the amounts left are positive, checked above.)
    return Budget.model_construct(max_usd=left_usd, max_hours=left_h)


def rule_out(avoid: dict[tuple[str, str | None], tuple[str, ...]], cloud: str, region: str | None,
             zone: str | None) -> None:
    """Note what a loss at (cloud, region, zone) rules out: its zone, or the whole region for a
    machine that has no zone (Azure's regional VMs); "*" stands for the whole region."""
    key = (cloud, region)
    avoid[key] = tuple(dict.fromkeys((*avoid.get(key, ()), zone))) if zone else ("*",)


def next_candidates(candidates: Sequence[Placement],
                    avoid: dict[tuple[str, str | None], tuple[str, ...]]) -> tuple[Placement, ...]:
    """The plan's placements in their order (zone -> region -> cloud by price) without what losses
    ruled out: a region keeps its other zones (the provider skips `avoid_zones`), a region ruled
    out whole goes. Raises NodeLostError when nothing is left."""
    out = []
    for placement in candidates:
        avoided = avoid.get((placement.cloud, placement.region), ())
        if "*" in avoided:
            continue
        out.append(replace(placement, avoid_zones=avoided) if avoided else placement)
    if not out:
        raise NodeLostError("not relaunched: every placement of the plan was ruled out by a loss")
    return tuple(out)
