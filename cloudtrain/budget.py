"""Budget arithmetic: how long a recipe's budget lets a cluster run. One owner, used by launch
(the deadline in the launch request) and by the on-node watchdog's settings alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.recipe import Budget


def budget_limit(budget: Budget | None, cluster_hourly: float) -> tuple[float, str] | None:
    """Seconds of running time the budget allows and why: the smaller of max_hours and
    max_usd / the cluster's hourly price (a free cluster has no money limit)."""
    if budget is None:
        return None
    limits = []
    if budget.max_hours is not None:
        limits.append((budget.max_hours * 3600.0, f"max_hours {budget.max_hours:g}"))
    if budget.max_usd is not None and cluster_hourly > 0:
        limits.append((budget.max_usd / cluster_hourly * 3600.0,
                       f"max_usd {budget.max_usd:g} at ${cluster_hourly:.4g}/h"))
    return min(limits) if limits else None
