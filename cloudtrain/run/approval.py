"""Price before launch: what `run` / `up` are about to start billing, for the user to approve.

The pipeline builds a `SpendRequest` once the plan is known (after the static checks and the
credentials call, before any run directory, state row, key or instance exists) and hands it to the
approver the CLI gave it; the CLI shows it and asks on a terminal (cli/approve.py). Only what starts
billing asks: a new cluster on a priced cloud, or a stopped one started again. A warm run on a
cluster that is already up asks nothing (it would break the edit-run loop for no new decision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.recipe import Budget, Recipe


@dataclass(frozen=True)
class SpendRequest:
    cluster: str
    action: str  # "launch" (a new cluster) | "start" (a stopped one)
    what: str  # where and at what price, e.g. "g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h"
    hourly_usd: float  # the whole cluster
    worst_case: str  # what bounds the spend: the budget, autostop, or nothing
    skipped: tuple[tuple[str, str], ...] = ()  # (cloud, why) left out of the plan

    def headline(self) -> str:
        verb = "launch new cluster" if self.action == "launch" else "start stopped cluster"
        return f"{verb} {self.cluster}: {self.what}; {self.worst_case}"


Approver = Callable[[SpendRequest], None]  # returns to proceed; raises (Declined, UsageError) to stop


def worst_case(recipe: Recipe, hourly_usd: float) -> str:
    """The spend bound the node enforces (cloudtrain/node/): the smaller of the budget's hours
    at this price and its dollars; otherwise what autostop bounds, or nothing."""
    bound = _budget_bound(recipe.budget, hourly_usd)
    if bound is not None:
        usd, why = bound
        return f"at most ${usd:.2f} ({why}, enforced on the machine)"
    if recipe.autostop is not None:
        return (f"no budget: it bills until you stop it or it is idle {recipe.autostop.idle_minutes:g} min "
                f"(autostop); set budget.max_usd for a hard limit")
    return "no budget or autostop: it bills until you stop it (set budget.max_usd or autostop.idle_minutes)"


def _budget_bound(budget: Budget | None, hourly_usd: float) -> tuple[float, str] | None:
    if budget is None:
        return None
    bounds = []
    if budget.max_hours is not None:
        bounds.append((budget.max_hours * hourly_usd, f"budget {budget.max_hours:g} h"))
    if budget.max_usd is not None:
        bounds.append((budget.max_usd, f"budget ${budget.max_usd:g}"))
    return min(bounds) if bounds else None


def for_launch(cluster: str, recipe: Recipe, usable: object) -> SpendRequest:
    from cloudtrain.cluster.planning import UsablePlan

    assert isinstance(usable, UsablePlan)
    plan = usable.plan
    what = plan.best.describe()
    if plan.num_nodes > 1:
        what = f"{plan.num_nodes} x {what} = ${plan.hourly_cost:.4g}/h"
    # The budget's hours are bounded at the dearest placement failover may move the cluster to.
    return SpendRequest(cluster, "launch", what, plan.hourly_cost, worst_case(recipe, plan.worst_hourly_cost),
                        tuple(usable.skipped))


def for_start(cluster: str, recipe: Recipe, provider: str, region: str | None, instance_type: str | None,
              num_nodes: int, hourly_usd: float) -> SpendRequest:
    where = "/".join(p for p in (provider, region) if p)
    what = f"{num_nodes} x {instance_type or 'node'} in {where} at ${hourly_usd:.4g}/h"
    return SpendRequest(cluster, "start", what, hourly_usd, worst_case(recipe, hourly_usd))
