"""Reading dstack's gpuhunt price catalog, the source `cloudtrain catalog refresh` takes prices from.

gpuhunt (github.com/dstackai/gpuhunt) collects AWS, GCP and Azure prices every hour from the clouds'
pricing APIs and publishes each provider on its own:

    {base}/{provider}/version                   -> e.g. "20261123-1234" (YYYYMMDD-run: the collection date)
    {base}/{provider}/{version}/catalog.zip     -> one member, "{provider}.csv"

The CSV ("v2" columns: instance_name, location, price, cpu, memory, gpu_count, gpu_name, gpu_memory,
spot, disk_size, gpu_vendor, flags, cpu_arch, provider_data) has one row per (type, location,
on-demand or spot). `GPUHUNT_CATALOG_URL` points gpuhunt at another base URL and
`GPUHUNT_CATALOG_DIR` at a directory of `{provider}.csv` files; we honour both the same way.

This module reads that format with the standard library only (see docs/catalog.md for why not the
gpuhunt package itself) and turns it into Offer records:
  - on-demand and spot rows of one type and place become one Offer (a spot-only row is skipped: an
    Offer always has its on-demand price);
  - GCP locations are zones: rows of a region with the same prices in every zone become one
    region row (zone empty), otherwise one row per zone;
  - GCP N1 machines with attached GPUs get the provider's name for the pair,
    `n1-standard-4+t4x1` (gpuhunt names them by the machine alone);
  - what our providers cannot launch is skipped and counted: Arm CPUs, accelerators that are not
    NVIDIA GPUs (TPUs, Gaudi, ...), GCP's calendar-mode (reservation) prices and gpuhunt's duplicate
    legacy rows.
Nothing here imports a network module: callers hand in the bytes (catalog/refresh.py fetches them).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import re
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cloudtrain.catalog import Offer
from cloudtrain.readlimit import read_at_most

DEFAULT_URL = "https://dstack-gpu-pricing.s3.eu-west-1.amazonaws.com/v3"
URL_ENV = "GPUHUNT_CATALOG_URL"
DIR_ENV = "GPUHUNT_CATALOG_DIR"
# Our cloud name -> gpuhunt's provider name.
PROVIDERS: Mapping[str, str] = {"aws": "aws", "gcp": "gcp", "azure": "azure"}
REQUIRED = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "spot")
# Rows that are not a plain on-demand or spot price, or repeat another row for old dstack versions.
SKIP_FLAGS = frozenset({"gcp-dws-calendar-mode", "gcp-g4-preview"})
_GCP_ZONE = re.compile(r"^(?P<region>[a-z]+-[a-z]+[0-9]+)-[a-z]$")
_VERSION_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})(?:\b|-|$)")


class FormatError(ValueError):
    """The bytes are not a gpuhunt catalog we can read (bad zip, missing member or columns)."""


@dataclass(frozen=True)
class Converted:
    """Offers made from one provider's catalog, and what was left out (reason -> rows)."""

    offers: tuple[Offer, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
    rows: int = 0


def version_date(version: str | None) -> dt.date | None:
    """The collection date in a gpuhunt version ("20261123-1234" -> 2026-11-23), or None."""
    match = _VERSION_DATE.match((version or "").strip())
    if not match:
        return None
    try:
        return dt.date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        return None


# A provider's CSV is a few MB; the zip holds one member. A catalog is downloaded data: the bounds
# hold whatever the zip's headers claim (issue 29: 3 MB of zip held 3 GB and ended in MemoryError).
MAX_CSV_BYTES = 64 * 1024 * 1024
MAX_ZIP_MEMBERS = 16


def csv_from_zip(data: bytes, provider: str) -> str:
    """The `{provider}.csv` member of a catalog.zip, checked (a truncated or altered zip fails its CRC).

    Refused (FormatError) past MAX_ZIP_MEMBERS members or MAX_CSV_BYTES decompressed.
    """
    member = f"{provider}.csv"
    members = _zip_member_count(data)
    if members is not None and members > MAX_ZIP_MEMBERS:
        raise FormatError(f"catalog.zip has {members} members (at most {MAX_ZIP_MEMBERS} expected), refused")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if member not in archive.namelist():
                raise FormatError(f"catalog.zip has no {member} (it has {', '.join(archive.namelist()[:5]) or 'nothing'})")
            info = archive.getinfo(member)
            if info.file_size > MAX_CSV_BYTES:
                raise FormatError(f"{member} would be {info.file_size} bytes unpacked (at most {MAX_CSV_BYTES}), refused")
            # Read at most one byte past the bound: a header that understates the size cannot make us
            # decompress more (zipfile also stops at the stated size and checks the CRC there).
            with archive.open(info) as handle:
                raw = read_at_most(handle, MAX_CSV_BYTES)
            if len(raw) > MAX_CSV_BYTES:
                raise FormatError(f"{member} unpacks past {MAX_CSV_BYTES} bytes, refused")
            return raw.decode("utf-8")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, UnicodeDecodeError, NotImplementedError) as exc:
        raise FormatError(f"not a readable catalog.zip: {exc}") from None


def _zip_member_count(data: bytes) -> int | None:
    """Members the end-of-central-directory record declares, read before zipfile builds one object per
    member; None when there is no such record (zipfile then says what is wrong)."""
    end = data.rfind(b"PK\x05\x06", max(0, len(data) - 65_557))  # 22-byte record + a 64 KiB comment
    if end < 0 or len(data) < end + 22:
        return None
    count = int.from_bytes(data[end + 10 : end + 12], "little")
    return MAX_ZIP_MEMBERS + 1 if count == 0xFFFF else count  # 0xFFFF: a zip64 count, never a catalog's


def convert(cloud: str, text: str, price_date: dt.date | None) -> Converted:
    """gpuhunt CSV text for `cloud` -> Offers dated `price_date`."""
    try:
        return _convert(cloud, text, price_date)
    except csv.Error as exc:  # a field past csv's size limit, a NUL byte: not a catalog we can read
        raise FormatError(f"not a readable CSV: {exc}") from None


def _convert(cloud: str, text: str, price_date: dt.date | None) -> Converted:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise FormatError(f"not a gpuhunt catalog: missing column(s) {', '.join(missing)}")
    skipped: Counter[str] = Counter()
    # (region, zone, type) -> hardware, on-demand price, spot price
    hardware: dict[tuple[str, str | None, str], tuple[str | None, int, int, float, float | None]] = {}
    on_demand: dict[tuple[str, str | None, str], float] = {}
    spot: dict[tuple[str, str | None, str], float] = {}
    rows = 0
    for row in reader:
        rows += 1
        try:
            item = _item(row)
        except (ValueError, KeyError, TypeError):
            skipped["malformed"] += 1
            continue
        reason = _unusable(item)
        if reason:
            skipped[reason] += 1
            continue
        region, zone = _place(cloud, item["location"])
        key = (region, zone, _instance_type(cloud, item))
        hardware.setdefault(key, (item["gpu_name"], item["gpu_count"], item["cpu"], item["memory"], item["gpu_memory"]))
        prices = spot if item["spot"] else on_demand
        prices[key] = min(item["price"], prices.get(key, item["price"]))
    offers: list[Offer] = []
    for key, (gpu, count, cpu, memory, gpu_memory) in hardware.items():
        if key not in on_demand:
            skipped["spot only"] += 1
            continue
        region, zone, instance_type = key
        offers.append(Offer(
            cloud=cloud, region=region, zone=zone, instance_type=instance_type,
            accelerator=gpu if count else None, accelerator_count=count if gpu else 0,
            vcpus=cpu, memory_gib=memory, price=on_demand[key], spot_price=spot.get(key),
            gpu_memory_gib=gpu_memory if count else None, price_date=price_date,
        ))
    return Converted(offers=tuple(sorted(_collapse_zones(offers), key=_order)), skipped=dict(skipped), rows=rows)


def _item(row: Mapping[str, str]) -> dict:
    spot = (row.get("spot") or "").strip().lower()
    if spot not in ("true", "false"):
        raise ValueError(f"spot: {spot!r}")
    gpu_count = int(row["gpu_count"])
    price = float(row["price"])
    if not price > 0:
        raise ValueError("price")
    name = (row.get("gpu_name") or "").strip() or None
    vendor = (row.get("gpu_vendor") or "").strip().lower() or None
    if name and name.startswith("tpu-"):  # catalogs before the gpu_vendor column marked TPUs so
        name, vendor = name[4:], vendor or "google"
    elif gpu_count and vendor is None:  # ... and implied NVIDIA otherwise (as gpuhunt reads them)
        vendor = "nvidia"
    return {
        "instance_name": row["instance_name"].strip(),
        "location": row["location"].strip(),
        "price": price,
        "cpu": int(row["cpu"]),
        "memory": float(row["memory"]),
        "gpu_count": gpu_count,
        "gpu_name": name,
        "gpu_memory": float(row["gpu_memory"]) if (row.get("gpu_memory") or "").strip() else None,
        "gpu_vendor": vendor,
        "spot": spot == "true",
        "flags": set((row.get("flags") or "").split()),
        "cpu_arch": (row.get("cpu_arch") or "x86").strip().lower() or "x86",
    }


def _unusable(item: Mapping) -> str | None:
    if not item["instance_name"] or not item["location"]:
        return "malformed"
    if item["flags"] & SKIP_FLAGS:
        return "not a plain on-demand or spot price"
    if item["cpu_arch"] != "x86":
        return "not x86"
    if item["gpu_count"] and (item["gpu_vendor"] != "nvidia" or not item["gpu_name"]):
        return "not an NVIDIA GPU"
    return None


def _place(cloud: str, location: str) -> tuple[str, str | None]:
    if cloud == "gcp":
        match = _GCP_ZONE.match(location)
        if match:
            return match.group("region"), location
    return location, None


def _instance_type(cloud: str, item: Mapping) -> str:
    name = item["instance_name"]
    if cloud == "gcp" and name.startswith("n1-") and item["gpu_count"]:
        return f"{name}+{item['gpu_name'].lower()}x{item['gpu_count']}"
    return name


def _collapse_zones(offers: Iterable[Offer]) -> list[Offer]:
    """Zone rows of one type in one region whose prices agree in every zone -> one region row."""
    by_region: dict[tuple[str, str], list[Offer]] = {}
    result: list[Offer] = []
    for offer in offers:
        if offer.zone is None:
            result.append(offer)
        else:
            by_region.setdefault((offer.region, offer.instance_type), []).append(offer)
    for group in by_region.values():
        if len({(o.price, o.spot_price) for o in group}) == 1:
            first = group[0]
            result.append(dataclasses.replace(first, zone=None))
        else:
            result.extend(group)
    return result


def _order(offer: Offer) -> tuple:
    return (offer.region, offer.zone or "", offer.accelerator or "", offer.accelerator_count, offer.price,
            offer.instance_type)
