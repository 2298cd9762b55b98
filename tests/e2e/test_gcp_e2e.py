"""`cloudtrain` against GCP as a subprocess: Compute Engine is our fake, the VMs are sshd VMs.

Only public interfaces are wired (the `gcp_cloud` fixture): the CLI reads `gcp.project` and
`gcp.api_endpoint` from its config, google-auth finds a service-account key through
GOOGLE_APPLICATION_CREDENTIALS and signs its own JWT, which the fake verifies; each instance the
fake runs boots an sshd VM trusting the instance's `ssh-keys` metadata (as the guest agent
installs them), reached through `ssh.proxy_command` at the instance's external IP. What we assert
about the cloud we read back from the fake.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER
from cloudtrain.testing import sshd
from cloudtrain.testing.gcp import GcpCloud
from tests.conftest import REPO, cloudtrain
from tests.lazy import requires

pytestmark = requires("google.cloud.compute_v1")

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

T4 = "n1-standard-4+t4x1"


def status_of(cloud: GcpCloud, *args: str) -> dict:
    result = cloud.cli("status", cloud.cluster, "--json", *args)
    assert result.ok, result.output
    return json.loads(result.stdout)["clusters"][0]


def nat_ip(inst: dict) -> str | None:
    return next((c.get("natIP") for c in inst["networkInterfaces"][0]["accessConfigs"] if c.get("natIP")), None)


def assert_nothing_left(cloud: GcpCloud) -> None:
    assert cloud.instances() == [] and cloud.firewall_rules() == []
    assert cloud.leftovers() == []  # no disk either, and no cluster left in state
    # The firewall never let anyone but the caller in, not even for a moment.
    assert "0.0.0.0/0" not in cloud.server.firewall_ranges_seen


def test_up_run_stop_start_down(gcp_cloud: GcpCloud) -> None:
    cloud, name = gcp_cloud, gcp_cloud.cluster
    # The fake's T4 machine is a CPU sshd VM: the recipe allows the CPU, and is told loudly (35.10).
    recipe = cloud.recipe(job={"name": "mnist_cnn", "params": {"epochs": 1, "data": "bundled"}},
                          resources={"instance_type": T4, "allow_cpu_fallback": True})
    up = cloud.up(recipe)
    assert up.ok, up.output
    assert "pays for 1 GPU(s) per node but the node shows none" in up.stderr and "TRAINING ON THE CPU" in up.stderr
    ((zone, inst),) = cloud.instances()
    assert zone == "us-central1-a" and inst["status"] == "RUNNING"
    assert inst["machineType"].endswith("/machineTypes/n1-standard-4")
    assert inst["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert inst["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert inst["labels"][TAG_CLUSTER] == name and TAG_OWNER in inst["labels"]
    ((_, disk),) = [(z, d) for (z, _), d in cloud.server.disks.items()]
    assert disk["labels"][TAG_CLUSTER] == name
    rule, deny = (next(r for r in cloud.firewall_rules() if r["name"].endswith(suffix)) for suffix in ("-ssh", "-deny"))
    assert deny["denied"] == [{"IPProtocol": "all"}] and deny["priority"] < 65534  # outranks default-allow-ssh
    assert rule["sourceRanges"] == [cloud.allowed_cidr] and rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert rule["targetTags"] == inst["tags"]["items"] == [f"cloudtrain-{name}"]

    run = cloud.run(recipe)  # on the cluster `up` made: kept afterwards
    assert run.ok, run.output
    metrics = json.loads((run.run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and 0.5 < metrics["test_accuracy"] <= 1.0
    assert run.run_json["status"] == "succeeded" and run.run_json["provider"] == "gcp"
    machine = cloud.vm(zone, inst["name"])
    assert list(machine.home_dir.glob(f".cloudtrain/{name}/**/metrics.json"))
    wrote = cloud.cli("exec", name, "--", "sh", "-c", "echo kept > marker")
    assert wrote.ok, wrote.output

    stop = cloud.cli("stop", name)
    assert stop.ok, stop.output
    assert cloud.server.instance(zone, inst["name"])["status"] == "TERMINATED" and not machine.running
    stopped = status_of(cloud)
    assert stopped["status"] == "stopped" and stopped["nodes"][0]["state"] == "stopped"

    start = cloud.cli("start", name)
    assert start.ok, start.output
    started = cloud.server.instance(zone, inst["name"])
    assert started["status"] == "RUNNING" and machine.running
    # The same disk behind a new ephemeral address, which cloudtrain followed.
    assert nat_ip(started) != nat_ip(inst) and status_of(cloud)["nodes"][0]["public_ip"] == nat_ip(started)
    read = cloud.cli("exec", name, "--", "cat", "marker")
    assert read.ok and "kept" in read.stdout, read.output

    down = cloud.down()
    assert down.ok, down.output
    assert_nothing_left(cloud)
    assert cloud.down().ok  # again: nothing to do, still fine


def test_the_vm_answers_its_callers_address_only_and_follows_a_caller_that_moved(gcp_cloud: GcpCloud) -> None:
    cloud, name = gcp_cloud, gcp_cloud.cluster
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.ok, up.output
    assert cloud.cli("exec", name, "--", "true").ok
    cloud.move_caller("198.51.100.66", reconfigure=False)  # someone else, anywhere on the internet
    cloud.configure(ssh={"connect_retries_s": 1})
    stranger = cloud.cli("exec", name, "--", "true")
    assert not stranger.ok and "198.51.100.66" not in str(cloud.firewall_rules())
    cloud.move_caller(cloud.allowed_cidr.split("/")[0], reconfigure=False)
    assert cloud.cli("exec", name, "--", "true").ok

    # The same cluster, its owner moved (home -> office): a new address, and cloudtrain sees it.
    cloud.configure(ssh={"connect_retries_s": 30})  # the kit's default again (cloud.BASE_SSH_CONFIG)
    cloud.move_caller("198.51.100.23")
    moved = cloud.cli("exec", name, "--", "echo", "reached")
    assert moved.ok and "reached" in moved.stdout, moved.output
    assert "your address changed: SSH to cluster" in moved.stderr and "198.51.100.23/32" in moved.stderr
    (rule,) = [r for r in cloud.firewall_rules() if r["name"].endswith("-ssh")]
    assert rule["sourceRanges"] == ["198.51.100.23/32"]
    again = cloud.cli("exec", name, "--", "true")
    assert again.ok and "address changed" not in again.stderr  # once
    assert cloud.down().ok
    assert_nothing_left(cloud)


@pytest.mark.parametrize("autostop,said", [
    (None, "gcp VMs run as: no service account (no feature needs one)"),
    ({"idle_minutes": 10, "down": True}, "gcp VMs run as: the project's default compute service account with the "
                                         "compute scope"),
])
def test_plan_says_what_the_vm_can_do_with_its_own_credentials(gcp_cloud: GcpCloud, autostop: Any,
                                                               said: str) -> None:
    fields = {"autostop": autostop} if autostop else {}
    plan = gcp_cloud.cli("plan", str(gcp_cloud.recipe(run="echo hi", **fields)))
    assert plan.ok, plan.output
    assert said in plan.output


def test_setup_pip_installs_into_the_nodes_venv_and_run_uses_it(gcp_cloud: GcpCloud, tmp_path: Path) -> None:
    from tests.test_bootstrap import _wheel

    wheel = _wheel(tmp_path)  # the kit's VMs share this filesystem: no index, no network
    recipe = gcp_cloud.recipe(setup=f"pip install --no-index --quiet {wheel}",
                              run="python -c 'import ctprobe, sys; print(ctprobe.VALUE, sys.prefix)'")
    result = gcp_cloud.run(recipe)
    assert result.ok, result.output
    assert "42 " in result.stdout and "/.cloudtrain/venv" in result.stdout, result.output


# A stockout in one zone moves to the next zone of the region inside the provider (GCP's zones are
# tried by launch itself): tests/providers/test_gcp.py::test_a_stockout_moves_to_the_next_zone, its
# scope by tests/providers/test_contract.py (capacity item, [gcp]: zone); the CLI's failover after a
# provider-internal zone move by
# tests/e2e/test_aws_e2e.py::test_capacity_failover_reaches_the_next_zone_through_the_cli.

# QUOTA_EXCEEDED ends the region (one try, the next region next): the provider's scope is proven by
# tests/providers/test_contract.py (capacity item, [gcp]: region) and test_gcp.py
# (test_quota_ends_the_region_or_all_of_gcp); the pipeline's failover on a region scope by
# tests/e2e/test_aws_e2e.py::test_capacity_gone_in_the_whole_region_fails_over_to_the_next_region.


def test_permission_denied_is_one_line_and_leaves_nothing(gcp_cloud: GcpCloud) -> None:
    cloud, name = gcp_cloud, gcp_cloud.cluster
    cloud.fail("permission")
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.returncode != 0, up.output
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "compute.instances.create" in lines[0], up.output
    assert cloud.faults.count("instances.insert") == 1  # no failover: every zone would refuse too
    assert_nothing_left(cloud)
    assert name not in cloud.cli("status").stdout


# SIGKILL between the create and its answer, then `status --refresh` and `down`: the pipeline is proven
# once, on EC2
# (tests/e2e/test_aws_e2e.py::test_sigkill_after_run_instances_then_refresh_finds_it_and_down_removes_it);
# what is GCP's in it, finding the instance by its label and removing it with its disk and rules, by
# tests/providers/test_contract.py (list_tagged of a new process, [gcp]; terminate then release, [gcp]).


def test_bundled_gcp_recipes_validate() -> None:
    for name in ("mnist-gcp-t4.yaml", "mnist-gcp-spot.yaml"):
        proc = cloudtrain("validate", str(REPO / "recipes" / name))
        assert proc.returncode == 0, proc.stderr
        assert "gcp/" in proc.stdout and "n1-standard-4+t4x1" in proc.stdout
