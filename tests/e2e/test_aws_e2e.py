"""`cloudtrain` against AWS as a subprocess: EC2 is moto's server, the "instances" are sshd VMs.

The wiring is only public interfaces. The CLI reaches moto through AWS_ENDPOINT_URL_EC2 (set by
the `moto_server` fixture); `config.ssh.proxy_command` sends the fake 54.x public IPs moto hands
out to loopback sshd VMs (the first unknown address takes the next VM of the pool); and each VM
trusts exactly the key pairs moto holds, through an AuthorizedKeysCommand, the way cloud-init
installs the launch key on EC2. Nothing is mocked: what we assert about the cloud we read back
from moto through the EC2 API.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.base import TAG_CLUSTER
from cloudtrain.testing.aws import MotoServer
from cloudtrain.testing.faults import kill_cli_at
from tests.conftest import REPO, cli_env, cloudtrain

from cloudtrain.testing import sshd  # noqa: E402

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

REGION = "us-east-1"
LIVE = ["pending", "running", "stopping", "stopped"]


@pytest.fixture
def cloud(moto_server: MotoServer, sshd_vm_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """One pooled VM that trusts moto's key pairs, and a config routing every address through the pool."""
    vm = sshd_vm_factory.start(pool=True, authorized_keys_command=moto_server.authorized_keys_command(REGION))
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            ssh:
              proxy_command: {json.dumps(sshd_vm_factory.proxy_command)}
              allowed_cidr: 203.0.113.7/32
              connect_retries_s: 60
            aws:
              region: {REGION}
            confirm: false
            """
        )
    )
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    # The VM accepts its own (test) user only: an image that says so, as a custom AMI would.
    ami = moto_server.register_image(ssh_user=vm.user, region=REGION)
    return {"vm": vm, "factory": sshd_vm_factory, "ec2": moto_server.client("ec2", REGION), "ami": ami}


def write_recipe(tmp_path: Path, cloud: dict, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    resources = f"resources: {{cloud: aws, region: {REGION}, instance_type: t3.medium, image: {cloud['ami']}}}\n"
    path.write_text(f"name: {name}\n{resources}{textwrap.dedent(body)}")
    return path


def instances(ec2: Any, cluster: str, states: list[str] | None = None) -> list[dict]:
    filters = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": states})
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def assert_nothing_left(ec2: Any, cluster: str) -> None:
    tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    assert instances(ec2, cluster, LIVE) == []
    assert ec2.describe_key_pairs(Filters=tag)["KeyPairs"] == []
    assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []


def test_run_trains_the_cnn_on_an_aws_instance_and_tears_it_down(tmp_path: Path, cloud: dict) -> None:
    recipe = write_recipe(tmp_path, cloud, "awscnn", "job: {name: mnist_cnn, params: {epochs: 1, data: bundled}}\n")
    proc = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and 0.5 < metrics["test_accuracy"] <= 1.0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    # The job ran on the VM moto's instance was routed to, in that VM's home.
    assert list(Path(cloud["vm"].home).glob(".cloudtrain/awscnn/**/metrics.json"))

    (launched,) = instances(cloud["ec2"], "awscnn")
    assert launched["State"]["Name"] == "terminated"  # run created it, so run took it down
    assert launched["InstanceType"] == "t3.medium" and launched["ImageId"] == cloud["ami"]
    assert_nothing_left(cloud["ec2"], "awscnn")


def test_up_exec_stop_start_down(tmp_path: Path, cloud: dict) -> None:
    ec2, vm = cloud["ec2"], cloud["vm"]
    recipe = write_recipe(tmp_path, cloud, "awsbox", "run: echo hi\n")
    up = cloudtrain("up", str(recipe))
    assert up.returncode == 0, up.stdout + up.stderr
    (inst,) = instances(ec2, "awsbox", LIVE)
    assert inst["State"]["Name"] == "running"

    wrote = cloudtrain("exec", "awsbox", "--", "sh", "-c", "echo kept > marker && hostname")
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    status = json.loads(cloudtrain("status", "awsbox", "--json").stdout)["clusters"][0]
    assert status["status"] == "up" and status["nodes"][0]["instance_id"] == inst["InstanceId"]
    assert status["nodes"][0]["public_ip"] == inst["PublicIpAddress"]

    stop = cloudtrain("stop", "awsbox")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    (stopped,) = instances(ec2, "awsbox", LIVE)
    assert stopped["State"]["Name"] == "stopped"

    start = cloudtrain("start", "awsbox")
    assert start.returncode == 0, start.stdout + start.stderr
    (started,) = instances(ec2, "awsbox", LIVE)
    assert started["State"]["Name"] == "running"
    # A restarted instance gets a new public IP; it is still the same machine (same disk).
    cloud["factory"].route(started["PublicIpAddress"], vm)
    status = json.loads(cloudtrain("status", "awsbox", "--json").stdout)["clusters"][0]
    assert status["nodes"][0]["public_ip"] == started["PublicIpAddress"]
    read = cloudtrain("exec", "awsbox", "--", "cat", "marker")
    assert read.returncode == 0 and "kept" in read.stdout, read.stdout + read.stderr

    down = cloudtrain("down", "awsbox")
    assert down.returncode == 0, down.stdout + down.stderr
    assert_nothing_left(ec2, "awsbox")
    assert "awsbox" not in cloudtrain("status").stdout


def test_sigkill_after_run_instances_then_refresh_finds_it_and_down_removes_it(
    tmp_path: Path, cloud: dict, moto_server: MotoServer
) -> None:
    ec2 = cloud["ec2"]
    recipe = write_recipe(tmp_path, cloud, "awskill", "run: echo hi\n")
    # moto launches the instance, and its answer is held: the CLI dies between EC2 creating the
    # instance and learning its id, the worst moment for bookkeeping.
    gate = moto_server.faults.hold("RunInstances", after=True)
    kill_cli_at(gate, ["up", str(recipe)], cli_env())
    assert moto_server.faults.count("RunInstances") == 1
    (orphan,) = instances(ec2, "awskill", LIVE)

    before = json.loads(cloudtrain("status", "awskill", "--json").stdout)["clusters"][0]
    assert before["nodes"] == []  # state knows the cluster (written first), not its instance
    refreshed = cloudtrain("status", "awskill", "--refresh", "--json")
    assert refreshed.returncode == 0, refreshed.stderr
    nodes = json.loads(refreshed.stdout)["clusters"][0]["nodes"]
    assert [n["instance_id"] for n in nodes] == [orphan["InstanceId"]]

    down = cloudtrain("down", "awskill")
    assert down.returncode == 0, down.stdout + down.stderr
    assert_nothing_left(ec2, "awskill")


def test_capacity_failover_reaches_the_next_zone_through_the_cli(
    tmp_path: Path, cloud: dict, moto_server: MotoServer
) -> None:
    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1a"}, status=400)
    recipe = write_recipe(tmp_path, cloud, "awsfail", "run: echo hi\n")
    up = cloudtrain("up", str(recipe))
    assert up.returncode == 0, up.stdout + up.stderr
    (inst,) = instances(cloud["ec2"], "awsfail", LIVE)
    assert inst["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert moto_server.faults.count("RunInstances", zone="us-east-1a") == 1
    assert cloudtrain("down", "awsfail").returncode == 0
    assert_nothing_left(cloud["ec2"], "awsfail")


def test_no_capacity_anywhere_is_one_line_and_leaves_nothing(
    tmp_path: Path, cloud: dict, moto_server: MotoServer
) -> None:
    moto_server.faults.add("InsufficientInstanceCapacity", status=400)
    recipe = write_recipe(tmp_path, cloud, "awsnone", "run: echo hi\n")
    up = cloudtrain("up", str(recipe))
    assert up.returncode == 1, up.stdout + up.stderr
    errors = [line for line in up.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no capacity" in errors[0] and "us-east-1f" in errors[0]
    assert_nothing_left(cloud["ec2"], "awsnone")
    assert "awsnone" not in cloudtrain("status").stdout


def test_bundled_aws_recipes_validate() -> None:
    for name in ("mnist-aws-t4.yaml", "mnist-aws-spot.yaml"):
        proc = cloudtrain("validate", str(REPO / "recipes" / name))
        assert proc.returncode == 0, proc.stderr


def test_capacity_gone_in_the_whole_region_fails_over_to_the_next_region(
    tmp_path: Path, cloud: dict, moto_server: MotoServer
) -> None:
    # The same image name in every region, as a team's own AMI pipeline would publish it.
    for region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1"):
        ami = moto_server.register_image(ssh_user=cloud["vm"].user, region=region)
        moto_server.client("ssm", region).put_parameter(
            Name="/cloudtrain-test/ami", Value=ami, Type="String", Overwrite=True
        )
    moto_server.faults.add("InsufficientInstanceCapacity", regions={REGION}, status=400)
    # The pooled VM reads key pairs from us-east-1 only; the cluster's key lands elsewhere, so let
    # the VM trust it directly, as cloud-init in the other region would.
    from cloudtrain.remote.keys import cluster_key

    cloud["vm"].authorize(cluster_key("awsregion").public_openssh)
    path = tmp_path / "awsregion.yaml"
    path.write_text(
        "name: awsregion\n"
        "resources: {cloud: aws, instance_type: t3.medium, image: 'resolve:ssm:/cloudtrain-test/ami'}\n"
        "run: echo hi\n"
    )
    up = cloudtrain("up", str(path))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "trying the next placement" in up.stderr
    record = json.loads(cloudtrain("status", "awsregion", "--json").stdout)["clusters"][0]
    assert record["region"] != REGION
    live = instances(moto_server.client("ec2", record["region"]), "awsregion", LIVE)
    assert len(live) == 1
    assert cloudtrain("down", "awsregion").returncode == 0
    assert instances(moto_server.client("ec2", record["region"]), "awsregion", LIVE) == []


def test_up_without_aws_credentials_is_one_line_and_creates_nothing(
    tmp_path: Path, cloud: dict, moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloudtrain.testing.aws import isolate_aws_env

    env = {k: v for k, v in moto_server.env().items() if not k.startswith(("AWS_ACCESS", "AWS_SECRET"))}
    isolate_aws_env(monkeypatch, tmp_path, env)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    recipe = write_recipe(tmp_path, cloud, "awsnocreds", "run: echo hi\n")
    up = cloudtrain("up", str(recipe))
    assert up.returncode == 2, up.stdout + up.stderr
    errors = up.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error:") and "credentials" in errors[0].lower()
    assert "awsnocreds" not in cloudtrain("status").stdout
    assert instances(cloud["ec2"], "awsnocreds") == []
