"""The bundled catalog covers every current GPU family of AWS, GCP and Azure, and every bundled price
says when it was taken and where it was published; a row without a price says why and is never planned."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from cloudtrain.catalog import DATA_DIR, PRICE_UNKNOWN, Catalog, Offer
from cloudtrain.errors import NotAvailableError
from cloudtrain.plan import make_plan
from cloudtrain.recipe import Recipe

BUNDLED = Catalog(files=sorted(DATA_DIR.glob("*.csv")))

# (cloud, family, a type of it, GPU, GPUs per node, vCPUs, memory GiB, GPU memory GiB)
FAMILIES = [
    ("aws", "g4dn", "g4dn.12xlarge", "T4", 4, 48, 192, 16),
    ("aws", "g5", "g5.48xlarge", "A10G", 8, 192, 768, 24),
    ("aws", "g6", "g6.xlarge", "L4", 1, 4, 16, 24),
    ("aws", "g6e", "g6e.48xlarge", "L40S", 8, 192, 1536, 48),
    ("aws", "p4d", "p4d.24xlarge", "A100", 8, 96, 1152, 40),
    ("aws", "p4de", "p4de.24xlarge", "A100", 8, 96, 1152, 80),
    ("aws", "p5", "p5.48xlarge", "H100", 8, 192, 2048, 80),
    ("aws", "p5e", "p5e.48xlarge", "H200", 8, 192, 2048, 141),
    ("gcp", "n1+T4", "n1-standard-32+t4x4", "T4", 4, 32, 120, 16),
    ("gcp", "n1+V100", "n1-standard-64+v100x8", "V100", 8, 64, 240, 16),
    ("gcp", "n1+P100", "n1-standard-32+p100x4", "P100", 4, 32, 120, 16),
    ("gcp", "n1+P4", "n1-standard-32+p4x4", "P4", 4, 32, 120, 8),
    ("gcp", "g2", "g2-standard-96", "L4", 8, 96, 384, 24),
    ("gcp", "a2-highgpu", "a2-highgpu-8g", "A100", 8, 96, 680, 40),
    ("gcp", "a2-ultragpu", "a2-ultragpu-8g", "A100", 8, 96, 1360, 80),
    ("gcp", "a3", "a3-highgpu-8g", "H100", 8, 208, 1872, 80),
    ("azure", "NCasT4_v3", "Standard_NC64as_T4_v3", "T4", 4, 64, 440, 16),
    ("azure", "NC A100 v4", "Standard_NC96ads_A100_v4", "A100", 4, 96, 880, 80),
    ("azure", "NCads H100 v5", "Standard_NC80adis_H100_v5", "H100", 2, 80, 640, 94),
    ("azure", "ND A100 v4", "Standard_ND96asr_v4", "A100", 8, 96, 900, 40),
    ("azure", "ND H100 v5", "Standard_ND96isr_H100_v5", "H100", 8, 96, 1900, 80),
    ("azure", "NVadsA10 v5", "Standard_NV36ads_A10_v5", "A10", 1, 36, 440, 24),
]


@pytest.mark.parametrize(("cloud", "family", "kind", "gpu", "count", "vcpus", "memory", "gpu_memory"), FAMILIES,
                         ids=[f"{f[0]}-{f[1]}" for f in FAMILIES])
def test_every_current_gpu_family_resolves(cloud: str, family: str, kind: str, gpu: str, count: int, vcpus: int,
                                           memory: float, gpu_memory: float) -> None:
    offer = BUNDLED.describe_type(cloud, kind)
    assert offer is not None, f"{cloud} {family}: {kind} is not in the bundled catalog"
    assert (offer.accelerator, offer.accelerator_count, offer.vcpus, offer.memory_gib, offer.gpu_memory_gib) == (
        gpu, count, vcpus, memory, gpu_memory)
    # The same hardware in every region that sells it.
    rows = [o for o in BUNDLED.offers if o.cloud == cloud and o.instance_type == kind]
    assert {(o.accelerator, o.accelerator_count, o.vcpus, o.memory_gib) for o in rows} == {
        (gpu, count, vcpus, memory)}
    # The GPU is known by name to the planner's vocabulary, and for its cloud.
    assert gpu in BUNDLED.accelerator_names(cloud)


def test_every_bundled_price_has_a_date_and_a_source_and_every_missing_one_a_reason() -> None:
    for offer in BUNDLED.offers:
        if offer.price is None:
            assert offer.price_note and offer.spot_price is None and offer.price_date is None, offer
            continue
        assert offer.price > 0, offer
        assert isinstance(offer.price_date, dt.date) and offer.price_date <= dt.date(2026, 11, 28), offer
        assert offer.price_source and offer.price_note, offer


def test_gcp_names_say_how_the_gpus_attach() -> None:
    """N1 takes attachable T4/V100/P100/P4 (`<machine>+<gpu>x<count>`, what providers/gcp launches);
    A2, A3 and G2 come with their GPUs built in (the machine type alone)."""
    for offer in (o for o in BUNDLED.offers if o.cloud == "gcp" and o.accelerator):
        match = re.fullmatch(r"(n1-[a-z]+-\d+)\+(t4|v100|p100|p4)x(\d+)", offer.instance_type)
        if offer.instance_type.startswith("n1-"):
            assert match, offer.instance_type
            assert (match.group(2).upper(), int(match.group(3))) == (offer.accelerator, offer.accelerator_count)
        else:
            assert re.fullmatch(r"(a2|a3|g2)-[a-z]+-\d+g?", offer.instance_type) and "+" not in offer.instance_type


def recipe(resources: dict) -> Recipe:
    return Recipe.model_validate({"name": "p", "run": "true", "resources": {"cloud": "any", **resources}})


def offer(kind: str, price: float | None, day: dt.date | None, count: int = 1) -> Offer:
    return Offer("aws", "us-east-1", None, kind, "T4", count, 4, 16, price, None, 16, day,
                 price_source="https://example.test/prices" if price else None,
                 price_note=None if price else "no published price")


def test_the_plan_line_flags_a_stale_or_undated_price() -> None:
    today = dt.date.today()
    for day, flag in ((today, None), (today - dt.timedelta(days=200), "STALE price of"), (None, "undated price")):
        plan = make_plan(recipe({"accelerators": "T4:1"}), Catalog(offers=[offer("g4dn.xlarge", 0.5, day)]), ["aws"])
        line = plan.summary()
        if flag is None:
            assert "STALE" not in line and "undated" not in line, line
        else:
            assert flag in line and "`cloudtrain catalog refresh`" in line, line


def test_a_type_sold_without_a_known_price_is_never_planned_and_is_said_so() -> None:
    catalog = Catalog(offers=[offer("g4dn.xlarge", 0.5, dt.date.today()), offer("g4dn.12xlarge", None, None, 4)])
    with pytest.raises(NotAvailableError) as caught:
        make_plan(recipe({"accelerators": "T4:4"}), catalog, ["aws"])
    line = caught.value.one_line()
    assert PRICE_UNKNOWN in line and "g4dn.12xlarge" in line and "at most" not in line
    with pytest.raises(NotAvailableError) as caught:
        make_plan(recipe({"instance_type": "g4dn.12xlarge", "cloud": "aws"}), catalog, ["aws"])
    assert PRICE_UNKNOWN in caught.value.one_line()
    plan = make_plan(recipe({"accelerators": "T4:1"}), catalog, ["aws"])
    assert [c.instance_type for c in plan.candidates] == ["g4dn.xlarge"]


def test_every_priced_csv_row_names_its_source_and_date_and_no_row_is_priced_without_them() -> None:
    """Read the bundled files as text, not through Offer (which would hide a cell the loader drops):
    a price without a source and a date is a guess, and a source or date without a price is a row
    someone half-edited."""
    import csv

    checked = 0
    for path in sorted(DATA_DIR.glob("*.csv")):
        with path.open(newline="") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                where = f"{path.name}:{line} {row['instance_type']} in {row['region']}"
                priced = bool((row.get("price") or "").strip())
                dated = bool((row.get("price_date") or "").strip())
                sourced = bool((row.get("price_source") or "").strip())
                assert priced == dated == sourced, where
                if priced:
                    dt.date.fromisoformat(row["price_date"])
                    assert float(row["price"]) > 0, where
                else:
                    assert not (row.get("spot_price") or "").strip() and row.get("price_note"), where
                checked += 1
    assert checked > 200  # the three clouds' files, not an empty directory
