"""This project's recipe, run end to end by the real `cloudtrain` CLI on fakes of each cloud.

No account and no network: `local_cloud`, `ssh_cloud`, `aws_cloud` and `fake_cloud` come from
cloudtrain's pytest plugin (cloudtrain installed with its `[dev]` extra). `cloud.recipe(RECIPE)` is a copy of
train.yaml pointed at the fake (same workdir, envs, run and results; the fake's resources).
"""

import json
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "train.yaml"


@pytest.mark.parametrize("cloud_name", ["local", "ssh", "aws"])
def test_training_brings_the_model_home(fake_cloud, cloud_name):
    cloud = fake_cloud(cloud_name)
    result = cloud.run(cloud.recipe(RECIPE))
    assert result.ok, result.output
    metrics = json.loads((result.run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["final_loss"] < 0.01
    assert result.run_json["status"] == "succeeded"
    assert cloud.leftovers() == []  # `run` made the cluster, so `run` took it down


def test_a_zone_without_capacity_moves_the_run_to_the_next_zone(aws_cloud):
    aws_cloud.fail("capacity", zones={"us-east-1a"})
    result = aws_cloud.run(aws_cloud.recipe(RECIPE))
    assert result.ok, result.output
    (instance,) = aws_cloud.instances()
    assert instance["Placement"]["AvailabilityZone"] != "us-east-1a"
    assert aws_cloud.faults.count("RunInstances", zone="us-east-1a") == 1  # refused once, not retried


def test_no_quota_fails_the_run_and_leaves_nothing_behind(aws_cloud):
    aws_cloud.fail("quota")
    result = aws_cloud.run(aws_cloud.recipe(RECIPE))
    assert result.returncode == 1, result.output
    assert result.run_json["status"] == "failed"
    assert "VcpuLimitExceeded" in result.run_json["error"]
    assert aws_cloud.leftovers() == []


def test_a_diverging_job_fails_the_run_but_its_outputs_still_come_home(local_cloud):
    result = local_cloud.run(local_cloud.recipe(RECIPE, envs={"EPOCHS": "300", "LR": "5"}))
    assert result.returncode == 1, result.output
    assert "training diverged" in result.stdout
    assert (result.run_dir / "outputs" / "metrics.json").exists()
