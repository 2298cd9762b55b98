"""What each cloud sells and for how much: Offer records read from the bundled CSVs and from refreshes.

One CSV per cloud in cloudtrain/catalog_data/ (`aws.csv`, `gcp.csv`, `azure.csv`), with the columns
cloud, region, zone, instance_type, accelerator, accelerator_count, vcpus, memory_gib, price,
spot_price, and optionally gpu_memory_gib (per GPU) and price_date (YYYY-MM-DD, when the price was
taken), price_source (where the price was published: a URL or a repository path) and price_note
(why a price is missing, or what to know about it). A file without the optional columns loads as
before; its offers have no GPU memory, no date and no source. An empty `price` means the type is sold
there but no published price is known to cloudtrain: such an offer is listed (`price unknown`) and
never planned on (query() leaves it out), so nothing is priced on a guess. Prices are list prices in USD per hour per instance; spot prices are a typical recent value,
good enough to plan with (the bill is what the cloud charges). An empty zone means the price holds
for every zone of the region.

`cloudtrain catalog refresh` (catalog/refresh.py) writes refreshed rows, in the same format, to
`$CLOUDTRAIN_HOME/catalog/<cloud>.csv`, never to the bundled files. The default catalog reads both:
for one instance type in one region the rows with the newer price date win (an undated row is the
oldest; on a tie the refreshed rows win), so an upgrade that ships newer bundled prices is not hidden
by an older refresh, and a type the refresh source does not carry keeps its bundled rows.

Loading is lazy and uses only the csv module: `cloudtrain --help` and `status` never read the files.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
OPTIONAL_COLUMNS = ("gpu_memory_gib", "price_date", "price_source", "price_note")
PRICE_UNKNOWN = "price unknown (no published price in the catalog cloudtrain knows; `cloudtrain catalog refresh`)"
STALE_AFTER_DAYS = 90  # a price taken longer ago than this is flagged by `cloudtrain catalog`


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
    price: float | None  # on-demand USD per hour; None: sold there, but no published price is known
    spot_price: float | None  # None: the type is not sold as spot there
    gpu_memory_gib: float | None = None  # per GPU; None: not known (or no GPU)
    price_date: dt.date | None = None  # when the price was taken; None: not known
    # Where the row came from: "bundled" (shipped with cloudtrain) or "refreshed" (`catalog refresh`);
    # not part of an offer's identity.
    source: str | None = field(default=None, compare=False)
    # Where the price was published (URL or repository path) and a note (why it is missing).
    price_source: str | None = field(default=None, compare=False)
    price_note: str | None = field(default=None, compare=False)

    @property
    def accelerators(self) -> str | None:
        """Recipe spelling, e.g. "T4:1"."""
        return f"{self.accelerator}:{self.accelerator_count}" if self.accelerator else None

    def hourly(self, spot: bool) -> float | None:
        return self.spot_price if spot else self.price

    @property
    def priced(self) -> bool:
        return self.price is not None

    def age_days(self, today: dt.date) -> int | None:
        return (today - self.price_date).days if self.price_date is not None else None

    def stale(self, today: dt.date, max_days: int = STALE_AFTER_DAYS) -> bool:
        """Older than `max_days`, or of unknown date (nothing says it is still right)."""
        age = self.age_days(today)
        return age is None or age > max_days


def user_catalog_dir() -> Path:
    """Where `catalog refresh` writes: $CLOUDTRAIN_HOME/catalog/ (may not exist yet: reading never
    creates anything, `validate` must not)."""
    from cloudtrain.paths import home_path

    return home_path() / "catalog"


def bundled_files() -> tuple[Path, ...]:
    return tuple(sorted(DATA_DIR.glob("*.csv")))


class Catalog:
    """An immutable set of offers. Build it from CSV files (lazily) or from Offer records (tests).

    `Catalog()` is the bundled files plus the user's refreshed files. `files` names the base files
    instead (then only `overrides` are laid over them, none by default); `offers` gives the records.
    """

    def __init__(
        self,
        files: Sequence[Path] | None = None,
        offers: Iterable[Offer] | None = None,
        overrides: Sequence[Path] | None = None,
    ) -> None:
        self._files = tuple(files) if files is not None else None
        self._overrides = tuple(overrides) if overrides is not None else None
        self._offers: tuple[Offer, ...] | None = tuple(offers) if offers is not None else None
        self._override_files: tuple[Path, ...] = ()

    @property
    def offers(self) -> tuple[Offer, ...]:
        if self._offers is None:
            files = self._files if self._files is not None else bundled_files()
            if self._overrides is not None:
                overrides = self._overrides
            elif self._files is None:
                folder = user_catalog_dir()
                overrides = tuple(sorted(folder.glob("*.csv"))) if folder.is_dir() else ()
            else:
                overrides = ()
            loaded: list[Offer] = []
            for path in files:
                loaded.extend(read_csv(path, source="bundled" if self._files is None else None))
            newer: list[Offer] = []
            for path in overrides:
                newer.extend(read_csv(path, hint="a refreshed catalog file: delete it or run `cloudtrain catalog refresh`",
                                      source="refreshed"))
            self._override_files = tuple(overrides)
            self._offers = tuple(merge(loaded, newer)) if newer else tuple(loaded)
        return self._offers

    @property
    def override_files(self) -> tuple[Path, ...]:
        """The refreshed files laid over the base ones (after loading)."""
        _ = self.offers
        return self._override_files

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

    def unpriced(
        self,
        *,
        cloud: str | Iterable[str] | None = None,
        region: str | None = None,
        instance_type: str | None = None,
        accelerator: str | None = None,
        min_accelerators: int = 0,
    ) -> list[Offer]:
        """Offers sold there whose price the catalog does not know (empty `price`): what query()
        leaves out, so a caller can say "price unknown" instead of "not offered"."""
        clouds = {cloud} if isinstance(cloud, str) else (set(cloud) if cloud is not None else None)
        wanted_gpu = accelerator.lower() if accelerator else None
        return sorted(
            (o for o in self.offers
             if o.price is None
             and (clouds is None or o.cloud in clouds)
             and (region is None or o.region == region)
             and (instance_type is None or o.instance_type == instance_type)
             and (wanted_gpu is None or (o.accelerator or "").lower() == wanted_gpu)
             and o.accelerator_count >= min_accelerators),
            key=lambda o: (o.cloud, o.region, o.instance_type, o.zone or ""))

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


def merge(base: Iterable[Offer], newer: Iterable[Offer]) -> list[Offer]:
    """`base` with `newer` laid over it, one instance type in one region at a time: the side whose
    newest price date is later wins every row of that type there (zone rows and the region row
    alike, so a refresh that prices zones replaces a bundled region row); an undated side loses to
    a dated one, and on a tie `newer` wins. Order: base's, then types only `newer` has."""
    base_groups: dict[tuple[str, str, str], list[Offer]] = {}
    new_groups: dict[tuple[str, str, str], list[Offer]] = {}
    for offer in base:
        base_groups.setdefault(_group(offer), []).append(offer)
    for offer in newer:
        new_groups.setdefault(_group(offer), []).append(offer)
    replaced = {g for g, rows in new_groups.items()
                if g not in base_groups or _newest(rows) >= _newest(base_groups[g])}
    merged: list[Offer] = []
    for group, rows in base_groups.items():
        merged.extend(new_groups[group] if group in replaced else rows)
    for group, rows in new_groups.items():
        if group not in base_groups:
            merged.extend(rows)
    return merged


def _group(offer: Offer) -> tuple[str, str, str]:
    return (offer.cloud, offer.region, offer.instance_type)


def _newest(offers: Iterable[Offer]) -> dt.date:
    return max(o.price_date or dt.date.min for o in offers)


def _optional_float(text: str | None) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


@functools.lru_cache(maxsize=256)  # a file has few distinct dates: parse each once
def _optional_date(text: str | None) -> dt.date | None:
    text = (text or "").strip()
    return dt.date.fromisoformat(text) if text else None


def _optional_text(row: list[str], index: int | None) -> str | None:
    if index is None or index >= len(row):
        return None
    return row[index].strip() or None


def read_csv(path: Path, hint: str | None = None, source: str | None = None) -> list[Offer]:
    """Parse one catalog file; a malformed row names the file and line. The optional columns
    (OPTIONAL_COLUMNS) may be missing from the header or empty in a row."""
    offers = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ConfigError(f"{path}: catalog is missing column(s) {', '.join(missing)}", hint=hint)
        (cloud, region, zone, kind, gpu, count, vcpus, memory, price, spot) = (header.index(c) for c in COLUMNS)
        gpu_memory, date, price_source, price_note = (header.index(c) if c in header else None
                                                      for c in OPTIONAL_COLUMNS)
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                offers.append(
                    Offer(
                        cloud=row[cloud].strip(),
                        region=row[region].strip(),
                        zone=row[zone].strip() or None,
                        instance_type=row[kind].strip(),
                        accelerator=row[gpu].strip() or None,
                        accelerator_count=int(row[count] or 0),
                        vcpus=int(row[vcpus]),
                        memory_gib=float(row[memory]),
                        price=_optional_float(row[price]),
                        spot_price=_optional_float(row[spot]),
                        gpu_memory_gib=_optional_float(row[gpu_memory]) if gpu_memory is not None
                        and gpu_memory < len(row) else None,
                        price_date=_optional_date(row[date]) if date is not None and date < len(row) else None,
                        source=source,
                        price_source=_optional_text(row, price_source),
                        price_note=_optional_text(row, price_note),
                    )
                )
            except (ValueError, IndexError) as exc:
                raise ConfigError(f"{path}:{line}: bad catalog row: {exc}", hint=hint) from None
    return offers


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def offer_row(offer: Offer) -> dict[str, str]:
    return {
        "cloud": offer.cloud,
        "region": offer.region,
        "zone": offer.zone or "",
        "instance_type": offer.instance_type,
        "accelerator": offer.accelerator or "",
        "accelerator_count": str(offer.accelerator_count),
        "vcpus": str(offer.vcpus),
        "memory_gib": _number(offer.memory_gib),
        "price": repr(float(offer.price)) if offer.price is not None else "",
        "spot_price": repr(float(offer.spot_price)) if offer.spot_price is not None else "",
        "gpu_memory_gib": _number(offer.gpu_memory_gib),
        "price_date": offer.price_date.isoformat() if offer.price_date else "",
        "price_source": offer.price_source or "",
        "price_note": offer.price_note or "",
    }


def write_csv(path: Path, offers: Iterable[Offer]) -> None:
    """Write a catalog file atomically: a temporary file beside it, flushed to disk, then renamed over
    it. A reader sees the old file or the whole new one, never a part; a failure leaves the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS + OPTIONAL_COLUMNS, lineterminator="\n")
            writer.writeheader()
            for offer in offers:
                writer.writerow(offer_row(offer))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


@functools.cache
def default_catalog() -> Catalog:
    """The bundled catalog with the user's refreshed files, shared by every caller in the process
    (loaded on first query)."""
    return Catalog()
