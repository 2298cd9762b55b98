"""`cloudtrain` against Azure as a subprocess: ARM is our fake (HTTPS), the VMs are sshd VMs.

Only public interfaces are wired (the `azure_cloud` fixture): the CLI reads `azure.arm_endpoint`
and `authority` from its config and a service principal from the environment, and azure-identity's
real EnvironmentCredential gets its token from the fake's token endpoint; each VM the fake creates
boots an sshd VM that trusts the VM's osProfile SSH keys (as the Azure Linux agent installs them),
reached through `ssh.proxy_command` at the VM's 20.x public IP. What we assert about the cloud we
read back through the real SDK clients.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER
from cloudtrain.testing import sshd
from cloudtrain.testing.azure import AzureCloud
from tests.conftest import REPO, cloudtrain

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def tagged_groups(cloud: AzureCloud, cluster: str) -> list[Any]:
    wanted = f"tagName eq '{TAG_CLUSTER}' and tagValue eq '{cluster}'"
    return list(cloud.client("resource").resource_groups.list(filter=wanted))


def assert_nothing_left(cloud: AzureCloud, cluster: str) -> None:
    assert tagged_groups(cloud, cluster) == []
    tagged = cloud.client("resource").resources.list(filter=f"tagName eq '{TAG_CLUSTER}' and tagValue eq '{cluster}'")
    assert [r.id for r in tagged] == []
    # Nothing billed survives anywhere: no VM, disk or public IP (NICs go with them).
    assert cloud.leftovers() == []


def assert_ssh_only_from_caller(cloud: AzureCloud, group: str) -> None:
    (nsg,) = cloud.client("network").network_security_groups.list(group)
    inbound = [r for r in nsg.security_rules if r.direction == "Inbound" and r.access == "Allow"]
    assert [(r.source_address_prefix, r.destination_port_range, r.protocol) for r in inbound] == [
        (cloud.allowed_cidr, "22", "Tcp")]
    for rule in inbound:
        assert rule.source_address_prefix not in ("*", "0.0.0.0/0", "Internet", "Any")
        assert not rule.source_address_prefixes


def power(cloud: AzureCloud, group: str, vm: str) -> list[str]:
    statuses = cloud.client("compute").virtual_machines.instance_view(group, vm).statuses
    return [s.code for s in statuses if s.code.startswith("PowerState/")]


def test_up_run_stop_start_down(azure_cloud: AzureCloud) -> None:
    cloud, name = azure_cloud, azure_cloud.cluster
    recipe = cloud.recipe(job={"name": "mnist_cnn", "params": {"epochs": 1, "data": "bundled"}})
    up = cloud.up(recipe)
    assert up.ok, up.output
    (group,) = tagged_groups(cloud, name)
    assert group.name == f"cloudtrain-{name}-eastus" and group.location == "eastus"
    (vm,) = cloud.client("compute").virtual_machines.list(group.name)
    assert vm.hardware_profile.vm_size == cloud.instance_type and vm.identity.type == "UserAssigned"
    assert_ssh_only_from_caller(cloud, group.name)
    # Every resource of the cluster carries both tags (role assignments have none in ARM).
    inside = list(cloud.client("resource").resources.list_by_resource_group(group.name))
    assert {r.type for r in inside} == {
        "Microsoft.Compute/virtualMachines", "Microsoft.Compute/disks", "Microsoft.Network/publicIPAddresses",
        "Microsoft.Network/networkInterfaces", "Microsoft.Network/virtualNetworks",
        "Microsoft.Network/networkSecurityGroups", "Microsoft.ManagedIdentity/userAssignedIdentities"}
    for resource in [group, *inside]:
        assert resource.tags[TAG_CLUSTER] == name and TAG_OWNER in resource.tags, resource.id
    # The VM's identity (the cluster's, made before the VM) may act on its own group, nothing wider.
    (role,) = cloud.client("authorization").role_assignments.list_for_resource_group(group.name)
    (attached,) = vm.identity.user_assigned_identities.values()
    assert role.scope == group.id and role.principal_id == attached.principal_id

    run = cloud.run(recipe)
    assert run.ok, run.output
    metrics = json.loads((run.run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and 0.5 < metrics["test_accuracy"] <= 1.0
    assert run.run_json["status"] == "succeeded" and run.run_json["provider"] == "azure"
    machine = cloud.machines.vm(vm.id.lower())
    assert list(Path(machine.home).glob(f".cloudtrain/{name}/**/metrics.json"))
    wrote = cloud.cli("exec", name, "--", "sh", "-c", "echo kept > marker")
    assert wrote.ok, wrote.output

    stop = cloud.cli("stop", name)
    assert stop.ok, stop.output
    assert power(cloud, group.name, vm.name) == ["PowerState/deallocated"]  # not merely stopped: billed
    assert not machine.running
    status = json.loads(cloud.cli("status", name, "--json").stdout)["clusters"][0]
    assert status["status"] == "stopped" and status["nodes"][0]["state"] == "stopped"

    start = cloud.cli("start", name)
    assert start.ok, start.output
    assert power(cloud, group.name, vm.name) == ["PowerState/running"]
    # The same disk, and (Standard static IP) the same address as before the stop.
    read = cloud.cli("exec", name, "--", "cat", "marker")
    assert read.ok and "kept" in read.stdout, read.output
    assert json.loads(cloud.cli("status", name, "--json").stdout)["clusters"][0]["nodes"][0]["public_ip"] == \
        status["nodes"][0]["public_ip"]

    down = cloud.down()
    assert down.ok, down.output
    assert_nothing_left(cloud, name)
    assert cloud.down().ok  # again: nothing to do, still fine


def test_the_vm_answers_its_callers_address_only_and_follows_a_caller_that_moved(azure_cloud: AzureCloud) -> None:
    cloud = azure_cloud
    name = cloud.new_cluster()
    up = cloud.up(cloud.recipe(run="echo hi"), cluster=name)
    assert up.ok, up.output
    assert cloud.cli("exec", name, "--", "true").ok
    cloud.move_caller("198.51.100.66", reconfigure=False)  # anyone else: DenyAllInBound
    cloud.configure(ssh={"connect_retries_s": 1})
    assert not cloud.cli("exec", name, "--", "true").ok
    cloud.move_caller(cloud.allowed_cidr.split("/")[0], reconfigure=False)
    assert cloud.cli("exec", name, "--", "true").ok

    # The same cluster, its owner moved: a new address, and cloudtrain sees it.
    cloud.configure(ssh={"connect_retries_s": 30})  # the kit's default again (cloud.BASE_SSH_CONFIG)
    cloud.move_caller("198.51.100.23")
    moved = cloud.cli("exec", name, "--", "echo", "reached")
    assert moved.ok and "reached" in moved.stdout, moved.output
    assert "your address changed: SSH to cluster" in moved.stderr
    (nsg,) = [n for n in cloud.server.find("Microsoft.Network/networkSecurityGroups")
              if n["name"] == f"{name}-nsg"]
    (rule,) = nsg["properties"]["securityRules"]
    assert rule["properties"]["sourceAddressPrefix"] == "198.51.100.23/32"
    assert cloud.down(name).ok
    assert_nothing_left(cloud, name)


def test_allocation_failed_in_the_first_region_lands_in_the_next(azure_cloud: AzureCloud) -> None:
    cloud, name = azure_cloud, azure_cloud.cluster
    cloud.fail("capacity", regions={"eastus"})
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.ok, up.output
    assert "trying the next placement" in up.stderr
    (group,) = tagged_groups(cloud, name)
    assert group.location == "westus2"
    assert cloud.faults.count("vm.create", region="eastus") == 1
    # ARM kept the failed VM in eastus; the launch deleted it, then its group.
    assert cloud.faults.count("vm.delete", region="eastus") == 1
    assert cloud.server.find("Microsoft.Resources/resourceGroups", f"cloudtrain-{name}-eastus") == []
    status = json.loads(cloud.cli("status", name, "--json").stdout)["clusters"][0]
    assert status["region"] == "westus2" and status["status"] == "up"
    assert cloud.down().ok
    assert_nothing_left(cloud, name)


def test_permission_denied_is_one_line_and_leaves_nothing(azure_cloud: AzureCloud) -> None:
    cloud, name = azure_cloud, azure_cloud.cluster
    cloud.fail("AuthorizationFailed")  # on the VM create: the group and network exist by then
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.returncode == 2, up.output
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "AuthorizationFailed" in lines[0], up.output
    assert cloud.faults.count("vm.create") == 1  # no failover: another region would refuse too
    assert_nothing_left(cloud, name)
    assert name not in cloud.cli("status").stdout


def test_rejected_credentials_are_one_line_and_create_nothing(
    azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud, name = azure_cloud, azure_cloud.cluster
    monkeypatch.setitem(cloud.env, "AZURE_CLIENT_SECRET", "not-the-secret")
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.returncode == 2, up.output
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: azure:") and "AADSTS7000215" in lines[0], up.output
    check = cloud.cli("check", "azure")
    assert "AADSTS7000215" in check.stdout + check.stderr, check.output
    assert cloud.faults.count("write") == 0
    assert name not in cloud.cli("status").stdout


# SIGKILL between the VM's create and its answer, then `status --refresh` and `down`: the pipeline is
# proven once, on EC2
# (tests/e2e/test_aws_e2e.py::test_sigkill_after_run_instances_then_refresh_finds_it_and_down_removes_it);
# what is Azure's in it, finding the VM by its tags and removing its group, by
# tests/providers/test_contract.py (list_tagged of a new process, [azure]; terminate then release, [azure]);
# a CLI killed right after ARM took the VM's create, on Azure, by
# tests/e2e/test_ledger_e2e.py::test_azure_a_vm_whose_cli_died_during_boot_still_ends_at_its_deadline.


def test_bundled_azure_recipes_validate() -> None:
    for name in ("mnist-azure-t4.yaml", "mnist-azure-spot.yaml"):
        proc = cloudtrain("validate", str(REPO / "recipes" / name))
        assert proc.returncode == 0, proc.stderr
        assert "azure/" in proc.stdout
