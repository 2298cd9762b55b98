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
