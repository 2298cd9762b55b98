"""`cloudtrain report` from a fixture state: its numbers are `cost --json`'s, `sweep status --json`'s
and `status --json`'s; the page loads in a real headless browser with the network off, without a
console error, and shows its charts and totals."""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from cloudtrain.cluster.spend_report import cost_summary
from cloudtrain.cli.output import money
from cloudtrain.report import write_report
from cloudtrain.report.data import gather
from cloudtrain.state import StateStore
from tests.conftest import cloudtrain
from tests.report.browser import load, missing
from tests.report.fixture import SWEEP_ID, build


def _json(*args: str) -> dict:
    got = cloudtrain(*args, timeout=120)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def _cells(page: str, table_id: str) -> list[list[str]]:
    """The text of every body row's cells of table `table_id` (rows end where the next begins)."""
    body = page.split(f'<table id="{table_id}"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.split(r"<t[dh][^>]*>", row)[1:]]
            for row in body.strip().split("<tr>") if row.strip()]


@pytest.fixture
def state(tmp_path: Path):  # noqa: ANN201
    store = StateStore()
    fixture = build(store, tmp_path / "runs", time.time())
    yield store, fixture
    store.close()


def test_every_number_is_what_cost_sweep_and_status_json_say(state, tmp_path: Path) -> None:  # noqa: ANN001
    store, fixture = state
    started = time.time()
    cost = _json("cost", "--json", "--no-refresh")
    sweep = _json("sweep", "status", SWEEP_ID, "--json")
    status = _json("status", "--json")
    out = tmp_path / "site" / "report.html"
    done = cloudtrain("report", "--no-refresh", "--output", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"report: {out}" in done.stdout + done.stderr
    page = out.read_text()
    # What bills now (a running cluster) accrues between the two commands: at most this much.
    slack = fixture.running_usd_h * (time.time() - started) / 3600 + 0.006
    total = re.search(r'id="card-total">Total spent<b>\$([0-9.,]+)</b>', page)
    assert total is not None and float(total.group(1).replace(",", "")) == pytest.approx(cost["total_usd"], abs=slack)
    rows = {r[0]: r for r in _cells(page, "clusters")}
    assert sorted(rows) == sorted(c["cluster"] for c in cost["clusters"])
    for c in cost["clusters"]:
        row = rows[c["cluster"]]
        assert row[1:3] == [c["cloud"], c["status"]]
        assert float(row[4].lstrip("$")) == pytest.approx(c["usd"], abs=slack)
        assert row[5] == ("yes" if c["billing_now"] else "no")
    # The sweep: spend and trials as `sweep status ID --json`.
    spent = re.search(r'class="sweep-spent" data-v="([0-9.e-]+)"', page)
    assert spent is not None and float(spent.group(1)) == pytest.approx(sweep["spent_usd"], abs=1e-6)
    board = _cells(page, f"lb-{SWEEP_ID}")
    best = max((t for t in sweep["trials"] if t["val_accuracy"] is not None), key=lambda t: t["val_accuracy"])
    assert board[0][1] == str(best["trial"]) and float(board[0][4]) == pytest.approx(best["val_accuracy"])
    # Runs: every run `status --json` lists, with its status and cost; the ids link to run directories.
    runs = {r[0]: r for r in _cells(page, "runs-table")}
    for r in status["runs"]:
        assert runs[r["id"]][3] == r["status"] and runs[r["id"]][6] == money(r["cost_usd"])
    assert 'href="../runs/run-gpu/"' in page
    # The bundled job's CPU-vs-GPU table, speed-up against the CPU run.
    compare = _cells(page, "comparison")
    assert [r[1] for r in compare] == ["CPU", "GPU"] and compare[1][8] == f"{6700 / 980:.2f}x"
    # One file, nothing fetched: no external URL anywhere in it.
    assert not re.search(r'(src|href)="(https?:)?//', page) and "@import" not in page


def test_the_days_add_up_to_costs_total_and_each_cloud_to_its_clusters(state) -> None:  # noqa: ANN001
    store, fixture = state
    for since in (0.0, fixture.now - 86400, fixture.now - 3600):
        data = gather(store, since, fixture.now)
        summary = cost_summary(store, since, fixture.now)
        assert data.cost.total_usd == summary.total_usd
        for daily in (data.by_cloud, data.by_cluster, data.by_owner):
            assert daily.total() == pytest.approx(summary.total_usd, abs=1e-9)
        per_cloud: dict[str, float] = {}
        for s in summary.spends:
            per_cloud[s.cloud] = per_cloud.get(s.cloud, 0.0) + s.usd
        assert {k: pytest.approx(sum(v), abs=1e-9) for k, v in data.by_cloud.series.items()} == per_cloud
    data = gather(store, 0.0, fixture.now)
    assert set(data.by_owner.series) == {"ana", "ben", "not recorded (cluster gone)"}
    # Every UTC day from the first billed second to now (3 or 4 of them: it depends on the time of day).
    first = min(b.started_at for b in store.billing(since=0.0))
    assert len(data.by_cloud.days) == int(fixture.now // 86400) - int(first // 86400) + 1
    # The sweep's line ends where its ledger does.
    (view,) = data.sweeps
    assert view.spend[-1].usd == pytest.approx(view.detail["spent_usd"], abs=1e-6)
    assert all(a.usd <= b.usd for a, b in zip(view.spend, view.spend[1:]))
    # What bills now: the running cluster's two nodes and disks, the stopped one's disk.
    assert sum(b.compute_usd_h + b.disk_usd_h for b in data.billing) == pytest.approx(fixture.running_usd_h)


def test_since_and_bad_input(state, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "r.html"
    store, fixture = state
    started = time.time()
    assert cloudtrain("report", "--no-refresh", "--since", "1d", "-o", str(out)).returncode == 0
    cost = _json("cost", "--json", "--no-refresh", "--since", "1d")
    page = out.read_text()
    total = re.search(r'id="card-total">Total spent<b>\$([0-9.,]+)</b>', page)
    slack = fixture.running_usd_h * (time.time() - started) / 3600 + 0.006
    assert total is not None and float(total.group(1).replace(",", "")) == pytest.approx(cost["total_usd"], abs=slack)
    assert cost["total_usd"] < _json("cost", "--json", "--no-refresh")["total_usd"]
    assert "run-gpu" not in page and "run-tune-2" in page  # runs started since, as cost lists them
    for args, word in ((["--since", "last week"], "--since"), (["--all-users"], "--all-users")):
        bad = cloudtrain("report", "--no-refresh", "-o", str(out), *args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and word in bad.stderr, bad.stderr


def test_gc_section_says_what_was_asked(tmp_path: Path, cloudtrain_home: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.testing.aws import isolate_aws_env

    isolate_aws_env(monkeypatch, tmp_path, {"AWS_EC2_METADATA_DISABLED": "true"})
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(tmp_path / "none.yaml"))
    # A local node whose state is gone: what `gc` calls a leak, found by what it left behind.
    (tmp_path / "r.yaml").write_text("name: leaky\nrun: 'true'\n")
    assert cloudtrain("up", str(tmp_path / "r.yaml")).returncode == 0
    try:
        out = tmp_path / "r.html"
        got = cloudtrain("report", "--no-refresh", "--gc", "-o", str(out))
        assert got.returncode == 0, got.stderr
        page = out.read_text()
        assert "Not set up here (no credentials): aws, gcp, azure" in page and "Nothing leaked in local" in page
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (cloudtrain_home / name).unlink(missing_ok=True)
        got = cloudtrain("report", "--no-refresh", "--gc", "-o", str(out))
        assert got.returncode == 0, got.stderr
        leaks = _cells(out.read_text(), "leaks-table")
        assert [r[:2] for r in leaks] == [["local", "leaky"]] and "cluster not in state" in leaks[0][6]
    finally:
        cloudtrain("gc", "--cloud", "local", "--yes")


def test_ten_thousand_runs_stay_under_five_megabytes(tmp_path: Path) -> None:
    store = StateStore()
    fixture = build(store, tmp_path / "runs", time.time(), extra_runs=10_000)
    page = write_report(store, tmp_path / "report.html", 0.0, fixture.now)
    assert page.stat().st_size <= 5_000_000
    assert len(_cells(page.read_text(), "runs-table")) == 10_005


def _png_pixels(png: bytes):  # noqa: ANN202 - numpy array (height, width, 3)
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_in_a_real_browser_with_the_network_off(state, tmp_path: Path, dark: bool) -> None:  # noqa: ANN001
    why = missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)  # in CI a missing browser is a broken setup, not a pass
        pytest.skip(why)
    store, fixture = state
    page = write_report(store, tmp_path / "report.html", 0.0, fixture.now)
    got = load(page, ids=("card-total", "card-rate", "spend"), dark=dark)
    errors = [e for e in got.console if e.get("level") in ("SEVERE", "ERROR", "WARNING")]
    assert errors == [], errors
    summary = cost_summary(store, 0.0, fixture.now)
    assert money(summary.total_usd) in got.texts["card-total"]
    assert money(fixture.running_usd_h) in got.texts["card-rate"]
    assert "Per day, by cloud" in got.texts["spend"]
    assert got.sorted_first == "run-cpu"  # sorting by cost works: the free local run first
    (tmp_path / "shot.png").write_bytes(got.screenshot)
    pixels = _png_pixels(got.screenshot)
    # The charts drew their bars: the palette's first three colours cover real areas of the page.
    for rgb in ((0x00, 0x72, 0xB2), (0xE6, 0x9F, 0x00), (0x00, 0x9E, 0x73)):
        assert int((abs(pixels - rgb) <= 8).all(axis=2).sum()) > 2000, rgb
    corner = pixels[5, 5]  # the page's background, outside any element
    assert (int(corner.sum()) < 100) is dark, corner  # prefers-color-scheme picked the page's colours
