"""Budget arithmetic: how long a recipe's budget lets a cluster run. One owner, used by launch
(the deadline in the launch request) and by the on-node watchdog's settings alike.

And the rule that a start fits its budget including the cloud's minimum billed time
(`minimum_fits`): plan.make_plan applies it to every placement, so neither a launch, nor a
recovery's relaunch (planned with what is left), nor a sweep's VM can start where one minimum
alone is over the budget."""

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


def least_billed_usd(cloud: str, cluster_hourly: float) -> float:
    """What one start of a cluster costs at the least: its cloud's minimum billed time
    (catalog_data/storage/minimums.csv) at the cluster's hourly price, whatever it then runs."""
    from cloudtrain.cost import billing_minimum_s, cost_usd

    return cost_usd(cluster_hourly, billing_minimum_s(cloud))


def billed_usd(cluster_hourly: float, seconds: float, min_s: float) -> float:
    """What one start billed for `seconds` costs: at least `min_s` (the cloud's minimum)."""
    return max(0.0, cluster_hourly) * max(seconds, min_s, 0.0) / 3600.0


def minimum_fits(max_usd: float | None, cloud: str, cluster_hourly: float) -> bool:
    """The rule every launch, relaunch and sweep VM is held to: its first billed minimum fits what is
    left of the budget (`max_usd`; None: no money limit). A start is billed its minimum even if the
    machine goes a second later, so a launch whose minimum is over the budget is over it by itself."""
    if max_usd is None:
        return True
    # To a hundredth of a cent: float noise never refuses a budget that covers the minimum exactly.
    return round(least_billed_usd(cloud, cluster_hourly), 4) <= round(max_usd, 4)


def below_minimum(max_usd: float, cloud: str, what: str, cluster_hourly: float) -> tuple[str, str]:
    """The one-line refusal (message, hint) of a launch whose first billed minimum is over what is
    left (`max_usd`): what, the numbers, and what to change. `what`: e.g. "p5.48xlarge on aws"."""
    from cloudtrain.cost import billing_minimum_s

    least, min_s = least_billed_usd(cloud, cluster_hourly), billing_minimum_s(cloud)
    return (f"budget.max_usd: {usd(max_usd)} left, below one billed minimum: one {min_s:g} s minimum "
            f"of {what} costs {usd(least)}",
            f"raise budget.max_usd so that {usd(least)} of it is left, or choose a cheaper type")


def usd(amount: float) -> str:
    """Dollars for a budget line: cents, or more digits where cents would read as $0.00."""
    return f"${amount:.2f}" if amount >= 0.1 or amount == 0 else f"${amount:.4f}"
