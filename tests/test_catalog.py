"""The offer catalog: bundled contents, queries, optional columns, refreshed files laid over the bundled ones."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from cloudtrain.catalog import (
    COLUMNS,
    DATA_DIR,
    OPTIONAL_COLUMNS,
    Catalog,
    Offer,
    default_catalog,
    merge,
    read_csv,
    user_catalog_dir,
    write_csv,
)
from cloudtrain.errors import ConfigError

pytestmark = pytest.mark.quick

# The priced AWS types (prices recorded 2026-11-21, or read from SkyPilot's catalog 2026-11-28).
GPU_TYPES = {
    "g4dn.xlarge": ("T4", 1),
    "g4dn.2xlarge": ("T4", 1),
    "g4dn.12xlarge": ("T4", 4),
    "g4dn.16xlarge": ("T4", 1),
    "g4dn.4xlarge": ("T4", 1),
    "g4dn.8xlarge": ("T4", 1),
    "g4dn.metal": ("T4", 8),
    "g5.8xlarge": ("A10G", 1),
    "g5.16xlarge": ("A10G", 1),
    "g5.24xlarge": ("A10G", 4),
    **{f"g6.{size}": ("L4", n) for size, n in (("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1), ("8xlarge", 1),
                                               ("16xlarge", 1), ("12xlarge", 4), ("24xlarge", 4), ("48xlarge", 8))},
    **{f"g6e.{size}": ("L40S", n) for size, n in (("xlarge", 1), ("2xlarge", 1), ("4xlarge", 1), ("8xlarge", 1),
                                                 ("16xlarge", 1), ("12xlarge", 4), ("24xlarge", 4), ("48xlarge", 8))},
    "g5.xlarge": ("A10G", 1),
    "g5.2xlarge": ("A10G", 1),
    "g5.4xlarge": ("A10G", 1),
    "g5.12xlarge": ("A10G", 4),
    "g5.48xlarge": ("A10G", 8),
    "p3.2xlarge": ("V100", 1),
    "p4d.24xlarge": ("A100", 8),
    "p4de.24xlarge": ("A100", 8),
    "p5.48xlarge": ("H100", 8),
}
GPU_MEMORY = {"T4": 16, "A10G": 24, "L4": 24, "L40S": 48, "V100": 16, "A100": 40, "H100": 80}
CPU_TYPES = ("m5.large", "c5.xlarge", "t3.medium")
REGIONS = ("eu-west-1", "us-east-1", "us-east-2", "us-west-2")
AWS = Catalog(files=[DATA_DIR / "aws.csv"])
DAY = dt.date(2026, 11, 21)
READ = dt.date(2026, 11, 28)


def test_bundled_aws_offers() -> None:
    assert AWS.clouds() == ("aws",)
    assert AWS.regions("aws") == REGIONS
    priced = [o for o in AWS.offers if o.price is not None]
    assert {o.instance_type for o in priced} == set(GPU_TYPES) | set(CPU_TYPES)
    for offer in priced:
        assert offer.price > 0 and (offer.spot_price is None or 0 < offer.spot_price < offer.price)
        assert offer.price_date in (DAY, READ) and offer.price_source
        if offer.instance_type in GPU_TYPES:
            assert (offer.accelerator, offer.accelerator_count) == GPU_TYPES[offer.instance_type]
            assert offer.gpu_memory_gib == {"p4de.24xlarge": 80}.get(offer.instance_type, GPU_MEMORY[offer.accelerator])
        else:
            assert (offer.accelerator, offer.accelerator_count, offer.accelerators, offer.gpu_memory_gib) == (
                None, 0, None, None)
    t4 = AWS.find("aws", "us-east-1", "g4dn.xlarge")
    assert t4 == Offer("aws", "us-east-1", None, "g4dn.xlarge", "T4", 1, 4, 16, 0.526, 0.2104,
                       gpu_memory_gib=16, price_date=DAY)
    assert t4.accelerators == "T4:1" and t4.hourly(spot=True) == 0.2104
    # Every priced GPU type is sold in us-east-1; p5 is not in eu-west-1 (as on AWS).
    assert {o.instance_type for o in AWS.query(region="us-east-1")} == set(GPU_TYPES) | set(CPU_TYPES)
    assert AWS.find("aws", "eu-west-1", "p5.48xlarge") is None
    # Sold, price unknown: listed by unpriced(), never by query().
    # (g6 in eu-west-1: SkyPilot's catalog, the source read 2026-11-28, does not list it there.)
    g6 = AWS.find("aws", "eu-west-1", "g6.xlarge")
    assert g6 is not None and g6.price is None and g6.price_note
    assert {o.region for o in AWS.query(accelerator="L4")} == {"us-east-1", "us-east-2", "us-west-2"}
    assert [o.instance_type for o in AWS.unpriced(region="eu-west-1", accelerator="l4", min_accelerators=8)] == [
        "g6.48xlarge"]


def test_every_bundled_file_loads_and_the_default_catalog_has_every_cloud() -> None:
    catalog = default_catalog()
    files = sorted(DATA_DIR.glob("*.csv"))
    assert {f.stem for f in files} == set(catalog.clouds())
    assert sum(len(read_csv(f)) for f in files) == len(catalog.offers)
    for offer in catalog.offers:
        if offer.price is None:  # sold there, price unknown: says why, and has no spot price either
            assert offer.price_note and offer.spot_price is None, offer
            continue
        assert offer.price > 0 and (offer.spot_price is None or 0 < offer.spot_price < offer.price), offer


def test_query_by_gpu_is_case_insensitive_and_cheapest_first() -> None:
    offers = AWS.query(cloud="aws", accelerator="t4")
    assert offers[0].instance_type == "g4dn.xlarge"
    prices = [o.price for o in offers]
    assert prices == sorted(prices)
    assert {o.accelerator for o in offers} == {"T4"}
    assert AWS.canonical_accelerator("a10g") == "A10G" and AWS.canonical_accelerator("T5") is None
    assert AWS.accelerator_names() == ("A100", "A10G", "H100", "H200", "L4", "L40S", "T4", "V100")
    assert "T4" in default_catalog().accelerator_names()


@pytest.mark.parametrize(
    ("criteria", "expected_first", "count"),
    [
        (dict(accelerator="T4", min_accelerators=2), "g4dn.12xlarge", 8),  # and g4dn.metal
        (dict(accelerator="A100", region="eu-west-1"), "p4d.24xlarge", 1),
        (dict(cpu_only=True), "t3.medium", 12),
        (dict(cpu_only=True, min_vcpus=4), "c5.xlarge", 4),
        (dict(cpu_only=True, min_memory_gib=8), "m5.large", 8),
        (dict(max_price=0.05), "t3.medium", 4),
        (dict(accelerator="T4", spot=True), "g4dn.xlarge", 28),  # 7 T4 types x 4 regions
        (dict(instance_type="p3.2xlarge", region="us-west-2"), "p3.2xlarge", 1),
    ],
)
def test_query_criteria(criteria: dict, expected_first: str, count: int) -> None:
    offers = AWS.query(**criteria)
    assert offers[0].instance_type == expected_first
    assert len(offers) == count
    assert default_catalog().query(cloud="aws", **criteria) == offers


def test_spot_query_orders_by_spot_price() -> None:
    offers = AWS.query(instance_type="g4dn.xlarge", spot=True)
    assert [o.region for o in offers] == ["us-east-2", "us-west-2", "us-east-1", "eu-west-1"]


def test_zone_specific_rows_win_over_the_region_row(tmp_path: Path) -> None:
    csv = tmp_path / "x.csv"
    csv.write_text(
        ",".join(COLUMNS) + "\n"
        "aws,us-east-1,,g4dn.xlarge,T4,1,4,16,0.526,0.2\n"
        "aws,us-east-1,us-east-1c,g4dn.xlarge,T4,1,4,16,0.526,0.15\n"
        "aws,us-east-1,,m5.large,,0,2,8,0.096,\n"
    )
    catalog = Catalog(files=[csv])
    assert catalog.price("aws", "us-east-1", "g4dn.xlarge", spot=True, zone="us-east-1c") == 0.15
    assert catalog.price("aws", "us-east-1", "g4dn.xlarge", spot=True, zone="us-east-1a") == 0.2
    assert catalog.price("aws", "us-east-1", "m5.large", spot=True) is None  # no spot market: no price
    assert [o.zone for o in catalog.query(spot=True, zone="us-east-1a")] == [None]
    assert catalog.query(spot=True) and all(o.spot_price is not None for o in catalog.query(spot=True))


def test_bad_files_name_file_and_line(tmp_path: Path) -> None:
    bad_row = tmp_path / "bad.csv"
    bad_row.write_text(",".join(COLUMNS) + "\naws,us-east-1,,x.large,,0,two,8,0.1,\n")
    with pytest.raises(ConfigError, match=r"bad\.csv:2: bad catalog row"):
        read_csv(bad_row)
    bad_date = tmp_path / "date.csv"
    bad_date.write_text(",".join(COLUMNS + OPTIONAL_COLUMNS) + "\naws,us-east-1,,x.large,,0,2,8,0.1,,,21/11/2026\n")
    with pytest.raises(ConfigError, match=r"date\.csv:2: bad catalog row"):
        read_csv(bad_date)
    no_price = tmp_path / "short.csv"
    no_price.write_text("cloud,region,instance_type\naws,us-east-1,x.large\n")
    with pytest.raises(ConfigError, match="missing column"):
        read_csv(no_price)


def test_optional_columns_may_be_missing_or_empty_and_offers_default_them(tmp_path: Path) -> None:
    old = tmp_path / "old.csv"  # a file with only the first ten columns (as gcp.csv and azure.csv may be)
    old.write_text(",".join(COLUMNS) + "\ngcp,us-central1,,g2-standard-4,L4,1,4,16,0.7068,0.2827\n")
    new = tmp_path / "new.csv"  # the optional columns in any order, empty or not
    new.write_text("price_date," + ",".join(COLUMNS) + ",gpu_memory_gib\n"
                   "2026-11-01,gcp,us-central1,,g2-standard-8,L4,1,8,32,0.85,,24\n"
                   ",gcp,us-central1,,e2-standard-2,,0,2,8,0.067,0.02\n")  # a short row: trailing optional cells absent
    [g2] = read_csv(old)
    assert (g2.gpu_memory_gib, g2.price_date) == (None, None)
    assert g2 == Offer("gcp", "us-central1", None, "g2-standard-4", "L4", 1, 4, 16, 0.7068, 0.2827)
    g2_8, e2 = read_csv(new)
    assert (g2_8.gpu_memory_gib, g2_8.price_date, g2_8.spot_price) == (24, dt.date(2026, 11, 1), None)
    assert (e2.gpu_memory_gib, e2.price_date) == (None, None)


def test_staleness() -> None:
    offer = Offer("aws", "us-east-1", None, "m5.large", None, 0, 2, 8, 0.096, None, price_date=DAY)
    assert offer.age_days(DAY + dt.timedelta(days=90)) == 90 and not offer.stale(DAY + dt.timedelta(days=90))
    assert offer.stale(DAY + dt.timedelta(days=91))
    undated = Offer("aws", "us-east-1", None, "m5.large", None, 0, 2, 8, 0.096, None)
    assert undated.age_days(DAY) is None and undated.stale(DAY)


def _offer(region: str, kind: str, price: float, date: dt.date | None, zone: str | None = None) -> Offer:
    return Offer("gcp", region, zone, kind, None, 0, 2, 8, price, None, price_date=date)


def test_merge_the_newer_price_date_wins_per_type_and_region() -> None:
    older, newer_day = dt.date(2026, 1, 1), dt.date(2026, 11, 1)
    base = [
        _offer("us-east1", "a", 1.0, older),
        _offer("us-east1", "b", 2.0, newer_day),  # bundled newer than the refresh: kept
        _offer("us-east1", "c", 3.0, None),  # undated: loses to a dated refresh
        _offer("us-east1", "d", 4.0, older),  # not in the refresh: kept
        _offer("us-east1", "e", 5.0, older),  # priced per zone by the refresh: both zone rows replace it
    ]
    refreshed = [
        _offer("us-east1", "a", 1.1, newer_day),
        _offer("us-east1", "b", 2.1, older),
        _offer("us-east1", "c", 3.1, older),
        _offer("us-east1", "e", 5.1, newer_day, zone="us-east1-b"),
        _offer("us-east1", "e", 5.2, newer_day, zone="us-east1-c"),
        _offer("us-west1", "a", 1.2, newer_day),  # a new region
    ]
    merged = merge(base, refreshed)
    assert [(o.region, o.instance_type, o.zone, o.price) for o in merged] == [
        ("us-east1", "a", None, 1.1), ("us-east1", "b", None, 2.0), ("us-east1", "c", None, 3.1),
        ("us-east1", "d", None, 4.0), ("us-east1", "e", "us-east1-b", 5.1), ("us-east1", "e", "us-east1-c", 5.2),
        ("us-west1", "a", None, 1.2)]
    tie = merge([_offer("us-east1", "a", 1.0, older)], [_offer("us-east1", "a", 0.9, older)])
    assert [o.price for o in tie] == [0.9]  # same date: the refreshed row


def test_the_users_refreshed_files_are_laid_over_the_bundled_ones(cloudtrain_home: Path) -> None:
    assert user_catalog_dir() == cloudtrain_home / "catalog"
    bundled = Catalog()
    assert bundled.override_files == () and len(bundled.offers) == len(default_catalog().offers)
    t4 = bundled.find("aws", "us-east-1", "g4dn.xlarge")
    fresher = dataclasses.replace(t4, price=0.5, spot_price=0.19, price_date=DAY + dt.timedelta(days=2))
    write_csv(cloudtrain_home / "catalog" / "aws.csv", [fresher])
    catalog = Catalog()
    assert catalog.override_files == (cloudtrain_home / "catalog" / "aws.csv",)
    assert catalog.find("aws", "us-east-1", "g4dn.xlarge") == fresher
    assert len(catalog.offers) == len(bundled.offers)
    assert catalog.find("aws", "us-east-2", "g4dn.xlarge") == bundled.find("aws", "us-east-2", "g4dn.xlarge")
    # An explicit file list reads only those files.
    assert Catalog(files=[DATA_DIR / "aws.csv"]).find("aws", "us-east-1", "g4dn.xlarge") == t4
    # A refreshed file edited into nonsense is one clear error, with what to do.
    (cloudtrain_home / "catalog" / "aws.csv").write_text("cloud,region\naws\n")
    with pytest.raises(ConfigError, match="missing column") as caught:
        _ = Catalog().offers
    assert "catalog refresh" in caught.value.one_line()


def test_write_csv_round_trips_and_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "cat" / "aws.csv"
    offers = [Offer("aws", "us-east-1", None, "g4dn.xlarge", "T4", 1, 4, 16.0, 0.526, 0.2104, 16.0, DAY),
              Offer("aws", "us-east-1", "us-east-1a", "m5.large", None, 0, 2, 7.5, 0.096, None)]
    write_csv(path, offers)
    assert read_csv(path) == offers
    before = path.read_bytes()

    def broken():  # a writer that dies half-way (disk full, bug, Ctrl-C)
        yield offers[0]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_csv(path, broken())
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["aws.csv"]


def test_loading_is_lazy(tmp_path: Path) -> None:
    Catalog(files=[tmp_path / "does-not-exist.csv"])  # nothing read at construction
    with pytest.raises(FileNotFoundError):
        _ = Catalog(files=[tmp_path / "does-not-exist.csv"]).offers


def test_reading_the_catalog_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "not-yet"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    assert Catalog().offers and user_catalog_dir() == home / "catalog"
    assert not home.exists()  # `validate` plans and must leave no trace
