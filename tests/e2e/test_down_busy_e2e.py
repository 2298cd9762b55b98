"""`down` of a cluster that another terminal's run is using (issue 35.6): it says which run and
asks; without a terminal it needs --yes, and without it nothing is touched and the run finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cloudtrain.testing.cloud import FakeCloud
from cloudtrain.testing.wait import wait_until


def test_down_of_a_cluster_a_live_run_uses_needs_yes(local_cloud: FakeCloud, tmp_path: Path) -> None:
    started, go = tmp_path / "started", tmp_path / "go"
    job = (f'touch {started}; while [ ! -e {go} ]; do sleep 0.1; done; mkdir -p outputs; '
           'echo done > outputs/r.txt')
    recipe = local_cloud.recipe(run=job, results=["outputs"])
    run = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", local_cloud.cluster,
                            "--runs-dir", str(local_cloud.runs_dir)], env={**os.environ, **local_cloud.env},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(started.exists, 120, "the job to start")
        down = local_cloud.cli("down", local_cloud.cluster)
        assert down.returncode == 2, down.output
        assert "in use by run" in down.stderr and "--yes" in down.stderr
        go.touch()
        out, err = run.communicate(timeout=300)
    finally:
        go.touch()
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out + err
    run_dir = Path(out.strip().splitlines()[-1])
    assert (run_dir / "outputs" / "r.txt").read_text() == "done\n"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    assert local_cloud.leftovers() == []


def test_down_yes_during_a_run_and_the_runs_last_words_are_true(local_cloud: FakeCloud, tmp_path: Path) -> None:
    started = tmp_path / "started"
    recipe = local_cloud.recipe(run=f"touch {started}; sleep 120", results=["outputs"])
    run = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", local_cloud.cluster,
                            "--runs-dir", str(local_cloud.runs_dir)], env={**os.environ, **local_cloud.env},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(started.exists, 120, "the job to start")
        down = local_cloud.cli("down", local_cloud.cluster, "--yes")
        assert down.ok, down.output
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode != 0, out + err
    assert f"cluster {local_cloud.cluster} was taken down by another command" in err, err
    # No promise it can't keep, and no step it did not take: the other command's `down` ended the
    # job and removed the node, so this run neither collects from it nor tears it down, and says so once.
    assert "cloudtrain collect" not in err and "fetches them" not in err, err
    assert "teardown that follows" not in err and "collect failed" not in err, err
    assert "could not read the state" not in err and "a typo in `results:`" not in err, err
    assert err.count("was taken down") == 1, err
    record = json.loads((Path(out.strip().splitlines()[-1]) / "run.json").read_text())
    assert record["teardown"] == "gone" and record["status"] != "succeeded"
    assert record["error"] == f"cluster {local_cloud.cluster} was taken down during the run", record
    assert local_cloud.leftovers() == []
