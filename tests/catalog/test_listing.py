"""`cloudtrain catalog`: the sorted table, its filters, STALE prices, and one-line errors for bad flags."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cloudtrain.catalog import Catalog, bundled_files, write_csv
from tests.catalog.conftest import _ENTRY, run_cli
from tests.conftest import cli_env

TODAY = dt.date.today()


def offers(*args: str) -> list[dict]:
    proc = run_cli("catalog", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["offers"]


def test_the_table_is_sorted_cheapest_first_and_filters_combine() -> None:
    everything = offers()
    assert len(everything) == len(Catalog().offers)
    priced = [o["price"] for o in everything if o["price"] is not None]
    # Priced offers cheapest first, then those whose price is unknown (never shown as a price).
    assert priced == sorted(priced) and everything[:len(priced)] == [o for o in everything if o["price"] is not None]

    spot = offers("--spot", "--gpu", "t4")
    assert spot and all(o["gpu"] == "T4" and o["spot_price"] is not None for o in spot)
    assert [o["spot_price"] for o in spot] == sorted(o["spot_price"] for o in spot)
    assert spot[0]["spot_price"] == min(o.spot_price for o in Catalog().query(accelerator="T4", spot=True))

    many = offers("--gpu", "T4:2")
    assert many and all(o["gpu"] == "T4" and o["gpu_count"] >= 2 for o in many)
    two_regions = offers("--cloud", "aws", "--region", "us-east-2", "--region", "eu-west-1")
    assert {o["region"] for o in two_regions} == {"us-east-2", "eu-west-1"}
    assert {o["cloud"] for o in offers("--cloud", "aws", "--cloud", "gcp")} == {"aws", "gcp"}

    table = run_cli("catalog", "--gpu", "A10G", "--cloud", "aws", "-n", "2")
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["CLOUD", "REGION", "INSTANCE", "TYPE", "GPU", "GPU", "MEM", "VCPUS", "RAM",
                                "ON-DEMAND/H", "SPOT/H", "PRICE", "DATE", "SOURCE"]
    assert lines[1].split()[:5] == ["aws", "us-east-1", "g5.xlarge", "A10G:1", "24"]
    # 12 priced A10G offers, then 18 of sizes sold without a known price (g5.8xlarge, ...).
    assert "$1.006" in lines[1] and lines[-1] == "(30 more; without -n all are shown)"
    assert run_cli("catalog", "--gpu", "H100", "--region", "eu-west-1", "--cloud", "aws").stdout == "no offers match\n"


def test_a_refreshed_price_older_than_the_bundled_one_does_not_hide_it(cloudtrain_home: Path) -> None:
    bundled = Catalog().find("aws", "us-east-1", "g4dn.xlarge")
    assert bundled.price_date is not None
    write_csv(cloudtrain_home / "catalog" / "aws.csv", [
        replace(bundled, price=9.99, price_date=bundled.price_date - dt.timedelta(days=1))])
    [shown] = offers("--cloud", "aws", "--region", "us-east-1", "--gpu", "T4:1", "-n", "1")
    assert (shown["price"], shown["price_date"]) == (bundled.price, bundled.price_date.isoformat())


def test_undated_and_old_refreshed_prices_are_flagged(cloudtrain_home: Path) -> None:
    base = Catalog().find("aws", "us-east-1", "m5.large")
    write_csv(cloudtrain_home / "catalog" / "aws.csv", [
        replace(base, region="ap-south-1", price_date=TODAY - dt.timedelta(days=200)),
        replace(base, region="ap-south-2", price_date=None),
        replace(base, region="ap-east-1", price_date=TODAY),
    ])
    table = run_cli("catalog", "--cloud", "aws", "--region", "ap-south-1", "--region", "ap-south-2",
                    "--region", "ap-east-1")
    rows = {line.split()[1]: line for line in table.stdout.splitlines()[1:]}
    # The price date, then where the price came from.
    assert rows["ap-south-1"].split()[-3:] == [str(TODAY - dt.timedelta(days=200)), "STALE", "refreshed"]
    assert rows["ap-south-2"].split()[-3:] == ["unknown", "STALE", "refreshed"]
    assert rows["ap-east-1"].split()[-2:] == [TODAY.isoformat(), "refreshed"]
    assert table.stderr == ("warning: 2 of 3 prices are older than 90 days or undated (STALE); "
                            "`cloudtrain catalog refresh` updates them\n")
    stale = {o["region"]: o["stale"] for o in offers("--cloud", "aws", "--region", "ap-south-1", "--region", "ap-east-1")}
    assert stale == {"ap-south-1": True, "ap-east-1": False}


@pytest.mark.parametrize("args, line", [
    (["--cloud", "gpc"], "error: --cloud 'gpc': no offers of that cloud in the catalog (did you mean 'gcp'?)"),
    (["--cloud", "aws", "--region", "us-east1"], "error: --region 'us-east1': a region of gcp, not of aws (did you mean 'us-east-1'?)"),
    (["--region", "mars-1"], "error: --region 'mars-1': no offers in that region in the catalog (regions: "),
    (["--gpu", "l40"], "error: --gpu 'l40': the catalog cloudtrain knows has no such GPU (`cloudtrain catalog refresh` "
                       "updates it) (did you mean 'L40S'?)"),
    (["--gpu", "T4:0"], "error: --gpu 'T4:0': expected GPU or GPU:COUNT with a COUNT of 1 or more (e.g. --gpu T4:2)"),
    (["-n", "0"], "error: invalid value for '-n' / '--limit'"),
    (["refesh"], "error: no such command 'refesh' (did you mean 'refresh'?"),
    (["--spot", "refresh"], "error: `catalog refresh` takes its own options, after its name"),
])
def test_bad_flags_are_one_line_with_a_hint_exit_2(args: list[str], line: str) -> None:
    proc = run_cli("catalog", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), lines


def _modules_after(*args: str) -> set[str]:
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('\\n'.join(sorted(sys.modules)), file=sys.stderr))\n" + _ENTRY.replace("; ", "\n"))
    proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120, env=cli_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stderr.split())


NETWORK = {"urllib.request", "http.client", "cloudtrain.catalog.refresh", "cloudtrain.catalog.gpuhunt_format"}


@pytest.mark.parametrize("args", [["--help"], ["status"], ["catalog"], ["catalog", "--gpu", "T4", "--json"]])
def test_only_refresh_pays_for_the_network_code(args: list[str]) -> None:
    loaded = _modules_after(*args)
    assert not {m for m in loaded if m.split(".")[0] == "gpuhunt"}
    assert not (NETWORK & loaded), NETWORK & loaded
    if args[0] != "catalog":
        assert "cloudtrain.catalog" not in loaded


def test_every_price_says_where_it_came_from() -> None:
    table = run_cli("catalog", "--gpu", "T4:1", "--cloud", "aws", "--cloud", "gcp")
    rows = [line.split() for line in table.stdout.splitlines()[1:] if line.startswith(("aws ", "gcp "))]
    # Each bundled row shows the date its own CSV row carries (the rows cloudtrain recorded, and the
    # rows priced later from a published catalog, each keep theirs).
    dated = {(o.cloud, o.region, o.instance_type): o.price_date.isoformat()
             for o in Catalog(files=bundled_files()).offers if o.price is not None and o.price_date}
    shown = [row for row in rows if row[-1] == "bundled"]
    assert {row[0] for row in shown} == {"aws", "gcp"}
    assert all(row[-2] == dated[(row[0], row[1], row[2])] for row in shown), shown
    # GCP's prices carry the day cloudtrain recorded them (their source says so), not a made-up one.
    assert "gcp: bundled prices written without a recorded source or date" not in table.stdout
    assert {o["source"] for o in offers("--cloud", "gcp")} == {"bundled"}
    assert all(o["price_source"] for o in offers("--cloud", "gcp") if o["price"] is not None)
    # A type sold there without a known price is listed as such, never with a price.
    unknown = [row for row in rows if row[-2:] == ["unknown"]]
    assert all("unknown" in row for row in unknown)
