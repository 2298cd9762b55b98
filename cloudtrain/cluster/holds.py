"""A launch's worst case, held against the team's budgets (state/budgets.py) with its intent.

The worst case is what the launch request lets the cloud bill: the cluster's compute at the
placement's price until the deadline the request carries (the recipe budget's max_hours, or
max_usd at that price, or a sweep's lease; plus the deadline's backstop grace), never less than
the cloud's minimum per start, and the nodes' disks for as long. A launch with no deadline
(neither budget nor lease) has no bounded worst case: under a covering budget it is refused.
"""

from __future__ import annotations

from typing import Any

from cloudtrain.state import StateStore


def worst_case_usd(cloud: str, hourly_per_node: float, num_nodes: int, max_run_s: float | None,
                   disk_gb: float | None) -> float | None:
    """What one launch at this placement can cost at most; None where nothing bounds it."""
    from cloudtrain.budget import billed_usd
    from cloudtrain.cost import billing_minimum_s, disk_hourly
    from cloudtrain.providers.deadline import deadline_seconds

    if hourly_per_node <= 0:
        return 0.0  # a free placement (this machine, given hosts): nothing to hold
    if max_run_s is None:
        return None
    seconds = float(deadline_seconds(max_run_s))
    compute = billed_usd(hourly_per_node * num_nodes, seconds, billing_minimum_s(cloud))
    return compute + disk_hourly(cloud, disk_gb) * num_nodes * seconds / 3600.0


def precheck(store: StateStore, owner: str, cloud: str, hourly_per_node: float, num_nodes: int,
             max_run_s: float | None, disk_gb: float | None) -> None:
    """Before any cloud call: refuse a launch whose first placement's worst case does not fit what
    is left (the hold with the intent decides races; this spares a refused launch its key and
    firewall calls)."""
    from cloudtrain.state.budgets import check_launch

    check_launch(store, owner=owner, worst_usd=worst_case_usd(cloud, hourly_per_node, num_nodes, max_run_s, disk_gb))


def write_intent(store: StateStore, intent: dict[str, Any], *, owner: str, cloud: str, hourly_per_node: float,
                 num_nodes: int, max_run_s: float | None, disk_gb: float | None) -> None:
    """The launch intent (the cluster row, before the create call) and its hold, in one transaction."""
    from cloudtrain.state.budgets import hold_launch

    hold_launch(store, intent, owner=owner,
                worst_usd=worst_case_usd(cloud, hourly_per_node, num_nodes, max_run_s, disk_gb))
