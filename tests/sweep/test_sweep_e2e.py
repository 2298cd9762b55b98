"""`cloudtrain sweep` end to end on the local provider, as a subprocess with its own CLOUDTRAIN_HOME.

The bundled local recipe trains the real CNN (4 trials x 1 epoch); the others use shell jobs so that
killing, resuming, stopping and deadlines are fast and exact.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import textwrap
import time
from pathlib import Path

from tests.conftest import REPO, cloudtrain
from tests.sweep.conftest import start_sweep_cli, sweep_cli


def _wait_for(predicate, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _shell_sweep(tmp_path: Path, name: str, run: str, sweep: str) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    body = f"name: {name}\nworkdir: code\nresults: [outputs]\nrun: |\n{textwrap.indent(textwrap.dedent(run), '  ')}"
    path.write_text(body + "sweep:\n" + textwrap.indent(textwrap.dedent(sweep), "  "))
    return path


def _nothing_left() -> None:
    status = json.loads(cloudtrain("status", "--json").stdout)
    assert status["clusters"] == [], status["clusters"]


def test_bundled_local_sweep_writes_leaderboard_csv_plots_and_links_the_best(tmp_path: Path) -> None:
    proc = sweep_cli("run", str(REPO / "recipes" / "sweep-mnist-local.yaml"), "--runs-dir", str(tmp_path / "runs"),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = Path(proc.stdout.strip().splitlines()[-1])
    assert results.parent == tmp_path / "runs" and results.name.startswith("sweep-")

    rows = list(csv.DictReader((results / "sweep.csv").open()))
    assert len(rows) == 4 and {r["state"] for r in rows} == {"succeeded"}
    assert sorted((r["lr"], r["batch_size"]) for r in rows) == [
        ("0.001", "128"), ("0.001", "64"), ("0.003", "128"), ("0.003", "64")]
    accuracies = [float(r["test_accuracy"]) for r in rows]
    assert accuracies == sorted(accuracies, reverse=True) and all(0.3 < a <= 1.0 for a in accuracies)
    board = (results / "leaderboard.txt").read_text()
    assert "test_accuracy" in board and "lr" in board and "batch_size" in board
    assert {p.name for p in (results / "plots").iterdir()} == {
        "metric_vs_lr.png", "metric_vs_batch_size.png", "cost_vs_metric.png", "timeline.png"}
    best = results / "best"
    assert best.is_symlink()
    metrics = json.loads((best / "outputs" / "metrics.json").read_text())
    assert metrics["test_accuracy"] == accuracies[0] and metrics["epochs"] == 1
    summary = json.loads((results / "sweep.json").read_text())
    assert summary["status"] == "done" and summary["trials"] == {"succeeded": 4}
    assert summary["vms_booted"] <= 2  # two slots, each reused for a second trial
    _nothing_left()


def test_sigkill_mid_sweep_then_resume_runs_each_trial_exactly_once(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = _shell_sweep(tmp_path, "sweep-kill", f"""\
        echo "$X" >> {marks}/started
        sleep 3
        mkdir -p outputs && echo "{{\\"score\\": $X}}" > outputs/metrics.json
        """, """\
        method: grid
        parameters: {X: [1, 2, 3, 4]}
        max_parallel: 2
        budget_usd: 1
        metric: score
        goal: max
        trial_deadline_minutes: 1
        """)
    proc = start_sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    started = marks / "started"
    try:
        _wait_for(lambda: started.exists() and len(started.read_text().split()) >= 2, what="two trials running")
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    listing = json.loads(sweep_cli("status", "--json").stdout)["sweeps"]
    (sweep,) = listing
    assert sweep["status"] == "running"

    again = sweep_cli("resume", sweep["id"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sorted(started.read_text().split()) == ["1", "2", "3", "4"]  # each trial's job ran once
    detail = json.loads(sweep_cli("status", sweep["id"], "--json").stdout)
    assert detail["status"] == "done"
    assert sorted(t["score"] for t in detail["trials"]) == [1, 2, 3, 4]
    assert all(t["state"] == "succeeded" and t["attempts"] == 1 for t in detail["trials"])
    results = Path(again.stdout.strip().splitlines()[-1])
    assert json.loads((results / "best" / "outputs" / "metrics.json").read_text()) == {"score": 4}
    _nothing_left()


def test_stop_from_another_process_ends_trials_and_releases_every_vm(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = _shell_sweep(tmp_path, "sweep-stop", f"""\
        echo "$X" >> {marks}/started
        sleep 300
        """, """\
        method: random
        parameters: {X: {int: [1, 100]}}
        max_trials: 6
        max_parallel: 2
        budget_usd: 1
        metric: score
        goal: max
        """)
    proc = start_sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    started = marks / "started"
    try:
        _wait_for(lambda: started.exists() and len(started.read_text().split()) >= 2, what="two trials running")
        sweep_id = json.loads(sweep_cli("status", "--json").stdout)["sweeps"][0]["id"]
        stopped = sweep_cli("stop", sweep_id, timeout=120)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert proc.returncode == 1, out[-2000:] + err[-2000:]  # stopped, no trial succeeded
    detail = json.loads(sweep_cli("status", sweep_id, "--json").stdout)
    assert detail["status"] == "stopped"
    assert {t["state"] for t in detail["trials"]} == {"stopped"}
    assert len(started.read_text().split()) == 2  # nothing started after the stop
    _nothing_left()


def test_the_node_enforces_the_trial_deadline(tmp_path: Path) -> None:
    recipe = _shell_sweep(tmp_path, "sweep-deadline", """\
        sleep "$X"
        mkdir -p outputs && echo "{\\"seconds\\": $X}" > outputs/metrics.json
        """, """\
        method: grid
        parameters: {X: [1, 600]}
        budget_usd: 1
        metric: seconds
        goal: min
        trial_deadline_minutes: 0.05
        max_retries: 0
        """)
    proc = sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = Path(proc.stdout.strip().splitlines()[-1])
    rows = {r["X"]: r for r in csv.DictReader((results / "sweep.csv").open())}
    assert rows["1"]["state"] == "succeeded" and rows["600"]["state"] == "timeout"
    assert "deadline" in rows["600"]["error"]
    run_dir = results / rows["600"]["run_dir"]
    assert "reached its deadline of 3s" in (run_dir / "job.log").read_text()
    assert json.loads((run_dir / "run.json").read_text())["exit_code"] == 124
    _nothing_left()


def test_run_and_validate_refuse_a_sweep_recipe_and_point_to_sweep(tmp_path: Path) -> None:
    recipe = REPO / "recipes" / "sweep-mnist-local.yaml"
    for verb in ("validate", "run"):
        proc = cloudtrain(verb, str(recipe), cwd=tmp_path)
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert "sweep-mnist-local.yaml:15: sweep: this is a sweep recipe" in line and "cloudtrain sweep run" in line
    ok = sweep_cli("validate", str(recipe))
    assert ok.returncode == 0 and "grid over lr, batch_size, up to 4 trial(s)" in ok.stdout, ok.stderr
