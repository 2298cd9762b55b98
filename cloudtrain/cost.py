"""Price x time accounting."""

from __future__ import annotations


def cost_usd(hourly_price: float, seconds: float) -> float:
    """Cost of a cluster billed at `hourly_price` (all nodes together) for `seconds`."""
    return max(0.0, hourly_price) * max(0.0, seconds) / 3600.0
