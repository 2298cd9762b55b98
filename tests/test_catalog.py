"""The bundled offer catalog: contents, queries, and loading cost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloudtrain.catalog import COLUMNS, Catalog, Offer, default_catalog, read_csv
from cloudtrain.errors import ConfigError

GPU_TYPES = {
    "g4dn.xlarge": ("T4", 1),
    "g4dn.2xlarge": ("T4", 1),
    "g4dn.12xlarge": ("T4", 4),
    "g5.xlarge": ("A10G", 1),
    "g5.2xlarge": ("A10G", 1),
    "g5.12xlarge": ("A10G", 4),
    "p3.2xlarge": ("V100", 1),
    "p4d.24xlarge": ("A100", 8),
    "p5.48xlarge": ("H100", 8),
}
CPU_TYPES = ("m5.large", "c5.xlarge", "t3.medium")
REGIONS = ("eu-west-1", "us-east-1", "us-east-2", "us-west-2")


def test_bundled_catalog_has_the_expected_aws_offers() -> None:
    catalog = Catalog()
    assert catalog.clouds() == ("aws",)
    assert catalog.regions("aws") == REGIONS
    assert set(catalog.instance_types("aws")) == set(GPU_TYPES) | set(CPU_TYPES)
    for offer in catalog.offers:
        assert offer.price > 0 and (offer.spot_price is None or 0 < offer.spot_price < offer.price)
        if offer.instance_type in GPU_TYPES:
            assert (offer.accelerator, offer.accelerator_count) == GPU_TYPES[offer.instance_type]
        else:
            assert (offer.accelerator, offer.accelerator_count, offer.accelerators) == (None, 0, None)
    t4 = catalog.find("aws", "us-east-1", "g4dn.xlarge")
    assert t4 == Offer("aws", "us-east-1", None, "g4dn.xlarge", "T4", 1, 4, 16, 0.526, 0.2104)
    assert t4.accelerators == "T4:1" and t4.hourly(spot=True) == 0.2104
    # Every GPU type is sold in us-east-1; p5 is not in eu-west-1 (as on AWS).
    assert {o.instance_type for o in catalog.query(region="us-east-1")} == set(GPU_TYPES) | set(CPU_TYPES)
    assert catalog.find("aws", "eu-west-1", "p5.48xlarge") is None


def test_query_by_gpu_is_case_insensitive_and_cheapest_first() -> None:
    catalog = default_catalog()
    offers = catalog.query(cloud="aws", accelerator="t4")
    assert offers[0].instance_type == "g4dn.xlarge"
    prices = [o.price for o in offers]
    assert prices == sorted(prices)
    assert {o.accelerator for o in offers} == {"T4"}
    assert catalog.canonical_accelerator("a10g") == "A10G" and catalog.canonical_accelerator("T5") is None
    assert catalog.accelerator_names() == ("A100", "A10G", "H100", "T4", "V100")


@pytest.mark.parametrize(
    ("criteria", "expected_first", "count"),
    [
        (dict(accelerator="T4", min_accelerators=2), "g4dn.12xlarge", 4),
        (dict(accelerator="A100", region="eu-west-1"), "p4d.24xlarge", 1),
        (dict(cpu_only=True), "t3.medium", 12),
        (dict(cpu_only=True, min_vcpus=4), "c5.xlarge", 4),
        (dict(cpu_only=True, min_memory_gib=8), "m5.large", 8),
        (dict(max_price=0.05), "t3.medium", 4),
        (dict(accelerator="T4", spot=True), "g4dn.xlarge", 12),
        (dict(instance_type="p3.2xlarge", region="us-west-2"), "p3.2xlarge", 1),
    ],
)
def test_query_criteria(criteria: dict, expected_first: str, count: int) -> None:
    offers = default_catalog().query(**criteria)
    assert offers[0].instance_type == expected_first
    assert len(offers) == count


def test_spot_query_orders_by_spot_price() -> None:
    offers = default_catalog().query(instance_type="g4dn.xlarge", spot=True)
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
    no_price = tmp_path / "short.csv"
    no_price.write_text("cloud,region,instance_type\naws,us-east-1,x.large\n")
    with pytest.raises(ConfigError, match="missing column"):
        read_csv(no_price)


def test_loading_is_lazy_and_cheap(tmp_path: Path) -> None:
    Catalog(files=[tmp_path / "does-not-exist.csv"])  # nothing read at construction
    started = time.perf_counter()
    offers = Catalog().offers
    assert offers and time.perf_counter() - started < 0.1
