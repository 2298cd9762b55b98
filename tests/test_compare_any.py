"""`compare` on runs of any script: run.json's timings, cost and exit status, and every numeric
metric the runs' outputs/metrics.json share (cloudtrain/compare_any.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.compare import value_axis
from cloudtrain.compare_any import flatten, load_all, shared_metrics, table
from tests.conftest import cloudtrain


@pytest.mark.parametrize(("data", "flat"), [
    ({"loss": 0.5, "acc": 1}, {"loss": 0.5, "acc": 1.0}),
    ({"eval": {"loss": 0.2, "f1": {"macro": 0.7}}}, {"eval.loss": 0.2, "eval.f1.macro": 0.7}),
    ({"ok": True, "name": "x", "curve": [1, 2], "nan": float("nan")}, {}),
])
def test_flatten_keeps_numeric_leaves(data: dict[str, Any], flat: dict[str, float]) -> None:
    assert flatten(data) == flat


def _run(root: Path, name: str, record: dict[str, Any] | None, metrics: dict[str, Any] | None) -> Path:
    run_dir = root / name
    (run_dir / "outputs").mkdir(parents=True)
    if record is not None:
        (run_dir / "run.json").write_text(json.dumps(record))
    if metrics is not None:
        (run_dir / "outputs" / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def test_runs_of_your_own_script_compare_on_what_they_share(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", {"status": "succeeded", "exit_code": 0, "wall_time_s": 12.5, "cost_usd": 0.0,
                             "phases_s": {"run": 10.0}}, {"loss": 0.25, "eval": {"acc": 0.9}, "only_a": 1})
    b = _run(tmp_path, "b", {"status": "failed", "exit_code": 3, "wall_time_s": 4.0, "cost_usd": 0.012,
                             "phases_s": {"run": 2.0}}, {"loss": 0.5, "eval": {"acc": 0.8}})
    c = _run(tmp_path, "c", {"status": "failed", "exit_code": 1, "wall_time_s": 1.0}, None)  # died before writing any
    runs = load_all([a, b])
    assert shared_metrics(runs) == ["loss", "eval.acc"] and not any(r.bundled for r in runs)
    headers, rows, partial = table(runs)
    assert headers == ["run", "status", "exit", "wall s", "job s", "cost", "loss", "eval.acc"]
    assert rows == [["a", "succeeded", "0", "12.5", "10.0", "$0", "0.25", "0.9"],
                    ["b", "failed", "3", "4.0", "2.0", "$0.012", "0.5", "0.8"]]
    assert partial == ["only_a"]

    shown = cloudtrain("compare", str(a), str(b), str(c))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["run", "status", "exit", "wall", "s", "job", "s", "cost"]
    assert any(line.split()[:3] == ["c", "failed", "1"] for line in lines)
    assert "no metric common to these runs" in shown.stdout  # c has none
    # --output for runs of your own scripts: nothing is drawn, and that is said (35.12).
    chart = tmp_path / "chart.png"
    asked = cloudtrain("compare", str(a), str(b), "--output", str(chart))
    assert asked.returncode == 0 and not chart.exists()
    assert f"--output {chart}: nothing written" in asked.stderr, asked.stderr


def test_a_directory_that_is_no_run_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    shown = cloudtrain("compare", str(tmp_path / "empty"))
    assert shown.returncode == 2 and "not a run directory" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("values", "limits"), [
    ([0.0, 0.0], (0.0, 1.0)),     # free runs: no scale, never $-0.060
    ([None, 0.0], (0.0, 1.0)),
    ([0.0, 0.012], None),         # autoscaled from 0
])
def test_a_panel_of_nothing_has_a_fixed_axis(values: list[float | None], limits: tuple[float, float] | None) -> None:
    assert value_axis(values) == limits
