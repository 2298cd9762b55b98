"""What each cloud sells and for how much: Offer records read from the bundled CSVs.

One CSV per cloud in cloudtrain/catalog_data/ (`aws.csv`, later `gcp.csv`, ...), with the columns
cloud, region, zone, instance_type, accelerator, accelerator_count, vcpus, memory_gib, price,
spot_price. Prices are list prices in USD per hour per instance; spot prices are a typical recent
value, good enough to plan with (the bill is what the cloud charges). An empty zone means the
price holds for every zone of the region.

Loading is lazy and uses only the csv module: `cloudtrain --help` and `status` never read the files,
and reading them costs well under a millisecond per hundred rows.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent.parent / "catalog_data"
COLUMNS = (
    "cloud",
    "region",
    "zone",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "vcpus",
    "memory_gib",
    "price",
    "spot_price",
)


@dataclass(frozen=True)
class Offer:
    cloud: str
    region: str
    zone: str | None
    instance_type: str
    accelerator: str | None  # GPU model as recipes spell it ("T4", "A100"); None for CPU-only types
    accelerator_count: int
    vcpus: int
    memory_gib: float
    price: float  # on-demand USD per hour
    spot_price: float | None  # None: the type is not sold as spot there

    @property
    def accelerators(self) -> str | None:
        """Recipe spelling, e.g. "T4:1"."""
        return f"{self.accelerator}:{self.accelerator_count}" if self.accelerator else None

    def hourly(self, spot: bool) -> float | None:
        return self.spot_price if spot else self.price


class Catalog:
    """An immutable set of offers. Build it from CSV files (lazily) or from Offer records (tests)."""

    def __init__(self, files: Sequence[Path] | None = None, offers: Iterable[Offer] | None = None) -> None:
        self._files = tuple(files) if files is not None else None
        self._offers: tuple[Offer, ...] | None = tuple(offers) if offers is not None else None

    @property
    def offers(self) -> tuple[Offer, ...]:
        if self._offers is None:
            files = self._files if self._files is not None else tuple(sorted(DATA_DIR.glob("*.csv")))
            loaded: list[Offer] = []
            for path in files:
                loaded.extend(read_csv(path))
            self._offers = tuple(loaded)
        return self._offers

    # vocabularies (for did-you-mean and error messages) --------------------------------------

    def clouds(self) -> tuple[str, ...]:
        return tuple(sorted({o.cloud for o in self.offers}))

    def regions(self, cloud: str | None = None) -> tuple[str, ...]:
        return tuple(sorted({o.region for o in self.offers if cloud is None or o.cloud == cloud}))

    def instance_types(self, cloud: str | None = None) -> tuple[str, ...]:
        return tuple(sorted({o.instance_type for o in self.offers if cloud is None or o.cloud == cloud}))

    def accelerator_names(self, cloud: str | None = None) -> tuple[str, ...]:
        return tuple(
            sorted({o.accelerator for o in self.offers if o.accelerator and (cloud is None or o.cloud == cloud)})
        )

    def canonical_accelerator(self, name: str) -> str | None:
        """The catalog's spelling of a GPU name given in any case ("t4" -> "T4"), or None."""
        by_lower = {n.lower(): n for n in self.accelerator_names()}
        return by_lower.get(name.lower())

    # queries ---------------------------------------------------------------------------------

    def query(
        self,
        *,
        cloud: str | Iterable[str] | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        accelerator: str | None = None,
        min_accelerators: int = 0,
        cpu_only: bool = False,
        min_vcpus: float = 0,
        min_memory_gib: float = 0,
        spot: bool = False,
        max_price: float | None = None,
    ) -> list[Offer]:
        """Offers matching every given criterion, cheapest first (price for `spot` as asked).

        With `spot`, offers without a spot price are left out. A zone-less offer matches any zone.
        """
        clouds = {cloud} if isinstance(cloud, str) else (set(cloud) if cloud is not None else None)
        wanted_gpu = accelerator.lower() if accelerator else None
        found = []
        for offer in self.offers:
            price = offer.hourly(spot)
            if price is None:
                continue
            if clouds is not None and offer.cloud not in clouds:
                continue
            if region is not None and offer.region != region:
                continue
            if zone is not None and offer.zone not in (None, zone):
                continue
            if instance_type is not None and offer.instance_type != instance_type:
                continue
            if wanted_gpu is not None and (offer.accelerator or "").lower() != wanted_gpu:
                continue
            if offer.accelerator_count < min_accelerators:
                continue
            if cpu_only and offer.accelerator:
                continue
            if offer.vcpus < min_vcpus or offer.memory_gib < min_memory_gib:
                continue
            if max_price is not None and price > max_price:
                continue
            found.append(offer)
        return sorted(found, key=lambda o: (o.hourly(spot), o.cloud, o.region, o.instance_type, o.zone or ""))

    def find(self, cloud: str, region: str, instance_type: str, zone: str | None = None) -> Offer | None:
        """The offer for one type in one place; a zone-specific row wins over the region's row."""
        rows = [
            o
            for o in self.offers
            if o.cloud == cloud and o.region == region and o.instance_type == instance_type and o.zone in (None, zone)
        ]
        rows.sort(key=lambda o: o.zone is None)
        return rows[0] if rows else None

    def price(
        self, cloud: str, region: str, instance_type: str, *, spot: bool = False, zone: str | None = None
    ) -> float | None:
        offer = self.find(cloud, region, instance_type, zone)
        return offer.hourly(spot) if offer else None

    def describe_type(self, cloud: str, instance_type: str) -> Offer | None:
        """Any offer of the type (hardware is the same in every region): for GPU/CPU decisions."""
        return next((o for o in self.offers if o.cloud == cloud and o.instance_type == instance_type), None)


def read_csv(path: Path) -> list[Offer]:
    """Parse one catalog file; a malformed row names the file and line (the files ship with us)."""
    offers = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: catalog is missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                offers.append(
                    Offer(
                        cloud=row["cloud"].strip(),
                        region=row["region"].strip(),
                        zone=row["zone"].strip() or None,
                        instance_type=row["instance_type"].strip(),
                        accelerator=row["accelerator"].strip() or None,
                        accelerator_count=int(row["accelerator_count"] or 0),
                        vcpus=int(row["vcpus"]),
                        memory_gib=float(row["memory_gib"]),
                        price=float(row["price"]),
                        spot_price=float(row["spot_price"]) if row["spot_price"].strip() else None,
                    )
                )
            except (ValueError, AttributeError) as exc:
                raise ConfigError(f"{path}:{line}: bad catalog row: {exc}") from None
    return offers


@functools.cache
def default_catalog() -> Catalog:
    """The bundled catalog, shared by every caller in the process (loaded on first query)."""
    return Catalog()
