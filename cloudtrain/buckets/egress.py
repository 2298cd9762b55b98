"""What copying a recipe's bucket data to the plan's placement costs in transfer (`plan` warns).

Pure: the recipe says where a bucket is (`data[].region`) and about how big it is (`size_gb`);
prices are catalog data (catalog_data/storage/egress.csv, each row naming its source): the store's
cloud bills a transfer to another of its regions (inter-region) or out of it (internet).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cloudtrain.buckets.url import parse_bucket_url


@dataclass(frozen=True)
class EgressRate:
    cloud: str  # the cloud the store belongs to
    scope: str  # inter-region | internet
    usd_per_gb: float


@dataclass(frozen=True)
class Egress:
    source: str
    field: str  # data.<i>
    bucket_region: str
    run_cloud: str
    run_region: str
    scope: str
    usd_per_gb: float
    size_gb: float | None

    @property
    def usd(self) -> float | None:
        return None if self.size_gb is None else round(self.size_gb * self.usd_per_gb, 2)

    def line(self) -> str:
        where = (f"{self.run_cloud}/{self.run_region}" if self.scope == "internet"
                 else f"{self.run_region}")
        cost = (f"about ${self.usd:.2f} per full copy of {self.size_gb:g} GB" if self.size_gb is not None
                else f"set {self.field}.size_gb for an estimate")
        return (f"{self.source} is in {self.bucket_region}, the plan runs in {where}: {self.scope} transfer at "
                f"${self.usd_per_gb}/GB, {cost} (only what changed is copied again to a kept node)")


@cache
def rates() -> dict[str, tuple[EgressRate, ...]]:
    found: dict[str, list[EgressRate]] = {}
    with open(Path(__file__).resolve().parent.parent / "catalog_data" / "storage" / "egress.csv", newline="") as f:
        for row in csv.DictReader(f):
            found.setdefault(row["store"], []).append(EgressRate(row["cloud"], row["scope"], float(row["usd_per_gb"])))
    return {k: tuple(v) for k, v in found.items()}


def egress_for(recipe: object, run_cloud: str, run_region: str | None) -> tuple[Egress, ...]:
    """The bucket sources whose data would cross a region or leave their cloud to reach the plan."""
    found = []
    for i, mount in enumerate(getattr(recipe, "data", [])):
        region = getattr(mount, "region", None)
        if not mount.is_bucket or region is None or run_region is None:
            continue
        store_rates = {r.scope: r for r in rates().get(parse_bucket_url(mount.source).store.value, ())}
        home = next(iter(store_rates.values())).cloud if store_rates else None
        scope = "internet" if home != run_cloud else ("inter-region" if region != run_region else None)
        if scope is None or scope not in store_rates:
            continue
        found.append(Egress(mount.source, f"data.{i}", region, run_cloud, run_region, scope,
                            store_rates[scope].usd_per_gb, getattr(mount, "size_gb", None)))
    return tuple(found)
