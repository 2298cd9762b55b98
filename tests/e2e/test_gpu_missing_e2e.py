"""A GPU recipe on a node whose probe sees no GPU (issue 35.10): it fails before the job with the
probe's reason (GPU prices for CPU work otherwise), and nothing is left; `allow_cpu_fallback`
trains on the CPU with a loud warning. The kit's machines are CPU sshd VMs, as a broken driver
leaves a real one."""

from __future__ import annotations

import os

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def test_a_gpu_type_whose_node_shows_no_gpu_fails_before_the_job(aws_cloud: AwsCloud, tmp_path) -> None:  # noqa: ANN001
    ran = tmp_path / "ran"
    recipe = aws_cloud.recipe(run=f"touch {ran}", resources={"instance_type": "g4dn.xlarge"})
    run = aws_cloud.run(recipe)
    assert run.returncode != 0, run.output
    assert "asks for 1 GPU(s) per node but the node shows none" in run.output
    assert "no nvidia-smi on the node" in run.output and "allow_cpu_fallback" in run.output
    assert not ran.exists()
    assert run.run_json["status"] == "failed"
    assert aws_cloud.leftovers() == []


def test_allow_cpu_fallback_trains_on_the_cpu_with_a_loud_warning(aws_cloud: AwsCloud) -> None:
    recipe = aws_cloud.recipe(run="echo on the cpu", resources={"instance_type": "g4dn.xlarge",
                                                                "allow_cpu_fallback": True})
    run = aws_cloud.run(recipe)
    assert run.ok, run.output
    assert "TRAINING ON THE CPU" in run.stderr and "on the cpu" in run.stdout
