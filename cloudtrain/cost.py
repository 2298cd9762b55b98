"""Price x billed time: the only arithmetic spend is made of.

Spend comes from billed intervals in state (one per node and billing state: running at the
compute price of the plan's placement, stopped at the disk price), never from a cluster's age.
"""

from __future__ import annotations

import csv
import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.state import BillingRecord

# Not beside the offer CSVs (the catalog reads every *.csv there): disk prices per cloud, and the
# flat hourly prices of things billed whatever their size (a public IP address), per cloud and kind.
_STORAGE = Path(__file__).resolve().parent / "catalog_data" / "storage" / "disks.csv"
_FLAT = Path(__file__).resolve().parent / "catalog_data" / "storage" / "flat.csv"
HOURS_PER_MONTH = 730.0

_MINIMUMS = Path(__file__).resolve().parent / "catalog_data" / "storage" / "minimums.csv"


@functools.cache
def _minimums() -> dict[str, float]:
    with _MINIMUMS.open(newline="") as handle:
        return {row["cloud"]: float(row["min_billed_s"]) for row in csv.DictReader(handle)}


def billing_minimum_s(cloud: str) -> float:
    """The least compute `cloud` bills per start, in seconds (minimums.csv, each row naming its
    source); 0 for machines nobody bills."""
    return _minimums().get(cloud, 0.0)


def cost_usd(hourly_price: float, seconds: float) -> float:
    """Cost of something billed at `hourly_price` for `seconds`."""
    return max(0.0, hourly_price) * max(0.0, seconds) / 3600.0


@functools.cache
def _storage() -> dict[str, tuple[float, float]]:
    with _STORAGE.open(newline="") as handle:
        return {row["cloud"]: (float(row["usd_per_gb_month"]), float(row["default_disk_gb"]))
                for row in csv.DictReader(handle)}


def disk_price(cloud: str) -> float | None:
    """What `cloud`'s disks cost, in USD per GB-month (disks.csv); None where the table has no row
    for that cloud (no real disk is free: callers must not read that as $0)."""
    row = _storage().get(cloud)
    return None if row is None else row[0]


def disk_hourly(cloud: str, disk_gb: float | None = None) -> float:
    """What one node's boot disk (`disk_gb`, else the cloud's default size) costs per hour while the
    node is stopped; 0 where the table has no price (billing a stop needs a number; see disk_price)."""
    price, default_gb = _storage().get(cloud, (0.0, 0.0))
    return price * (disk_gb or default_gb) / HOURS_PER_MONTH


@functools.cache
def _flat() -> dict[tuple[str, str], float]:
    with _FLAT.open(newline="") as handle:
        return {(row["cloud"], row["kind"]): float(row["usd_per_hour"]) for row in csv.DictReader(handle)}


def flat_hourly(cloud: str, kind: str) -> float | None:
    """The hourly price of one `kind` (e.g. "public-ip") on `cloud` where it is billed at a flat rate
    whatever its size (flat.csv, each row naming its source); None where the table has no row."""
    return _flat().get((cloud, kind))


@dataclass(frozen=True)
class Spend:
    usd: float
    billed_s: float  # node-seconds billed
    running: bool  # some interval is still open


def spend(intervals: Iterable[BillingRecord], since: float = 0.0, until: float | None = None) -> Spend:
    """Sum of price x billed time of `intervals` from `since` (each start billed at least its
    cloud's minimum). `billed_s` counts compute node-seconds only; disks are in `usd`."""
    end = time.time() if until is None else until
    usd = seconds = 0.0
    running = False
    for item in intervals:
        usd += item.cost(end, since)
        if item.kind == "running":
            seconds += item.billed_seconds(end, since)
        running = running or item.ended_at is None
    return Spend(usd, seconds, running)
