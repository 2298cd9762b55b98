"""The watchdog on Azure, end to end: `cloudtrain up` against the fake ARM, every VM an sshd VM, and
the CLI gone while the VM decides by itself.

An OS shutdown leaves an Azure VM "Stopped (allocated)" and billed, so the watchdog's action is an
ARM call with the VM's managed identity: deallocate (stop), or delete (down). The token comes from
the fake IMDS (`azure_cloud.metadata`, which checks the `Metadata: true` header), and the fake ARM
takes it as the VMs' identities' token, allowed only what their role assignment on the cluster's
group gives. The OS shutdown command is a marker here: these tests show it is never what stops a VM.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.azure import ArmRequest, AzureCloud, acting_principal
from tests.watchdog.conftest import (
    autostop_cli,
    decisions,
    marker_command,
    idle_period_now,
    logged_in,
    wait_busy_beyond_idle,
    wait_until,
)
from tests.lazy import requires

pytestmark = requires("azure.identity")

if not sshd.sshd_available():
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# Short, so the waits on them are short: a busy run spans ticks_covering(IDLE_S, TICK_S) ticks.
TICK_S = 0.25
IDLE_S = 1.5
# How long after the activity ends the VM must be deallocated or deleted (a bound on a hung test).
ACT_WITHIN_S = IDLE_S + 30


@pytest.fixture
def shutdown_marker(tmp_path: Path) -> Path:
    return tmp_path / "os-shutdown.log"


@pytest.fixture
def cloud(azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch, shutdown_marker: Path) -> AzureCloud:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", str(TICK_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    for name, value in azure_cloud.watchdog_env().items():  # METADATA_URL (fake IMDS), CA_FILE (fake ARM)
        monkeypatch.setenv(name, value)
    # Were the OS shutdown used, it would leave this trace (and on Azure, a VM still billed).
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_SHUTDOWN", shlex.join(marker_command(shutdown_marker)))
    return azure_cloud


def group_of(cloud: AzureCloud) -> str:
    return f"cloudtrain-{cloud.cluster}-{cloud.region}"


def vms(cloud: AzureCloud) -> list[dict[str, Any]]:
    """The cluster's VMs as ARM holds them, by name (reading them also finishes due operations)."""
    return sorted(cloud.server.find("Microsoft.Compute/virtualMachines", group=group_of(cloud)),
                  key=lambda vm: vm["name"])


def power(cloud: AzureCloud, vm: dict[str, Any]) -> str:
    return cloud.server.power_state(vm["name"])


def node_file(cloud: AzureCloud, vm: dict[str, Any], name: str) -> Path:
    return cloud.machines.vm(vm["id"].lower()).home_dir / ".cloudtrain" / cloud.cluster / name


def identity_calls(cloud: AzureCloud, action: str) -> list[ArmRequest]:
    with cloud.faults.lock:
        return [r for r in cloud.faults.requests if r.managed_identity and r.action == action]


def up(cloud: AzureCloud, **fields: Any) -> None:
    result = cloud.up(cloud.recipe(run="echo hi", **fields))
    assert result.ok, result.output
    assert "watchdog: " in result.stdout  # started; persistence is off in tests, on purpose: nothing warned
    assert "watchdog started detached" not in result.stderr + result.stdout


def assert_acted_with_the_vms_identity(cloud: AzureCloud, call: ArmRequest, principal: str) -> None:
    """The ARM call was the watchdog's: IMDS's token, allowed by the VM identity's role; and the
    token was asked for the way IMDS requires (header, ARM audience)."""
    assert call.bearer == cloud.metadata.token_for("imds") and call.caller == principal
    asked = cloud.metadata.seen("imds")
    assert asked and all(r.status == 200 for r in asked)
    for request in asked:
        assert request.headers["metadata"] == "true"
        assert request.query["resource"] == f"{cloud.server.url}/"  # the configured ARM endpoint's audience


def finish(cloud: AzureCloud, shutdown_marker: Path) -> None:
    assert not shutdown_marker.exists(), shutdown_marker.read_text()  # never an OS shutdown
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []


def test_idle_vm_deallocates_itself_through_arm_once_the_ssh_session_ends(
    cloud: AzureCloud, shutdown_marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the user logs in
    up(cloud, autostop={"idle_minutes": 1})
    (vm,) = vms(cloud)
    action = json.loads(node_file(cloud, vm, "watchdog.json").read_text())["action"]
    assert (action["kind"], action["effect"], action["method"]) == ("http", "stop", "POST")
    assert action["url"].startswith(f"{cloud.server.url}/subscriptions/{cloud.server.subscription}/resourceGroups/"
                                    f"{group_of(cloud)}/providers/Microsoft.Compute/virtualMachines/{vm['name']}"
                                    "/deallocate?api-version=")
    machine = cloud.machines.vm(vm["id"].lower())
    log = node_file(cloud, vm, "watchdog.log")
    # A user logged in: an SSH session of its own, no job (wait_for: jobs_and_ssh, the default).
    with logged_in(machine, cloud.machines.factory.client_key.private_path):
        idle_period_now(cloud, monkeypatch, IDLE_S)
        wait_busy_beyond_idle(log, IDLE_S, TICK_S, "1 ssh session(s)", after_config=True)
        assert power(cloud, vm) == "PowerState/running"
    wait_until(lambda: power(cloud, vm) == "PowerState/deallocated", timeout=ACT_WITHIN_S,
               what="the VM to deallocate itself")
    assert not machine.running
    (call,) = identity_calls(cloud, "vm.deallocate")
    assert_acted_with_the_vms_identity(cloud, call, acting_principal(vm))
    assert any(d == "stop" and detail.startswith("autostop: idle") for d, detail in decisions(log))
    status = cloud.cli("status", cloud.cluster, "--refresh", "--json")
    assert status.ok, status.output
    assert json.loads(status.stdout)["clusters"][0]["status"] == "stopped"
    finish(cloud, shutdown_marker)


def test_with_down_a_running_job_keeps_it_until_the_job_ends_then_its_group_is_deleted(
    cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch, shutdown_marker: Path
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the job runs
    up(cloud, autostop={"idle_minutes": 60})
    (vm,) = vms(cloud)
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    # Live: down now, the idle period short. The node gets the delete action from the provider.
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    live = autostop_cli(cloud, cloud.cluster, "-i", "1", "--down", "--wait-for", "jobs")
    assert live.returncode == 0, live.stdout + live.stderr
    action = json.loads(node_file(cloud, vm, "watchdog.json").read_text())["action"]
    assert (action["effect"], action["method"]) == ("delete", "DELETE")  # the only VM: its whole group
    assert action["url"].startswith(f"{cloud.server.url}/subscriptions/{cloud.server.subscription}/resourceGroups/"
                                    f"{group_of(cloud)}?api-version=")
    log = node_file(cloud, vm, "watchdog.log")
    wait_busy_beyond_idle(log, IDLE_S, TICK_S, "job(s) running")
    assert power(cloud, vm) == "PowerState/running"
    cancel = cloud.cli("cancel", cloud.cluster)
    assert cancel.ok, cancel.output
    wait_until(lambda: not cloud.groups(cloud.cluster), timeout=ACT_WITHIN_S,
               what="the VM to delete its resource group")
    assert not cloud.machines.vm(vm["id"].lower()).running
    (call,) = identity_calls(cloud, "group.delete")
    assert_acted_with_the_vms_identity(cloud, call, acting_principal(vm))
    assert any(d == "delete" and detail.startswith("autostop: idle") for d, detail in decisions(log))
    finish(cloud, shutdown_marker)


def test_budget_deadline_deallocates_under_a_running_job(cloud: AzureCloud, shutdown_marker: Path) -> None:
    # About 30 s of running time, counted from the launch: `up` and `exec` must be done before it
    # ends even on a loaded machine (the fake ARM deallocates as soon as the watchdog asks, as Azure does).
    max_hours = round(30 / 3600, 6)
    up(cloud, budget={"max_hours": max_hours}, autostop=False)  # only the budget may act
    (vm,) = vms(cloud)
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    log = node_file(cloud, vm, "watchdog.log")
    wait_until(lambda: power(cloud, vm) == "PowerState/deallocated", timeout=180,
               what="the budget to deallocate the VM")
    (line,) = [detail for d, detail in decisions(log) if d == "stop" and detail.startswith("budget")]
    assert "1 job(s) still running" in line and f"max_hours {max_hours:g}" in line
    (call,) = identity_calls(cloud, "vm.deallocate")
    assert_acted_with_the_vms_identity(cloud, call, acting_principal(vm))
    finish(cloud, shutdown_marker)


def test_a_node_of_several_deletes_only_itself(cloud: AzureCloud, shutdown_marker: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the user logs in
    up(cloud, num_nodes=2, autostop={"idle_minutes": 1, "down": True})
    first, second = vms(cloud)
    for vm in (first, second):
        action = json.loads(node_file(cloud, vm, "watchdog.json").read_text())["action"]
        assert action["url"].startswith(f"{cloud.server.url}/subscriptions/{cloud.server.subscription}/resourceGroups/"
                                        f"{group_of(cloud)}/providers/Microsoft.Compute/virtualMachines/{vm['name']}"
                                        "?api-version=")
    # Node 1 has a user logged in; node 0 is idle and deletes itself, and nothing else.
    machine = cloud.machines.vm(second["id"].lower())
    with logged_in(machine, cloud.machines.factory.client_key.private_path):
        idle_period_now(cloud, monkeypatch, IDLE_S, "--down")
        wait_until(lambda: [vm["name"] for vm in vms(cloud)] == [second["name"]], timeout=ACT_WITHIN_S,
                   what="node 0 to delete its VM")
        assert power(cloud, second) == "PowerState/running" and machine.running
        wait_busy_beyond_idle(node_file(cloud, second, "watchdog.log"), IDLE_S, TICK_S, "1 ssh session(s)",
                              after_config=True)
    wait_until(lambda: not vms(cloud), timeout=ACT_WITHIN_S, what="node 1 to delete its VM")
    # The group stays (network, no VM: nothing billed) for `down` / `gc`; no watchdog deleted it.
    assert [g["name"] for g in cloud.groups(cloud.cluster)] == [group_of(cloud)]
    assert identity_calls(cloud, "group.delete") == []
    deletes = identity_calls(cloud, "vm.delete")
    assert sorted(call.path.rsplit("/", 1)[-1] for call in deletes) == [first["name"], second["name"]]
    assert all(call.bearer == cloud.metadata.token_for("imds") and call.caller for call in deletes)
    assert cloud.server.find("Microsoft.Network/publicIPAddresses", group=group_of(cloud)) == []
    finish(cloud, shutdown_marker)


def test_contributor_credentials_are_refused_before_anything_is_created(cloud: AzureCloud) -> None:
    cloud.server.principal_role = "Contributor"  # may create everything, may not grant a role
    result = cloud.up(cloud.recipe(run="echo hi", autostop={"idle_minutes": 1, "down": True}))
    assert result.returncode == 2, result.output
    assert "roleAssignments/write" in result.stderr and "Owner or User Access Administrator" in result.stderr
    assert cloud.faults.count("vm.create") == cloud.faults.count("nsg.create") == cloud.faults.count("ip.create") == 0
    assert cloud.leftovers() == []


def test_without_a_role_for_the_vms_identity_autostop_is_refused_and_nothing_is_left(cloud: AzureCloud) -> None:
    cloud.fail("AuthorizationFailed", action="role.create")  # credentials that may not grant roles
    result = cloud.up(cloud.recipe(run="echo hi", autostop={"idle_minutes": 1}))
    assert result.returncode != 0, result.output
    refusal = [line for line in result.stderr.splitlines() if "autostop and budget are not available" in line]
    assert len(refusal) == 1 and "has no role on resource group" in refusal[0], result.output
    assert identity_calls(cloud, "vm.deallocate") == []
    assert cloud.leftovers() == []
