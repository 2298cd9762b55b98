"""Spend is price x billed time over recorded intervals, with a controlled clock (issue 12.4)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloudtrain.cost import HOURS_PER_MONTH, disk_hourly, disk_price, flat_hourly, spend
from cloudtrain.state import StateStore
from tests.conftest import cli_env

T0 = 1_700_000_000.0  # a fixed clock (2023): every interval below starts here


def test_running_then_stopped_then_running_then_down(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    nodes = ["i-1", "i-2"]
    store.bill("c", "aws", nodes, "running", 0.526, at=T0)
    store.bill("c", "aws", nodes, "stopped", disk_hourly("aws"), at=T0 + 3600)  # 1 h running
    store.bill("c", "aws", nodes, "running", 0.526, at=T0 + 3 * 3600)  # 2 h stopped
    store.end_billing("c", at=T0 + 3.5 * 3600)  # 0.5 h running, then down
    expected = 2 * (1.0 * 0.526 + 2.0 * disk_hourly("aws") + 0.5 * 0.526)
    got = spend(store.billing("c"), until=T0 + 10 * 3600)
    assert got.usd == pytest.approx(expected, rel=0.01)
    assert got.billed_s == pytest.approx(2 * 3.5 * 3600)
    assert not got.running
    # Clipped to a window: only what was billed inside it.
    window = spend(store.billing("c", since=T0 + 3 * 3600), since=T0 + 3 * 3600, until=T0 + 10 * 3600)
    assert window.usd == pytest.approx(2 * 0.5 * 0.526, rel=0.01)


def test_open_interval_bills_until_now(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    store.bill("s", "aws", ["i-9"], "running", 0.2104, at=T0)
    got = spend(store.billing("s"), until=T0 + 1800)
    assert got.usd == pytest.approx(0.1052, rel=0.01) and got.running


def test_a_failed_launch_costs_its_seconds_only(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    store.bill("f", "aws", ["i-x"], "running", 3.6, at=T0)
    store.end_billing("f", at=T0 + 10)
    assert spend(store.billing("f"), until=T0 + 86400).usd == pytest.approx(0.01)


def test_cost_command_reports_per_cluster_and_total(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    store.bill("a", "aws", ["i-1"], "running", 1.0, at=T0)
    store.end_billing("a", at=T0 + 1800)
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "cost", "--json"], capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["total_usd"] == pytest.approx(0.5, rel=0.01)
    assert data["clusters"][0]["cluster"] == "a" and data["clusters"][0]["status"] == "down"
    bad = subprocess.run([sys.executable, "-m", "cloudtrain", "cost", "--since", "last tuesday"],
                         capture_output=True, text=True, env=cli_env(), timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--since" in bad.stderr


def test_disk_and_flat_prices_come_from_the_storage_tables() -> None:
    # disks.csv: USD per GB-month; the hourly cost of a disk is that x size / hours in a month.
    assert disk_price("aws") == pytest.approx(0.08)  # EBS gp3 list price
    assert disk_hourly("aws", 50) == pytest.approx(disk_price("aws") * 50 / HOURS_PER_MONTH)
    assert all(disk_price(cloud) > 0 for cloud in ("aws", "gcp", "azure"))
    # A cloud the table lacks: no price (None), where disk_hourly (billing a stop) says 0.
    assert disk_price("elsewhere") is None and disk_hourly("elsewhere", 50) == 0.0
    # flat.csv: Azure's listed price of a Standard static IPv4 public IP, per hour.
    assert flat_hourly("azure", "public-ip") == 0.005
    assert flat_hourly("azure", "nat-gateway") is None and flat_hourly("elsewhere", "public-ip") is None
