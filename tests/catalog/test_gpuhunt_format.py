"""Reading gpuhunt's catalog format: rows -> Offers, what is joined, collapsed, renamed and left out."""

from __future__ import annotations

import datetime as dt

import pytest

from cloudtrain.catalog import Offer
from cloudtrain.catalog.gpuhunt_format import (
    FormatError,
    convert,
    csv_from_zip,
    version_date,
)
from tests.catalog.fake_gpuhunt import (
    AWS_ROWS,
    AZURE_ROWS,
    GCP_ROWS,
    row,
    to_csv,
    zipped,
)

DAY = dt.date(2026, 11, 20)


def by_key(offers: tuple[Offer, ...]) -> dict[tuple, Offer]:
    return {(o.region, o.zone, o.instance_type): o for o in offers}


def test_on_demand_and_spot_rows_become_one_offer_and_what_we_cannot_launch_is_counted() -> None:
    result = convert("aws", to_csv(AWS_ROWS), DAY)
    offers = by_key(result.offers)
    assert offers[("us-east-1", None, "g4dn.xlarge")] == Offer(
        "aws", "us-east-1", None, "g4dn.xlarge", "T4", 1, 4, 16.0, 0.5, 0.19, gpu_memory_gib=16.0, price_date=DAY)
    assert offers[("us-east-2", None, "g4dn.xlarge")].spot_price is None  # no spot row: not sold as spot
    assert offers[("us-east-1", None, "m5.large")].accelerator is None and offers[("us-east-1", None, "m5.large")].gpu_memory_gib is None
    assert {o.instance_type for o in result.offers} == {"g4dn.xlarge", "g6.xlarge", "m5.large"}
    # Arm (g5g), a spot-only price (p5) and an accelerator that is not an NVIDIA GPU (inf2) are left out.
    assert result.skipped == {"not x86": 1, "spot only": 1, "not an NVIDIA GPU": 1}
    assert result.rows == len(AWS_ROWS)


def test_gcp_zones_collapse_when_prices_agree_and_n1_gpus_get_the_providers_name() -> None:
    result = convert("gcp", to_csv(GCP_ROWS), DAY)
    offers = by_key(result.offers)
    g2 = offers[("us-central1", None, "g2-standard-4")]
    assert (g2.price, g2.spot_price, g2.accelerators, g2.gpu_memory_gib) == (0.7068, 0.25, "L4:1", 24.0)
    n1 = offers[("us-central1", None, "n1-standard-4+t4x1")]  # what providers/gcp parses back
    assert (n1.accelerators, n1.vcpus, n1.price, n1.spot_price) == ("T4:1", 4, 0.54, 0.14)
    # Spot prices differ between zones: one row per zone, each with its own price.
    assert offers[("us-east1", "us-east1-b", "e2-standard-4")].spot_price == 0.04
    assert offers[("us-east1", "us-east1-c", "e2-standard-4")].spot_price == 0.05
    assert ("us-east1", None, "e2-standard-4") not in offers
    assert offers[("europe-west4", None, "e2-standard-4")].price == 0.1477  # one zone: the region's row
    assert result.skipped == {"not a plain on-demand or spot price": 1, "not an NVIDIA GPU": 1}


def test_malformed_rows_are_counted_not_fatal() -> None:
    result = convert("azure", to_csv(AZURE_ROWS), DAY)
    assert result.skipped == {"malformed": 1}
    assert {(o.region, o.instance_type) for o in result.offers} == {
        ("eastus", "Standard_NC4as_T4_v3"), ("westus2", "Standard_NC4as_T4_v3"),
        ("westeurope", "Standard_NC4as_T4_v3"), ("eastus", "Standard_D4s_v6")}


def test_old_catalogs_without_vendor_columns_read_as_gpuhunt_reads_them() -> None:
    legacy = "instance_name,location,price,cpu,memory,gpu_count,gpu_name,gpu_memory,spot,disk_size\n" \
             "g4dn.xlarge,us-east-1,0.5,4,16,1,T4,16,False,\n" \
             "v2-8,us-central1-a,4.5,96,334,1,tpu-v2,64,False,\n"
    result = convert("aws", legacy, DAY)
    assert [o.accelerators for o in result.offers] == ["T4:1"]
    assert result.skipped == {"not an NVIDIA GPU": 1}


def test_not_a_catalog_is_refused_with_the_missing_columns() -> None:
    with pytest.raises(FormatError, match="missing column.*instance_name"):
        convert("aws", "name,price\nx,1\n", DAY)


def test_zip_member_and_integrity() -> None:
    text = to_csv([row("m5.large", "us-east-1", 0.096, 2, 8.0)])
    assert csv_from_zip(zipped("aws", text), "aws") == text
    with pytest.raises(FormatError, match="has no aws.csv"):
        csv_from_zip(zipped("aws", text, member="gcp.csv"), "aws")
    data = zipped("aws", text * 50)
    with pytest.raises(FormatError, match="not a readable catalog.zip"):
        csv_from_zip(data[: len(data) // 2], "aws")


@pytest.mark.parametrize("version, expected", [
    ("20261123-1234", dt.date(2026, 11, 23)), ("20261123", dt.date(2026, 11, 23)), (" 20250101-1\n", dt.date(2025, 1, 1)),
    ("20261399-1", None), ("latest", None), ("", None), (None, None),
])
def test_version_date(version: str | None, expected: dt.date | None) -> None:
    assert version_date(version) == expected


def _zip_of(members: dict[str, int | str]) -> bytes:
    """A zip whose members are text, or that many zero bytes written in 1 MiB pieces (a zip bomb)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            if isinstance(content, str):
                archive.writestr(name, content)
                continue
            with archive.open(name, "w", force_zip64=True) as handle:
                for _ in range(content // (1 << 20)):
                    handle.write(bytes(1 << 20))
    return buffer.getvalue()


MIB = 1 << 20
# issue 29, case 2: what a hostile or broken catalog.zip may claim, and the one line it gets
HOSTILE_ZIPS = [
    ("unpacks-past-the-bound", {"aws.csv": 65 * MIB}, "would be 68157440 bytes unpacked"),
    ("many-members", {f"m{i}.csv": "x" for i in range(17)} | {"aws.csv": "x"}, "has 18 members"),
    ("not-a-zip", None, "not a readable catalog.zip"),
]


@pytest.mark.parametrize(("members", "words"), [c[1:] for c in HOSTILE_ZIPS], ids=[c[0] for c in HOSTILE_ZIPS])
def test_hostile_catalog_zip_is_refused(members: dict | None, words: str) -> None:
    data = _zip_of(members) if members is not None else b"PK\x03\x04 not really"
    with pytest.raises(FormatError, match=words):
        csv_from_zip(data, "aws")


def test_a_field_past_csvs_limit_is_a_format_error_not_a_crash() -> None:
    text = to_csv(AWS_ROWS) + "g4dn.xlarge,us-east-1," + "9" * 200_000 + ",4,16,1,T4,16,false\n"
    with pytest.raises(FormatError, match="not a readable CSV"):
        convert("aws", text, DAY)


def test_zip_bomb_is_refused_within_limits() -> None:
    # 300 MiB of zeros in a 300 KB zip: read whole, it needed 300 MiB (the 3 GB one: MemoryError).
    from tests.bounded import run_bounded

    out = run_bounded(
        f"""
        from cloudtrain.catalog.gpuhunt_format import FormatError, csv_from_zip
        from tests.catalog.test_gpuhunt_format import _zip_of
        data = _zip_of({{"aws.csv": 300 * {MIB}}})
        """,
        """
        try:
            csv_from_zip(data, "aws")
        except FormatError as exc:
            print("REFUSED", exc)
        """,
    )
    assert "REFUSED aws.csv would be 314572800 bytes unpacked" in out
