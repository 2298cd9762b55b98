"""A `results:` path that matches nothing (issue 35.2: `outputz` for `outputs`) is said on the
summary, recorded in run.json, and, when no result path held anything on a cloud node, said before
the teardown that ends the node."""

from __future__ import annotations

import os

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import FakeCloud

JOB = "mkdir -p outputs && echo 0.9 > outputs/acc.txt"


def test_a_result_path_with_nothing_under_it_is_said_and_recorded(local_cloud: FakeCloud) -> None:
    run = local_cloud.run(local_cloud.recipe(run=JOB, results=["outputs", "outputz"]))
    assert run.ok, run.output  # what did come home is home
    assert "warning: results: outputz: nothing this run wrote there on node 0" in run.stderr
    assert "outputs" not in [line.split(":")[1].strip() for line in run.stderr.splitlines() if "results:" in line]
    assert run.run_json["empty_result_paths"] == ["outputz"]
    assert (run.run_dir / "outputs" / "acc.txt").read_text() == "0.9\n"


@pytest.mark.skipif(not sshd.sshd_available() and not os.environ.get("CI"), reason="OpenSSH sshd is not installed")
def test_every_result_path_empty_on_a_cloud_node_is_said_before_the_teardown(aws_cloud: FakeCloud) -> None:
    import subprocess
    import sys

    recipe = aws_cloud.recipe(run=JOB, results=["outputz"])
    # One stream, as a terminal shows it: the order of the lines is what the user reads.
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", aws_cloud.cluster,
                           "--runs-dir", str(aws_cloud.runs_dir)], env={**os.environ, **aws_cloud.env},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
    lines = proc.stdout.splitlines()
    empty = next(i for i, line in enumerate(lines) if "results: outputz: nothing this run wrote there" in line)
    assert "no result path held anything" in lines[empty + 1] and "--keep" in lines[empty + 1]
    assert empty < next(i for i, line in enumerate(lines) if line.startswith("==> teardown")), proc.stdout
    assert aws_cloud.leftovers() == []


def test_every_result_path_empty_is_said_before_the_teardown_removes_the_workdir(local_cloud: FakeCloud) -> None:
    # On this machine (and your own hosts) `down` removes the workdir: what the job wrote goes too.
    run = local_cloud.run(local_cloud.recipe(run=JOB, results=["outputz"]))
    assert run.ok, run.output
    said = [line for line in run.stderr.splitlines() if "no result path held anything" in line]
    assert len(said) == 1 and "removes" in said[0] and "workdir" in said[0] and "--keep" in said[0], run.stderr
    # ...and on the summary, where the reader of the end of the output looks.
    summary = run.stdout[run.stdout.rindex("teardown"):]
    assert "empty results" in summary and "outputz: nothing there on node 0" in summary, run.stdout


def test_a_kept_node_is_not_said_to_go_and_collect_says_it_again(local_cloud: FakeCloud) -> None:
    import json

    run = local_cloud.run(local_cloud.recipe(run=JOB, results=["outputz"]), "--keep")
    assert run.ok, run.output
    said = [line for line in run.stderr.splitlines() if "no result path held anything" in line]
    assert len(said) == 1 and "stay on" in said[0] and f"cloudtrain exec {local_cloud.cluster} -- ls" in said[0], said
    assert "removes" not in said[0] and "deletes" not in said[0]
    # A run whose own collect did not finish knows nothing of its result paths yet: `collect` finds out.
    record = json.loads((run.run_dir / "run.json").read_text())
    record["empty_result_paths"] = []
    (run.run_dir / "run.json").write_text(json.dumps(record))
    again = local_cloud.cli("collect", local_cloud.cluster)
    assert again.ok and "warning: results: outputz: nothing this run wrote there on node 0" in again.stderr, again.output
    assert json.loads((run.run_dir / "run.json").read_text())["empty_result_paths"] == ["outputz"]
    assert local_cloud.down().ok
