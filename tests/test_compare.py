"""`cloudtrain compare` core on laid-out metrics (its run on the real job's outputs, one CPU device vs. two
logical ones: tests/jobs/test_mnist_cnn.py::test_compare_reads_one_and_two_device_runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.compare import (CompareError, batch_size_warning, compare_table, default_png_path, device_colours,
                                format_rows, load_runs, render_png)


def _fake_run(path: Path, **metrics: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    base = {"images_per_sec": 1000.0, "sec_per_batch": 0.128, "test_accuracy": 0.98, "device": "NVIDIA T4",
            "gpu_names": ["NVIDIA T4", "NVIDIA T4"], "strategy": "mirrored", "replicas": 2, "epoch_times_s": [3.0, 1.0]}
    base.update(metrics)
    (path / "metrics.json").write_text(json.dumps(base))
    return path


def test_gpu_names_speedup_and_worker_dirs_are_skipped(tmp_path: Path) -> None:
    first = _fake_run(tmp_path / "a" / "outputs", images_per_sec=500.0).parent
    _fake_run(tmp_path / "a" / "outputs" / "worker-1", images_per_sec=1.0)  # a non-chief's scratch copy
    second = _fake_run(tmp_path / "b")
    (second / "run.json").write_text(json.dumps({"hourly_price_usd": 3.6}))
    rows = compare_table(load_runs([first, second]))
    assert rows[0].images_per_sec == 500.0 and rows[1].speedup == 2.0
    assert rows[1].gpu_model == "2x NVIDIA T4" and rows[1].device == "GPU"
    assert rows[1].cost_per_epoch_usd == pytest.approx(3.6 * 2.0 / 3600)
    assert format_rows(rows)[1][1][2] == "2x NVIDIA T4"
    cpu_a = _fake_run(tmp_path / "cpu-a", gpu_names=[], device="CPU")
    cpu_b = _fake_run(tmp_path / "cpu-b", gpu_names=[], device="CPU")
    v100 = _fake_run(tmp_path / "v100", gpu_names=["Tesla V100"])
    colours = device_colours(compare_table(load_runs([cpu_a, second, cpu_b, v100])))
    # By device: the two CPU runs share a colour; each GPU model has its own.
    assert colours[0] == colours[2] and len({colours[0], colours[1], colours[3]}) == 3
    twin = _fake_run(tmp_path / "other" / "a")
    assert [r.name for r in load_runs([first, twin])] == [str(first), str(twin)]  # same basename: full paths


def test_missing_metrics_fields_render_as_dash(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "r", images_per_sec=None, sec_per_batch=None, gpu_names=[], epoch_times_s=[])
    rows = compare_table(load_runs([run]))
    assert rows[0].speedup is None and rows[0].cost_per_epoch_usd is None
    cells = format_rows(rows)[1][0]
    assert cells[6] == cells[7] == cells[8] == cells[11] == "-"
    assert render_png(rows, tmp_path / "c.png").exists()


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no such run directory"),
    (lambda p: p.write_text("x"), "not a directory"),
    (lambda p: p.mkdir(), "no metrics.json"),
    (lambda p: (p.mkdir(), (p / "metrics.json").write_text("{broken")), "not valid JSON"),
    (lambda p: (p.mkdir(), (p / "metrics.json").write_text("[1]")), "expected a JSON object"),
    (lambda p: (p.mkdir(), (p / "metrics.json").write_text('{"test_accuracy": 1}')), "missing images_per_sec"),
    (lambda p: (_fake_run(p), (p / "run.json").write_text('{"hourly_price_usd": "cheap"}')), "should be a number"),
    (lambda p: (_fake_run(p / "n1"), _fake_run(p / "n2")), "several metrics.json"),
    (lambda p: _fake_run(p, images_per_sec="fast"), "should be a number"),
])
def test_bad_run_dirs_raise_compare_error(tmp_path: Path, setup: Any, message: str) -> None:
    run = tmp_path / "run"
    setup(run)
    with pytest.raises(CompareError, match=message) as info:
        load_runs([run])
    from cloudtrain.errors import UsageError

    assert isinstance(info.value, UsageError) and str(run) in str(info.value)


def test_no_runs(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="no run directories"):
        load_runs([])
    with pytest.raises(CompareError):
        render_png([], tmp_path / "x.png")


def test_batch_sizes_that_differ_are_named(tmp_path: Path) -> None:
    small = _fake_run(tmp_path / "small", global_batch_size=64, gpu_names=[])
    big = _fake_run(tmp_path / "big", global_batch_size=256)
    same = _fake_run(tmp_path / "same", global_batch_size=64, gpu_names=[])
    warning = batch_size_warning(compare_table(load_runs([small, big, same])))
    assert warning is not None and "batch sizes differ" in warning and "small 64" in warning and "big 256" in warning
    assert batch_size_warning(compare_table(load_runs([small, same]))) is None


def test_epochs_that_differ_are_warned_about(tmp_path: Path) -> None:
    from cloudtrain.compare import epochs_warning

    short = _fake_run(tmp_path / "short", epochs=2)
    long = _fake_run(tmp_path / "long", epochs=10)
    also = _fake_run(tmp_path / "also", epochs=2)
    warning = epochs_warning(compare_table(load_runs([short, long])))
    assert warning is not None and "epochs differ" in warning and "short 2" in warning and "long 10" in warning
    assert epochs_warning(compare_table(load_runs([short, also]))) is None


def test_chart_goes_next_to_the_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert default_png_path([runs / "a", runs / "b"]) == runs / "compare.png"
    assert default_png_path([runs / "a"]) == runs / "compare.png"
    # Runs from two places: beside the first, never their far common ancestor ($HOME, /) (35.12).
    assert default_png_path([runs / "x" / "a", runs / "y" / "b"]) == runs / "x" / "compare.png"


def test_compare_command_writes_next_to_the_runs_and_warns(tmp_path: Path) -> None:
    """Not into whatever directory the user is in (issue 14.9); different batch sizes get a warning."""
    runs = tmp_path / "runs"
    _fake_run(runs / "gpu", global_batch_size=256)
    _fake_run(runs / "cpu", global_batch_size=128, gpu_names=[], device="CPU")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    res = subprocess.run([sys.executable, "-m", "cloudtrain", "compare", str(runs / "cpu"), str(runs / "gpu")],
                         capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert not list(elsewhere.iterdir())
    assert (runs / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart: {runs / 'compare.png'}" in res.stdout
    assert res.stderr.startswith("warning: batch sizes differ") and "cpu 128" in res.stderr, res.stderr
    header = res.stdout.splitlines()[0].split()
    assert {"batch", "test", "acc", "cost/epoch"} <= set(header)
    again = subprocess.run([sys.executable, "-m", "cloudtrain", "compare", *sorted(map(str, runs.iterdir()))],
                           capture_output=True, text=True, timeout=120, cwd=elsewhere)  # `compare runs/*`
    assert again.returncode == 0 and f"skipped {runs / 'compare.png'}: a chart" in again.stderr, again.stderr
    chosen = tmp_path / "out" / "chart.png"
    res = subprocess.run([sys.executable, "-m", "cloudtrain", "compare", str(runs / "cpu"), "--output", str(chosen)],
                         capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert res.returncode == 0 and chosen.is_file() and res.stderr == "", res.stderr
