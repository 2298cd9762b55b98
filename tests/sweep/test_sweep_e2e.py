"""`cloudtrain sweep` end to end on the local provider, as a subprocess with its own CLOUDTRAIN_HOME.

The bundled local recipe trains the real CNN (4 trials x 1 epoch); the others use shell jobs so that
killing, resuming, stopping and deadlines are fast and exact.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cloudtrain.testing.wait import wait_until
from tests.conftest import REPO, cloudtrain
from tests.sweep.conftest import start_sweep_cli, sweep_cli


def _wait_for(predicate, timeout: float = 120.0, what: str = "condition") -> None:  # noqa: ANN001
    wait_until(predicate, timeout, what)


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
    # Resuming a stopped sweep says why there is nothing to resume, and what to do instead (35.12).
    again = sweep_cli("resume", sweep_id)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "was stopped" in again.stderr and "sweep status" in again.stderr and "sweep run" in again.stderr
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


def _node_dirs(sweep_id: str) -> list[Path]:
    """The local nodes of a sweep's VMs (a local node is a directory under CLOUDTRAIN_HOME)."""
    base = Path(os.environ["CLOUDTRAIN_HOME"]) / "local"
    return sorted(base.glob(f"local-sw-{sweep_id}-*")) if base.is_dir() else []


def test_a_dead_cli_leaves_no_vm_past_its_lease_and_resume_finishes(tmp_path: Path) -> None:
    """The bound when the laptop dies: each VM's watchdog deletes it at its lease end, no CLI needed."""
    marks = tmp_path / "marks"
    marks.mkdir()
    # Leases of ~24 s: 6 s boot + 6 s setup + 6 s deadline (the job takes 2 s) + 3 s collect (the
    # delete is called release_minutes and a margin before each lease ends).
    recipe = _shell_sweep(tmp_path, "sweep-lease", f"""\
        echo "$X" >> {marks}/started
        sleep 2
        mkdir -p outputs && echo "{{\\"score\\": $X}}" > outputs/metrics.json
        """, """\
        method: grid
        parameters: {X: [1, 2]}
        max_parallel: 2
        budget_usd: 1
        metric: score
        goal: max
        trial_deadline_minutes: 0.1
        reserve: {boot_minutes: 0.1, setup_minutes: 0.1, collect_minutes: 0.05, release_minutes: 0.05}
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
    sweep_id = json.loads(sweep_cli("status", "--json").stdout)["sweeps"][0]["id"]
    nodes = _node_dirs(sweep_id)
    assert len(nodes) == 2
    for node in nodes:
        config = json.loads((node / ".cloudtrain" / node.name[len("local-"):-2] / "watchdog.json").read_text())
        assert config["lease"]["why"] == f"sweep {sweep_id}" and config["action"]["effect"] == "delete"
        assert config["lease"]["until"] > time.time()
    # No CLI runs: each node's own watchdog deletes it at its lease end.
    _wait_for(lambda: not _node_dirs(sweep_id), timeout=120, what="the watchdogs to delete both nodes")

    again = sweep_cli("resume", sweep_id, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    detail = json.loads(sweep_cli("status", sweep_id, "--json").stdout)
    assert detail["status"] == "done"
    assert sorted(t["score"] for t in detail["trials"]) == [1, 2]
    # Each trial succeeded exactly once: its first attempt went with its VM (preempted), the retry ran.
    for trial in detail["trials"]:
        mine = sorted((a["attempt"], a["state"]) for a in detail["attempts"] if a["trial"] == trial["trial"])
        assert trial["state"] == "succeeded" and mine == [(1, "preempted"), (2, "succeeded")], detail
    assert sorted(started.read_text().split()) == ["1", "1", "2", "2"]
    _nothing_left()


def test_a_cloud_without_a_watchdog_says_the_bound_covers_the_job_only(tmp_path: Path) -> None:
    recipe = tmp_path / "ssh-sweep.yaml"
    recipe.write_text(textwrap.dedent("""\
        name: ssh-sweep
        resources:
          cloud: ssh
          hosts: [{address: 127.0.0.1}]
        run: echo hi
        sweep:
          method: grid
          parameters: {X: [1, 2]}
          budget_usd: 1
          metric: score
          goal: max
        """))
    proc = sweep_cli("validate", str(recipe))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "take no lease" in proc.stderr and "deadline on the node" in proc.stderr
    # What happens to a lost trial: the sweep's retry (the default max_retries), never the recipe's recover:.
    assert "retries: the sweep runs a failed, preempted or lost trial again, up to 1 time(s)" in proc.stdout


def _wait_for_value(fn, timeout: float, what: str):  # noqa: ANN001, ANN202
    return wait_until(fn, timeout, what)


def test_a_preempted_trial_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    """A trial's VM vanishes under its job (the local provider's terminate, what a spot preemption or
    the watchdog's delete does) after three checkpoints: the retry on a new VM gets the checkpoint the
    sweep kept on the laptop back in its $CLOUDTRAIN_CHECKPOINT_DIR, resumes there and ends the run
    with the whole history. The bundled CNN's side of this (its ckpt-N files come home, its script
    copies them into outputs/, it resumes) is proven for `run` by tests/e2e/test_recovery_e2e.py
    (test_the_bundled_cnn_told_by_the_notice_saves_where_it_is_and_the_next_attempt_starts_there) and
    tests/jobs/test_mnist_cnn.py (test_killed_after_epoch_two_resumes_at_three); that a sweep's
    `job:` trial keeps those files, by test_a_bundled_job_trial_keeps_the_bundled_jobs_checkpoints."""
    marks = tmp_path / "marks"
    marks.mkdir()
    # Resumes from $CLOUDTRAIN_CHECKPOINT_DIR (its step and its history of steps), checkpoints there
    # after every step (new file, then rename), then prints the epoch line and appends its progress
    # event (what the checkpoint puller hears, run/follow.py); the first attempt waits
    # after step 3 until the test has taken its VM away (`go`), so the loss is mid-run.
    recipe = _shell_sweep(tmp_path, "sweep-ckpt", f"""\
        ckpt="$CLOUDTRAIN_CHECKPOINT_DIR"; mkdir -p "$ckpt"
        start=$(cat "$ckpt/step" 2>/dev/null || echo 0)
        echo "$CLOUDTRAIN_SWEEP_ATTEMPT $start" >> {marks}/starts
        echo "resuming from the checkpoint after epoch $start"
        i=$start
        while [ "$i" -lt 12 ]; do
          i=$((i + 1))
          echo "$i" >> "$ckpt/history"
          echo "$i" > "$ckpt/step.new" && mv "$ckpt/step.new" "$ckpt/step"
          echo "epoch $i/12  loss 0.5"
          printf '{{"cloudtrain":"progress","type":"epoch","epoch":%d,"epochs":12,"loss":0.5}}\\n' "$i" >> "$CLOUDTRAIN_PROGRESS_FILE"
          if [ "$i" = 3 ] && [ ! -f {marks}/go ]; then
            while [ ! -f {marks}/go ]; do sleep 0.1; done
          fi
        done
        mkdir -p outputs
        echo "{{\\"score\\": $start, \\"resumed_from_epoch\\": $start, \\"epochs\\": $i}}" > outputs/metrics.json
        cp "$ckpt/history" outputs/history
        """, """\
        method: grid
        parameters: {X: [1]}
        budget_usd: 1
        metric: score
        goal: max
        """)
    proc = start_sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    try:
        info = _wait_for_value(lambda: next((tmp_path / "runs").glob(
            "sweep-*/trials/t0000-a1/checkpoint/cloudtrain-checkpoint.json"), None), timeout=120, what="a kept copy")
        _wait_for(lambda: _kept_epoch(info) == 3, what="the checkpoint of step 3 kept on the laptop")
        sweep_id = info.parts[-5].removeprefix("sweep-")
        (node,) = _node_dirs(sweep_id)
        # The VM goes away under its job, as a preemption looks to the sweep: no `down`, state not told.
        gone = subprocess.run([sys.executable, "-m", "cloudtrain.providers.local", "terminate", "--base",
                               str(node.parent), node.name], capture_output=True, text=True, timeout=60, check=False)
        assert gone.returncode == 0, gone.stderr
        out, err = proc.communicate(timeout=300)
    finally:
        (marks / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    detail = json.loads(sweep_cli("status", sweep_id, "--json").stdout)
    attempts = sorted((a["attempt"], a["state"]) for a in detail["attempts"])
    assert attempts == [(1, "preempted"), (2, "succeeded")], detail
    results = Path(out.strip().splitlines()[-1])
    kept = results / "trials" / "t0000-a1" / "checkpoint"
    assert json.loads((kept / "cloudtrain-checkpoint.json").read_text())["epoch"] == 3
    assert (kept / "step").read_text().strip() == "3" and (kept / "history").read_text().split() == ["1", "2", "3"]
    # The second attempt started from the newest checkpoint the sweep had kept of the first one.
    assert (marks / "starts").read_text().splitlines() == ["1 0", "2 3"]
    (second,) = (results / "trials" / "t0000-a2").glob("sw-*")
    metrics = json.loads((second / "outputs" / "metrics.json").read_text())
    assert metrics == {"score": 3, "resumed_from_epoch": 3, "epochs": 12}
    # The whole history, each step once: the first attempt's three and the second's nine.
    assert (second / "outputs" / "history").read_text().split() == [str(i) for i in range(1, 13)]
    assert "resuming from the checkpoint after epoch 3" in (second / "job.log").read_text()
    assert json.loads((results / "best" / "outputs" / "metrics.json").read_text()) == metrics
    _nothing_left()


def _kept_epoch(info: Path) -> int | None:
    """The kept checkpoint's epoch; None for the moment a newer copy replaces the directory whole."""
    try:
        return int(json.loads(info.read_text())["epoch"])
    except FileNotFoundError:
        return None


def test_a_bundled_job_trial_keeps_the_bundled_jobs_checkpoints(tmp_path: Path) -> None:
    """What an attempt's checkpoint keeper copies home follows the recipe: a `job:` trial's are the
    bundled job's (outputs/checkpoints/ckpt-N, train_state.json: the layout its `run` recovery e2e
    proves), a `run:` trial's its $CLOUDTRAIN_CHECKPOINT_DIR (the e2e test above). In process: the
    sweep's own backend, as `sweep run` builds it, with no VM."""
    from cloudtrain.config import load_config
    from cloudtrain.recipe import load_recipe
    from cloudtrain.sweep.backend import PipelineBackend, _Handle
    from cloudtrain.sweep.spec import check_sweep

    command = _shell_sweep(tmp_path, "sweep-command", "echo hi\n", """\
        method: grid
        parameters: {X: [1]}
        budget_usd: 1
        metric: score
        goal: max
        """)
    config = load_config()
    for path, bundled in ((REPO / "recipes" / "sweep-mnist-local.yaml", True), (command, False)):
        loaded = load_recipe(str(path), sweep=True)
        backend = PipelineBackend("s1", loaded, check_sweep(loaded, config), config, tmp_path / path.stem, print)
        handle = _Handle("sw-s1-0")
        backend._checkpoints(None, handle, 0, 1)  # a first attempt: nothing carried, nothing read from the store
        assert handle.puller is not None and handle.puller.bundled is bundled, path
        assert handle.puller.kept == tmp_path / path.stem / "trials" / "t0000-a1" / "checkpoint"
        assert handle.carry is None
