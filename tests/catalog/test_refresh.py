"""`cloudtrain catalog refresh` against a fake gpuhunt over real HTTP, run as a user runs it.

Nothing of ours is mocked: the CLI is a subprocess, the fake is an HTTP server on 127.0.0.1 serving
the paths and zip files gpuhunt publishes, and the results are read back through `cloudtrain catalog`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import pytest

from cloudtrain.catalog import DATA_DIR, STALE_AFTER_DAYS, Catalog
from tests.catalog.conftest import run_cli
from tests.catalog.fake_gpuhunt import (
    AWS_ROWS,
    AZURE_ROWS,
    GCP_ROWS,
    PUBLISHED,
    VERSION,
    FakeGpuhunt,
    repriced,
    to_csv,
)

TODAY = dt.date.today()
LATER_VERSION = f"{PUBLISHED:%Y%m%d}-8"


def bundled_digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(DATA_DIR.rglob("*.csv"))}


def listing(*args: str) -> list[dict]:
    proc = run_cli("catalog", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["offers"]


def test_refresh_writes_the_users_catalog_the_listing_prefers_it_and_the_bundled_files_stay(
        gpuhunt_server: FakeGpuhunt, cloudtrain_home: Path) -> None:
    before = bundled_digest()
    proc = run_cli("catalog", "refresh", "--source", gpuhunt_server.base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = cloudtrain_home / "catalog"
    assert sorted(p.name for p in folder.iterdir()) == ["aws.csv", "azure.csv", "gcp.csv"]  # no temporary files left
    assert bundled_digest() == before
    # Only the three providers we use were asked for: version first, then that version's zip.
    assert sorted(gpuhunt_server.requests) == sorted(
        f"/v3/{p}/{x}" for p in ("aws", "gcp", "azure") for x in ("version", f"{VERSION}/catalog.zip"))
    out = proc.stdout
    assert f"aws: 6 offers in eu-west-1, us-east-1, us-east-2, us-west-2, prices of {PUBLISHED} (gpuhunt {VERSION})" in out
    assert "aws: left out 3 source rows (" in out and "1 not x86" in out and "1 spot only" in out
    assert "gcp: left out 2 source rows" in out and "azure: left out 1 source row (1 malformed)" in out
    # Bundled types the source does not carry keep their own (older) prices, and are named.
    assert "aws: " in out and "keep their older prices (c5.xlarge, g4dn.12xlarge" in out

    t4 = {(o["region"], o["instance_type"]): o for o in listing("--gpu", "T4", "--cloud", "aws")}
    fresh = t4[("us-east-1", "g4dn.xlarge")]
    assert (fresh["price"], fresh["spot_price"], fresh["price_date"]) == (0.5, 0.19, PUBLISHED.isoformat())
    assert t4[("us-east-1", "g4dn.12xlarge")]["price"] == 3.912  # not in the source: the bundled row
    assert "ap-south-1" not in {o["region"] for o in listing("--cloud", "aws")}  # regions are not widened
    # A type the source carries (L4 on g6.xlarge) takes the source's price over the bundled one;
    # GCP's N1+T4 carries the provider's name.
    l4 = {(o["region"], o["instance_type"]): o for o in listing("--gpu", "L4", "--cloud", "aws")}
    g6 = l4[("us-east-1", "g6.xlarge")]
    assert (g6["price"], g6["spot_price"], g6["price_date"]) == (0.8048, 0.33, PUBLISHED.isoformat())
    assert l4[("us-east-2", "g6.xlarge")]["price_date"] == "2026-11-28"  # not in the source: the bundled row
    gcp_t4 = listing("--gpu", "T4", "--cloud", "gcp", "--region", "us-central1")
    assert gcp_t4[0]["instance_type"] == "n1-standard-4+t4x1" and gcp_t4[0]["price"] == 0.54

    # The planner's catalog (Catalog()) sees the same prices.
    assert Catalog().price("aws", "us-east-1", "g4dn.xlarge", spot=True) == 0.19


@pytest.mark.parametrize("mode, says", [
    ("http-500", "HTTP 500"),
    ("truncated", "cut short"),
    ("not-a-zip", "not a readable catalog.zip"),
    ("no-member", "has no aws.csv"),
    ("not-a-catalog", "missing column(s) instance_name"),
    ("bad-version", "does not hold a catalog version"),
])
def test_a_failed_or_partial_download_keeps_the_current_prices(
        gpuhunt_server: FakeGpuhunt, cloudtrain_home: Path, mode: str, says: str) -> None:
    assert run_cli("catalog", "refresh", "--source", gpuhunt_server.base).returncode == 0
    aws_file = cloudtrain_home / "catalog" / "aws.csv"
    aws_before = aws_file.read_bytes()
    # A later collection: new prices everywhere, but the aws download goes wrong.
    for provider, rows in (("aws", AWS_ROWS), ("gcp", GCP_ROWS), ("azure", AZURE_ROWS)):
        gpuhunt_server.publish(provider, repriced(rows, 1.5), version=LATER_VERSION)
    gpuhunt_server.set_mode("aws", mode)
    bundled = bundled_digest()

    proc = run_cli("catalog", "refresh", "--source", gpuhunt_server.base)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: aws: ") and says in errors[0], proc.stderr
    assert "its prices are unchanged" in errors[0]
    assert aws_file.read_bytes() == aws_before
    assert bundled_digest() == bundled
    assert sorted(p.name for p in aws_file.parent.iterdir()) == ["aws.csv", "azure.csv", "gcp.csv"]
    assert f"(gpuhunt {LATER_VERSION})" in proc.stdout and "aws: " not in proc.stdout  # the others were refreshed
    [g2] = [o for o in listing("--cloud", "gcp", "--region", "us-central1") if o["instance_type"] == "g2-standard-4"]
    assert g2["price"] == round(0.7068 * 1.5, 6)
    # The aws file kept the first refresh: g6.xlarge in us-east-1 at the source's price, not 1.5x it.
    [g6] = [o for o in listing("--cloud", "aws", "--gpu", "L4", "--region", "us-east-1") if o["instance_type"] == "g6.xlarge"]
    assert g6["price"] == 0.8048 and g6["spot_price"] == 0.33


def test_a_cloud_that_fails_before_any_refresh_leaves_the_bundled_prices(
        gpuhunt_server: FakeGpuhunt, cloudtrain_home: Path) -> None:
    bundled = listing("--cloud", "gcp")
    gpuhunt_server.set_mode("gcp", "truncated")
    proc = run_cli("catalog", "refresh", "--source", gpuhunt_server.base, "--cloud", "gcp")
    assert proc.returncode == 1 and "error: gcp: " in proc.stderr
    assert not (cloudtrain_home / "catalog" / "gcp.csv").exists()
    assert listing("--cloud", "gcp") == bundled


def test_regions_can_be_added_and_stay_and_a_typo_writes_nothing(
        gpuhunt_server: FakeGpuhunt, cloudtrain_home: Path) -> None:
    typo = run_cli("catalog", "refresh", "--source", gpuhunt_server.base, "--region", "ap-sooth-1")
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines() == [
        "error: --region 'ap-sooth-1': not a region of aws, gcp, azure in the source (did you mean 'ap-south-1'?)"]
    assert not (cloudtrain_home / "catalog").exists() or not any((cloudtrain_home / "catalog").iterdir())

    added = run_cli("catalog", "refresh", "--source", gpuhunt_server.base, "--region", "ap-south-1")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("aws: 2 offers in ap-south-1,")  # only the cloud that has the region
    assert not (cloudtrain_home / "catalog" / "gcp.csv").exists()
    assert {o["instance_type"] for o in listing("--region", "ap-south-1")} == {"g4dn.xlarge", "m5.large"}

    # A default refresh now covers ap-south-1 too (the catalog has it), and one region refreshed
    # alone keeps the others.
    again = run_cli("catalog", "refresh", "--source", gpuhunt_server.base, "--cloud", "aws")
    assert "in ap-south-1, eu-west-1, us-east-1, us-east-2, us-west-2," in again.stdout
    one = run_cli("catalog", "refresh", "--source", gpuhunt_server.base, "--region", "us-east-1")
    assert "aws: kept 5 refreshed offers of other regions" in one.stdout, one.stdout
    assert {o["region"] for o in listing("--cloud", "aws", "--gpu", "T4") if o["price_date"] == PUBLISHED.isoformat()} == {
        "ap-south-1", "eu-west-1", "us-east-1", "us-east-2", "us-west-2"}


def test_gpuhunt_env_overrides_are_honoured(gpuhunt_server: FakeGpuhunt, tmp_path: Path) -> None:
    by_url = run_cli("catalog", "refresh", "--cloud", "azure", GPUHUNT_CATALOG_URL=gpuhunt_server.base)
    assert by_url.returncode == 0, by_url.stderr
    regions = ", ".join(r for r in Catalog().regions("azure") if r in {"eastus", "westus2", "westeurope"})
    assert "azure: " in by_url.stdout and f" offers in {regions}, prices of {PUBLISHED}" in by_url.stdout

    # A directory as gpuhunt's GPUHUNT_CATALOG_DIR holds it: the price date is the file's date, and a
    # source older than 90 days is said to be, and its prices are marked STALE.
    folder = tmp_path / "gpuhunt"
    folder.mkdir()
    (folder / "azure.csv").write_text(to_csv(AZURE_ROWS))
    old = dt.datetime.combine(TODAY - dt.timedelta(days=STALE_AFTER_DAYS + 30), dt.time(12), dt.UTC)
    os.utime(folder / "azure.csv", (old.timestamp(), old.timestamp()))
    by_dir = run_cli("catalog", "refresh", "--cloud", "azure", GPUHUNT_CATALOG_DIR=str(folder),
                     GPUHUNT_CATALOG_URL="http://127.0.0.1:9/unused")
    assert by_dir.returncode == 0, by_dir.stderr
    assert f"prices of {old.date()} (file date of {folder / 'azure.csv'})" in by_dir.stdout
    assert f"warning: azure: the source's prices are from {old.date()}, older than 90 days" in by_dir.stderr
    # The refreshed file holds what the last refresh brought (older or not); the listing marks it where
    # it is used. The bundled Azure T4 prices are dated (2026-11-23) and newer, so they win there.
    table = run_cli("catalog", "--cloud", "azure", "--gpu", "T4", "--json")
    dates = {o["price_date"] for o in json.loads(table.stdout)["offers"] if o["price"] is not None}
    assert old.date().isoformat() not in dates and dates
    refreshed = json.loads(run_cli("catalog", "--cloud", "azure", "--json").stdout)["offers"]
    older = [o for o in refreshed if o["source"] == "refreshed"]
    assert older and all(o["price_date"] == old.date().isoformat() and o["stale"] for o in older)
    missing = run_cli("catalog", "refresh", "--cloud", "gcp", GPUHUNT_CATALOG_DIR=str(folder))
    assert missing.returncode == 1 and f"error: gcp: no gcp.csv in {folder}" in missing.stderr


def test_bad_flags_are_one_line_exit_2(gpuhunt_server: FakeGpuhunt) -> None:
    for args, expected in [
        (["--cloud", "gpc"], "error: --cloud 'gpc': no price source for that cloud (did you mean 'gcp'?)"),
        (["--region", "x", "--all-regions"], "error: --region and --all-regions exclude each other (give one of them)"),
        (["--source", "/no/such/dir"], "error: --source '/no/such/dir': not a directory or a URL"),
    ]:
        proc = run_cli("catalog", "refresh", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected.split(" (")[0]), lines
    assert gpuhunt_server.requests == []


def test_a_hand_edited_refreshed_file_is_one_error_and_refresh_replaces_it(
        gpuhunt_server: FakeGpuhunt, cloudtrain_home: Path) -> None:
    broken = cloudtrain_home / "catalog" / "aws.csv"
    broken.parent.mkdir(parents=True)
    broken.write_text("cloud,region\naws,us-east-1\n")
    listed = run_cli("catalog")
    assert listed.returncode == 2
    assert listed.stderr.strip().splitlines() == [
        f"error: {broken}: catalog is missing column(s) zone, instance_type, accelerator, accelerator_count, vcpus, "
        "memory_gib, price, spot_price (a refreshed catalog file: delete it or run `cloudtrain catalog refresh`)"]
    fixed = run_cli("catalog", "refresh", "--cloud", "aws", "--source", gpuhunt_server.base)
    assert fixed.returncode == 0, fixed.stderr
    assert "refreshing its cloud replaces it" in fixed.stderr
    assert "aws: 6 offers in eu-west-1, us-east-1, us-east-2, us-west-2," in fixed.stdout  # regions: the bundled ones
    assert run_cli("catalog").returncode == 0


def test_a_version_without_a_date_is_dated_the_day_it_was_fetched(gpuhunt_server: FakeGpuhunt) -> None:
    gpuhunt_server.publish("azure", AZURE_ROWS, version="nightly")
    proc = run_cli("catalog", "refresh", "--cloud", "azure", "--source", gpuhunt_server.base)
    assert proc.returncode == 0, proc.stderr
    assert f"prices of {TODAY} (gpuhunt nightly, which carries no date: dated today)" in proc.stdout
