"""A sweep from anywhere (issue 37) on the AWS fake: two members (two HOMEs and CLOUDTRAIN_HOMEs, two
database roles, one PostgreSQL database, test_team_budget_e2e's setup). Alice starts a 3-trial
sweep, one VM at a time; once her first trial has finished and her second runs, bob's `sweep status`
shows her trials and his `sweep resume` is refused (her driver holds the sweep). Alice's CLI is
SIGKILLed and her laptop goes away with it (her HOME, keys, runs dir and recipe are moved out of
reach). Bob resumes from his own copy of the recipe: her VM, which only her SSH key reaches, is
taken down, her running trial is tried again on his VM, and the sweep finishes with the same
Optuna study (same trial numbers, each trial's job finished once), its results under bob's
runs_dir, the fake's bill equal to the sweep's reported spend within 1%, and nothing left running.
Meanwhile bob's `sweep stop` stops a sweep alive on alice's second laptop (her driver there winds
it down), run alongside to keep the test short."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.postgres import connection as pg_connection
from cloudtrain.testing.wait import wait_until
from tests.conftest import cli_as
from tests.e2e.test_team_budget_e2e import _member_env, team_db  # noqa: F401 - team_db: a fixture

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

LIVE = ("pending", "running", "stopping", "stopped")


def _sweep_recipe(cloud: AwsCloud, work: Path, marks: Path, trials: int) -> Path:
    """The sweep's recipe in a member's working copy (its workdir relative to it, as in a checkout):
    the first trial's job runs through; every later one waits while `marks/hold` exists."""
    template = yaml.safe_load(cloud.recipe(run="true").read_text())
    run = (f'echo "$CLOUDTRAIN_SWEEP_TRIAL" >> {marks}/started\n'
           f'if [ "$CLOUDTRAIN_SWEEP_TRIAL" != 0 ]; then while [ -e {marks}/hold ]; do sleep 0.1; done; fi\n'
           'mkdir -p outputs && echo "{\\"score\\": $X}" > outputs/metrics.json\n'
           f'echo "$CLOUDTRAIN_SWEEP_TRIAL" >> {marks}/done\n')
    recipe = {"name": "team-sweep", "resources": template["resources"], "workdir": "code", "results": ["outputs"],
              "run": run,
              "sweep": {"method": "grid", "parameters": {"X": list(range(1, trials + 1))}, "max_parallel": 1,
                        "budget_usd": 1, "metric": "score", "goal": "max", "trial_deadline_minutes": 2,
                        "reserve": {"boot_minutes": 3, "setup_minutes": 3, "collect_minutes": 1,
                                    "release_minutes": 1}}}
    (work / "code").mkdir(parents=True, exist_ok=True)
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return cli_as(env, *args, cwd=cwd, timeout=300)


def _start(env: dict[str, str], recipe: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", "sweep", "run", str(recipe), "--yes"], env=env,
                            cwd=recipe.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _admin_rows(admin: str, sql: str, *args: Any) -> list[tuple]:
    with pg_connection(admin) as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]


def _end(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=60)


def test_a_sweep_killed_on_one_laptop_is_resumed_from_another_and_stopped_from_another(
        aws_cloud: AwsCloud, team_db, tmp_path: Path) -> None:  # noqa: ANN001
    from cloudtrain.sweep.space import open_storage

    admin, urls, roles = team_db
    alice, bob = (_member_env(aws_cloud, tmp_path / who, url, who) for who, url in zip(("alice", "bob"), urls))
    # Alice's second laptop (her role, a HOME of its own): the sweep it runs is the one bob stops.
    laptop = _member_env(aws_cloud, tmp_path / "laptop", urls[0], "alice")
    marks, other = tmp_path / "marks", tmp_path / "other-marks"
    for folder in (marks, other):
        folder.mkdir()
        (folder / "hold").touch()
    mine = _sweep_recipe(aws_cloud, tmp_path / "alice" / "work", marks, trials=3)
    copy = _sweep_recipe(aws_cloud, tmp_path / "bob" / "work", marks, trials=3)
    assert mine.read_text() == copy.read_text()
    elsewhere = _sweep_recipe(aws_cloud, tmp_path / "laptop" / "work", other, trials=3)
    began = time.monotonic()

    proc, running = _start(alice, mine), _start(laptop, elsewhere)
    try:
        wait_until(lambda: (_lines(marks / "started") == ["0", "1"] and _lines(other / "started") == ["0", "1"])
                   or proc.poll() is not None or running.poll() is not None, 180,
                   "both of alice's sweeps with their first trial done and their second running")
        assert proc.poll() is None, _end(proc)
        assert running.poll() is None, _end(running)
        assert _lines(marks / "done") == ["0"]
        ((sweep_id,),) = _admin_rows(admin, "SELECT id FROM sweeps WHERE recipe_path = %s", str(mine))
        ((second,),) = _admin_rows(admin, "SELECT id FROM sweeps WHERE recipe_path = %s", str(elsewhere))

        # Bob sees her sweep and its trials, and may not take it over while her driver is alive.
        seen = json.loads(_cli(bob, "sweep", "status", sweep_id, "--json").stdout)
        assert seen["status"] == "running"
        assert [(t["trial"], t["state"]) for t in seen["trials"]] == [(0, "succeeded"), (1, "running")]
        refused = _cli(bob, "sweep", "resume", sweep_id, cwd=copy.parent)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        line = _one_error(refused.stderr)
        assert f"sweep {sweep_id} is being run by {roles[0]}'s cloudtrain" in line, line

        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        # Her laptop is gone with her CLI: nothing of it (keys, journal, runs, recipe) is reachable.
        shutil.move(tmp_path / "alice", tmp_path / "alice-away")
        (her_vm,) = aws_cloud.instances(f"sw-{sweep_id}-0", LIVE)

        resumed = subprocess.Popen([sys.executable, "-m", "cloudtrain", "sweep", "resume", sweep_id], env=bob,
                                   cwd=copy.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Meanwhile bob stops the sweep of her other laptop, alive: her driver there winds it down.
        stopping = subprocess.Popen([sys.executable, "-m", "cloudtrain", "sweep", "stop", second], env=bob,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Her VM goes first (only her key reaches it), with the job waiting there; then the hold.
            wait_until(lambda: aws_cloud.instances(f"sw-{sweep_id}-0", ["terminated"]) or resumed.poll() is not None,
                       120, "alice's VM taken down by bob's resume")
            (marks / "hold").unlink()
            out, err = resumed.communicate(timeout=300)
            took = time.monotonic() - began
            stop_out, stop_err = stopping.communicate(timeout=300)
            her_out, her_err = running.communicate(timeout=120)
        finally:
            _end(resumed)
            _end(stopping)
    finally:
        _end(proc)
        _end(running)
    assert stopping.returncode == 0, stop_out + stop_err
    assert f"sweep {second}: stopped" in stop_out + stop_err
    assert running.returncode == 1, her_out[-2000:] + her_err[-2000:]  # stopped, as `sweep run` says it
    assert "stopping (stopped by `cloudtrain sweep stop`)" in her_out + her_err
    stopped = json.loads(_cli(bob, "sweep", "status", second, "--json").stdout)
    assert stopped["status"] == "stopped"
    assert [(t["trial"], t["state"]) for t in stopped["trials"]] == [(0, "succeeded"), (1, "stopped")]

    assert resumed.returncode == 0, out[-3000:] + err[-3000:]
    results = Path(out.strip().splitlines()[-1])
    assert results == (tmp_path / "bob" / "runs" / f"sweep-{sweep_id}").resolve()
    assert f"from now on its results are written under {results}" in err

    # Every trial's job finished once; her second trial's first attempt ended with her VM.
    assert sorted(_lines(marks / "done")) == ["0", "1", "2"]
    assert sorted(_lines(marks / "started")) == ["0", "1", "1", "2"]
    detail = json.loads(_cli(bob, "sweep", "status", sweep_id, "--json").stdout)
    assert detail["status"] == "done" and detail["results_dir"] == str(results)
    assert [(t["trial"], t["state"], t["attempts"]) for t in detail["trials"]] == [
        (0, "succeeded", 1), (1, "succeeded", 2), (2, "succeeded", 1)]
    assert sorted(t["score"] for t in detail["trials"]) == [1, 2, 3]
    assert all(t["score"] == t["params"]["X"] for t in detail["trials"])
    ((state, error),) = _admin_rows(admin, "SELECT state, error FROM sweep_attempts WHERE sweep = %s AND trial = 1 "
                                           "AND attempt = 1", sweep_id)
    assert state == "preempted" and "launched from another machine" in error, (state, error)
    assert {p.name for p in (results / "trials").iterdir()} == {"t0001-a2", "t0002-a1"}
    assert (results / "leaderboard.txt").is_file()

    # One Optuna study in the team database, continued: the same trial numbers, each told once.
    storage = open_storage(admin)
    try:
        import optuna

        study = optuna.load_study(study_name=f"sweep-{sweep_id}", storage=storage)
        assert [(t.number, t.state.name, t.value, t.params) for t in study.get_trials(deepcopy=False)] == [
            (t["trial"], "COMPLETE", t["score"], t["params"]) for t in detail["trials"]]
    finally:
        storage.scoped_session.remove()
        storage.engine.dispose()
    assert not (tmp_path / "bob" / "ct-home" / "sweeps" / sweep_id / "optuna.journal").exists()

    # The cloud's own bill of the sweep's VMs (hers and his) is what the sweep reports.
    summary = json.loads((results / "sweep.json").read_text())
    billed = sum(aws_cloud.bill.usd(f"sw-{sweep_id}-{slot}") for slot in (0, 1))
    assert summary["vms_booted"] == 2 and billed > 0
    assert abs(summary["spent_usd"] - billed) <= 0.01 * billed, (summary["spent_usd"], billed)
    assert abs(detail["spent_usd"] - summary["spent_usd"]) < 1e-6
    assert aws_cloud.bill.instances(f"sw-{sweep_id}-0") == [her_vm["InstanceId"]]

    # Nothing left: no instance, key pair or firewall, no cluster row, no sweep held.
    (other / "hold").unlink()
    assert aws_cloud.instances(states=LIVE) == []
    assert aws_cloud.leftovers() == []
    assert _admin_rows(admin, "SELECT name FROM clusters") == []
    assert _admin_rows(admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
                       0x6375) == [(0,)]
    print(f"two members: a sweep killed on one laptop finished from the other in {took:.1f} s from the start, "
          "a sweep alive on a third stopped from the other meanwhile")
