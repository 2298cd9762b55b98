"""`cloud.recipe(source)` of a recipe written for another cloud (issue 13): what a field means on
every cloud (spot, disk size, GPUs, CPUs, memory, price cap, CPU fallback) survives the move, so a
test parametrized over clouds runs the recipe the user wrote; where the machine is and what it is
called (region, zone, instance type, image, hosts) does not, since it names things of one cloud.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.testing import sshd

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

PORTABLE = {"spot": True, "disk_gb": 100, "accelerators": "T4:1", "allow_more_accelerators": True, "cpus": 4,
            "memory": 16, "max_hourly_usd": 2.5, "allow_cpu_fallback": True}
PLACEMENT = {"aws": {"region": "eu-west-1", "zone": "eu-west-1b", "instance_type": "g4dn.xlarge", "image": "ami-0123"},
             "gcp": {"region": "europe-west4", "zone": "europe-west4-a", "instance_type": "n1-standard-4",
                     "image": "projects/mine/global/images/mine"},
             "azure": {"region": "westeurope", "instance_type": "Standard_NC4as_T4_v3", "image": "/subscriptions/x/mine"}}


def _source(tmp_path: Path, cloud: str, **resources: Any) -> Path:
    path = tmp_path / f"train-{cloud}.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "run": "python3 train.py",
                                    "resources": {"cloud": cloud, **PLACEMENT[cloud], **resources}}))
    return path


def _resources(cloud: Any, source: Path, **kwargs: Any) -> dict[str, Any]:
    return yaml.safe_load(cloud.recipe(source, **kwargs).read_text())["resources"]


@pytest.mark.parametrize(("target", "written_for"), [("aws", "gcp"), ("gcp", "azure"), ("azure", "aws")])
def test_what_means_the_same_on_every_cloud_is_kept_from_a_recipe_for_another(
        fake_cloud: Any, target: str, written_for: str, tmp_path: Path) -> None:
    cloud = fake_cloud(target)
    got = _resources(cloud, _source(tmp_path, written_for, **PORTABLE))
    # The other cloud's region, zone, type and image are gone; the fake's own defaults stand in
    # (no default type: the GPUs and sizes choose it, as they would for the user).
    assert got == {**cloud.recipe_resources(**PORTABLE)}, got
    assert not {"region", "zone", "instance_type"} & got.keys()
    # `resources=` still has the last word.
    assert _resources(cloud, _source(tmp_path, written_for, spot=True), resources={"spot": False})["spot"] is False
    # The copy is a recipe this cloud accepts.
    check = cloud.cli("validate", str(cloud.recipe(_source(tmp_path, written_for, **PORTABLE))))
    assert check.ok, check.output


def test_the_same_cloud_keeps_its_placement_and_every_portable_field_but_the_image(aws_cloud: Any,
                                                                                    tmp_path: Path) -> None:
    got = _resources(aws_cloud, _source(tmp_path, "aws", **PORTABLE))
    placement = {k: v for k, v in PLACEMENT["aws"].items() if k != "image"}
    assert got == {"cloud": "aws", **placement, **PORTABLE}, got


@pytest.mark.parametrize("target", ["local", "ssh"])
def test_clouds_without_spot_disks_or_gpu_types_take_only_what_applies_to_them(
        fake_cloud: Any, target: str, tmp_path: Path) -> None:
    cloud = fake_cloud(target)
    recipe = cloud.recipe(_source(tmp_path, "aws", **PORTABLE))
    got = yaml.safe_load(recipe.read_text())["resources"]
    assert {k: v for k, v in got.items() if k != "hosts"} == {
        "cloud": target, "cpus": 4, "memory": 16, "max_hourly_usd": 2.5, "allow_cpu_fallback": True}, got
    check = cloud.cli("validate", str(recipe))
    assert check.ok, check.output


@pytest.mark.parametrize(("target", "written_for"), [("gcp", "aws"), ("aws", "gcp")])
def test_a_spot_recipe_written_for_another_cloud_runs_on_a_spot_machine(
        fake_cloud: Any, target: str, written_for: str, tmp_path: Path) -> None:
    """The reported bug: the parametrized spot test ran on-demand on every cloud but its own."""
    cloud = fake_cloud(target)
    source = tmp_path / "spot.yaml"
    source.write_text(yaml.safe_dump({"name": "mine", "run": "echo on a spot machine",
                                      "resources": {"cloud": written_for, "spot": True, "disk_gb": 20}}))
    result = cloud.run(cloud.recipe(source), "--keep")
    assert result.ok, result.output
    assert "on a spot machine" in result.stdout
    if target == "aws":
        (instance,) = cloud.instances(cloud.cluster)
        assert instance.get("InstanceLifecycle") == "spot", instance
        volumes = cloud.ec2(instance["Placement"]["AvailabilityZone"][:-1]).describe_volumes(
            Filters=[{"Name": "attachment.instance-id", "Values": [instance["InstanceId"]]}])["Volumes"]
        assert [v["Size"] for v in volumes] == [20], volumes
    else:
        (_, instance), = cloud.instances(cloud.cluster)
        assert instance["scheduling"].get("provisioningModel") == "SPOT", instance["scheduling"]
        assert [int(d["diskSizeGb"]) for d in instance["disks"]] == [20], instance["disks"]
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []
