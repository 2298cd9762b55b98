"""The fake ARM behaves like ARM where cloudtrain relies on it, read through the real SDKs.

Shapes (token flow, long-running operations, error bodies), validation, cascades on delete, fault
injection, and the machines behind VMs. The provider's own behaviour is tested in
tests/providers/test_azure.py; here the fake is held to ARM's contract on its own.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

import pytest
import requests

from cloudtrain.testing.azure import CLIENT_ID, SUBSCRIPTION, TENANT, ArmServer
from tests.lazy import Lazy, requires

pytestmark = [pytest.mark.quick, requires("azure.identity")]
azure_errors = Lazy("azure.core.exceptions")
cm = Lazy("azure.mgmt.compute.models")
nm = Lazy("azure.mgmt.network.models")
resource_models = Lazy("azure.mgmt.resource.resources.models")

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheFakeArmServerOnly test"


class Arm:
    """The four SDK clients of one fake, and a network to put VMs on."""

    def __init__(self, server: ArmServer) -> None:
        self.server = server
        self.resource = server.client("resource")
        self.network = server.client("network")
        self.compute = server.client("compute")
        self.authorization = server.client("authorization")

    def group(self, name: str = "rg", region: str = "eastus", tags: dict | None = None) -> Any:
        return self.resource.resource_groups.create_or_update(name, resource_models.ResourceGroup(location=region, tags=tags))

    def nic(self, group: str, name: str, region: str = "eastus", *, delete_ip: bool = True) -> Any:
        net = self.network
        vnets = [v for v in net.virtual_networks.list(group) if v.location == region]
        if vnets:
            vnet = vnets[0]
        else:
            vnet = net.virtual_networks.begin_create_or_update(group, f"vnet-{region}", nm.VirtualNetwork(
                location=region, address_space=nm.AddressSpace(address_prefixes=["10.0.0.0/16"]),
                subnets=[nm.Subnet(name="default", address_prefix="10.0.0.0/24")])).result()
        ip = net.public_ip_addresses.begin_create_or_update(group, f"{name}-ip", nm.PublicIPAddress(
            location=region, sku=nm.PublicIPAddressSku(name="Standard"), public_ip_allocation_method="Static")).result()
        ref = nm.PublicIPAddress(id=ip.id, delete_option="Delete" if delete_ip else "Detach")
        return net.network_interfaces.begin_create_or_update(group, name, nm.NetworkInterface(
            location=region, ip_configurations=[nm.NetworkInterfaceIPConfiguration(
                name="ipconfig1", subnet=nm.Subnet(id=vnet.subnets[0].id), public_ip_address=ref)])).result()

    def vm_body(self, nic_id: str, *, region: str = "eastus", size: str = "Standard_D2s_v5", user: str = "azureuser",
                key: str | None = KEY, disk_gb: int | None = None, delete: bool = True, **extra: Any) -> Any:
        keys = [cm.SshPublicKey(path=f"/home/{user}/.ssh/authorized_keys", key_data=key)] if key else []
        return cm.VirtualMachine(
            location=region, tags={"cloudtrain-cluster": "c"},
            hardware_profile=cm.HardwareProfile(vm_size=size),
            storage_profile=cm.StorageProfile(
                image_reference=cm.ImageReference(publisher="Canonical", offer="0001-com-ubuntu-server-jammy",
                                                  sku="22_04-lts-gen2", version="latest"),
                os_disk=cm.OSDisk(create_option="FromImage", disk_size_gb=disk_gb,
                                  delete_option="Delete" if delete else "Detach")),
            os_profile=cm.OSProfile(computer_name="box", admin_username=user, linux_configuration=cm.LinuxConfiguration(
                disable_password_authentication=True, ssh=cm.SshConfiguration(public_keys=keys))),
            network_profile=cm.NetworkProfile(network_interfaces=[cm.NetworkInterfaceReference(
                id=nic_id, primary=True, delete_option="Delete" if delete else "Detach")]),
            identity=cm.VirtualMachineIdentity(type="SystemAssigned"), **extra)

    def vm(self, group: str, name: str, **kwargs: Any) -> Any:
        nic = self.nic(group, f"{name}-nic", kwargs.get("region", "eastus"), delete_ip=kwargs.get("delete", True))
        body = self.vm_body(nic.id, **kwargs)
        return self.compute.virtual_machines.begin_create_or_update(group, name, body).result()

    def power(self, group: str, name: str) -> list[str]:
        return [s.code for s in self.compute.virtual_machines.instance_view(group, name).statuses
                if s.code.startswith("PowerState/")]


@pytest.fixture
def arm(arm_server: ArmServer) -> Arm:
    return Arm(arm_server)


def raw(server: ArmServer, method: str, path: str, body: Any = None, *, token: bool = True) -> requests.Response:
    headers = {}
    if token:
        headers["Authorization"] = "Bearer " + server.credential().get_token(f"{server.url}/.default").token
    return requests.request(method, f"{server.url}{path}", json=body, headers=headers, verify=str(server.ca_bundle),
                            timeout=10)


def code_of(caught: pytest.ExceptionInfo) -> str:
    return caught.value.error.code


# identity ------------------------------------------------------------------------------------------


def test_a_service_principal_gets_a_token_over_https_and_arm_requires_it(arm_server: ArmServer) -> None:
    from azure.identity import ClientSecretCredential

    token = arm_server.credential().get_token(f"{arm_server.url}/.default")
    assert token.token and token.expires_on > time.time()
    wrong = ClientSecretCredential(TENANT, CLIENT_ID, "wrong", authority=arm_server.url,
                                   disable_instance_discovery=True)
    with pytest.raises(azure_errors.ClientAuthenticationError, match="AADSTS7000215"):
        wrong.get_token(f"{arm_server.url}/.default")
    anonymous = raw(arm_server, "GET", f"/subscriptions/{SUBSCRIPTION}?api-version=2022-12-01", token=False)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "InvalidAuthenticationToken"
    sub = raw(arm_server, "GET", f"/subscriptions/{SUBSCRIPTION}?api-version=2022-12-01")
    assert sub.json()["state"] == "Enabled"
    missing = raw(arm_server, "GET", f"/subscriptions/{SUBSCRIPTION}/resourcegroups")
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "MissingApiVersionParameter"


def test_a_vm_identity_token_may_do_what_its_role_assignment_gives(arm: Arm) -> None:
    """The token a VM's IMDS hands out (registered with accept_identity_token) acts as the VMs'
    system-assigned identities: allowed in a group where one has a role, else ARM's 403."""
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    server = arm.server
    token = "eyJ.fake-imds-token"
    server.accept_identity_token(token)

    def call(method: str, path: str) -> requests.Response:
        return requests.request(method, f"{server.url}/subscriptions/{SUBSCRIPTION}{path}",
                                headers={"Authorization": f"Bearer {token}"}, verify=str(server.ca_bundle),
                                timeout=10)

    def grant(group: Any, principal: str, role: str) -> None:
        arm.authorization.role_assignments.create(group.id, str(uuid.uuid4()), RoleAssignmentCreateParameters(
            role_definition_id=f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/"
            f"{role}", principal_id=principal, principal_type="ServicePrincipal"))

    mine, other = arm.group("mine"), arm.group("other")
    vm = arm.vm("mine", "vm0")
    arm.vm("other", "vm1")
    vm_path = "/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{}"
    # No role assignment yet: refused, naming the action and the scope.
    refused = call("POST", vm_path.format("mine", "vm0") + "/deallocate?api-version=2024-07-01")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "AuthorizationFailed"
    assert "Microsoft.Compute/virtualMachines/deallocate/action" in refused.json()["error"]["message"]
    # Reader: may look, not act.
    grant(mine, vm.identity.principal_id, "acdd72a7-3385-48ef-bd42-f606fba81ae7")
    assert call("GET", vm_path.format("mine", "vm0") + "?api-version=2024-07-01").status_code == 200
    assert call("POST", vm_path.format("mine", "vm0") + "/deallocate?api-version=2024-07-01").status_code == 403
    # Contributor on its own group: deallocates there, and nothing in another group.
    grant(mine, vm.identity.principal_id, "b24988ac-6180-42a0-ab88-20f7382dd24c")
    done = call("POST", vm_path.format("mine", "vm0") + "/deallocate?api-version=2024-07-01")
    assert done.status_code == 202
    assert arm.power("mine", "vm0") == ["PowerState/deallocated"]
    elsewhere = call("POST", vm_path.format("other", "vm1") + "/deallocate?api-version=2024-07-01")
    assert elsewhere.status_code == 403 and arm.power("other", "vm1") == ["PowerState/running"]
    assert call("DELETE", "/resourceGroups/other?api-version=2022-09-01").status_code == 403
    assert call("DELETE", "/resourceGroups/mine?api-version=2022-09-01").status_code == 202
    assert [g.name for g in arm.resource.resource_groups.list()] == [other.name]
    # What the fake saw: the token, and the identity whose role allowed the call.
    seen = [r for r in server.faults.requests if r.managed_identity and r.action == "vm.deallocate"]
    assert [(r.caller, r.bearer) for r in seen] == [
        ("", token), ("", token), (vm.identity.principal_id, token), ("", token)]
    server.forget_identity_token(token)
    assert call("GET", vm_path.format("other", "vm1") + "?api-version=2024-07-01").status_code == 401
    assert mine.name == "mine"


# long-running operations -----------------------------------------------------------------------------


def test_long_running_operations_answer_the_way_the_sdk_polls_them(arm: Arm) -> None:
    server = arm.server
    arm.group("rg")
    nic = arm.nic("rg", "n0")
    base = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm0"
    created = raw(server, "PUT", f"{base}?api-version=2024-07-01", arm.vm_body(nic.id).as_dict())
    assert created.status_code == 201, created.text
    assert created.json()["properties"]["provisioningState"] == "Creating"
    assert "Azure-AsyncOperation" in created.headers and created.headers["Retry-After"].isdigit()
    status = raw(server, "GET", created.headers["Azure-AsyncOperation"].removeprefix(server.url))
    assert status.json()["status"] == "Succeeded"
    # Paths are case-insensitive, and polling URLs need no api-version.
    stop = raw(server, "POST", f"{base.lower()}/deallocate?api-version=2024-07-01")
    assert stop.status_code == 202 and {"Azure-AsyncOperation", "Location"} <= set(stop.headers)
    done = raw(server, "GET", stop.headers["Location"].removeprefix(server.url).split("?")[0])
    assert done.status_code == 200
    gone = raw(server, "DELETE", f"{base}?api-version=2024-07-01")
    assert gone.status_code == 202 and "Location" in gone.headers
    failed = raw(server, "PUT", f"{base}2?api-version=2024-07-01", {"location": "eastus", "properties": {}})
    assert failed.status_code == 400 and set(failed.json()["error"]) >= {"code", "message"}


def test_operations_can_take_time_and_be_settled(arm: Arm) -> None:
    arm.group("rg")
    nic = arm.nic("rg", "n0")
    arm.server.lro_seconds = 30
    poller = arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", arm.vm_body(nic.id))
    time.sleep(0.2)
    assert not poller.done()
    vm = arm.compute.virtual_machines.get("rg", "vm0", expand="instanceView")
    assert vm.provisioning_state == "Creating" and not arm.server.running_keys()
    arm.server.settle()
    assert poller.result().provisioning_state == "Succeeded"
    assert arm.power("rg", "vm0") == ["PowerState/running"] and arm.server.running_keys() == [KEY]


def test_power_states_deallocate_power_off_start(arm: Arm) -> None:
    arm.group("rg")
    arm.vm("rg", "vm0")
    vms = arm.compute.virtual_machines
    vms.begin_power_off("rg", "vm0").result()
    assert arm.power("rg", "vm0") == ["PowerState/stopped"]  # "Stopped (allocated)": still billed
    vms.begin_deallocate("rg", "vm0").result()
    assert arm.power("rg", "vm0") == ["PowerState/deallocated"]
    assert arm.server.running_keys() == []
    vms.begin_start("rg", "vm0").result()
    assert arm.power("rg", "vm0") == ["PowerState/running"]


# validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,code,target",
    [
        ({"size": "Standard_Nope"}, "InvalidParameter", "vmSize"),
        ({"key": None}, "InvalidParameter", "linuxConfiguration"),
        ({"user": "root"}, "InvalidParameter", "adminUsername"),
        ({"disk_gb": 10}, "InvalidParameter", "osDisk.diskSizeGB"),
        ({"priority": "Regular", "eviction_policy": "Deallocate"}, "InvalidParameter", "evictionPolicy"),
    ],
)
def test_vm_bodies_are_validated_like_arm(arm: Arm, change: dict, code: str, target: str) -> None:
    arm.group("rg")
    nic = arm.nic("rg", "n0")
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", arm.vm_body(nic.id, **change))
    assert caught.value.status_code == 400 and code_of(caught) == code and caught.value.error.target == target
    assert arm.server.find("Microsoft.Compute/virtualMachines") == []


def test_names_regions_images_and_references_are_validated(arm: Arm) -> None:
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.group("bad/name?")
    assert caught.value.status_code in (400, 404)
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.group("rg", region="moon-1")
    assert code_of(caught) == "LocationNotAvailableForResourceType"
    arm.group("rg")
    nic = arm.nic("rg", "n0")
    with pytest.raises(azure_errors.HttpResponseError) as caught:  # a NIC in another region
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", arm.vm_body(nic.id, region="westus2"))
    assert code_of(caught) == "InvalidResourceReference"
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm_0!", arm.vm_body(nic.id))
    assert code_of(caught) == "InvalidResourceName"
    body = arm.vm_body(nic.id)
    body.storage_profile.image_reference = cm.ImageReference(publisher="nobody", offer="x", sku="y", version="1")
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", body)
    assert code_of(caught) == "PlatformImageNotFound"
    image = arm.server.create_image("images", "mine", region="westus2")
    body.storage_profile.image_reference = cm.ImageReference(id=image)
    with pytest.raises(azure_errors.HttpResponseError) as caught:  # a managed image lives in one region
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", body)
    assert code_of(caught) == "InvalidParameter"
    arm.compute.virtual_machines.begin_create_or_update("rg", "vm0", arm.vm_body(nic.id)).result()
    with pytest.raises(azure_errors.HttpResponseError) as caught:  # one NIC, one VM
        arm.compute.virtual_machines.begin_create_or_update("rg", "vm1", arm.vm_body(nic.id))
    assert code_of(caught) == "NicInUse"
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.network.network_security_groups.begin_create_or_update("rg", "nsg", nm.NetworkSecurityGroup(
            location="eastus", security_rules=[nm.SecurityRule(name="x", protocol="Tcp", access="Allow",
                                                               direction="Inbound", priority=50,
                                                               source_address_prefix="1.2.3.4/32",
                                                               destination_port_range="22")]))
    assert code_of(caught) == "SecurityRuleInvalidPriority"


def test_role_assignments_need_a_known_role_and_principal(arm: Arm) -> None:
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    group = arm.group("rg")
    vm = arm.vm("rg", "vm0")
    contributor = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/" \
                  "b24988ac-6180-42a0-ab88-20f7382dd24c"
    create = arm.authorization.role_assignments.create
    params = RoleAssignmentCreateParameters(role_definition_id=contributor, principal_id=vm.identity.principal_id,
                                            principal_type="ServicePrincipal")
    made = create(group.id, "5f0c8c43-6b0c-4d6b-9a53-0c3a0a1b2c3d", params)
    assert made.scope == group.id
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        create(group.id, "6f0c8c43-6b0c-4d6b-9a53-0c3a0a1b2c3d", params)
    assert code_of(caught) == "RoleAssignmentExists"
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        create(group.id, "7f0c8c43-6b0c-4d6b-9a53-0c3a0a1b2c3d", RoleAssignmentCreateParameters(
            role_definition_id=contributor, principal_id="00000000-0000-0000-0000-000000000000"))
    assert code_of(caught) == "PrincipalNotFound"
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        create(group.id, "8f0c8c43-6b0c-4d6b-9a53-0c3a0a1b2c3d", RoleAssignmentCreateParameters(
            role_definition_id=contributor.replace("b24988ac", "00000000"), principal_id=vm.identity.principal_id))
    assert code_of(caught) == "RoleDefinitionDoesNotExist"


# deletes ------------------------------------------------------------------------------------------------


def test_deleting_a_vm_takes_what_its_delete_options_say(arm: Arm) -> None:
    arm.group("rg")
    arm.vm("rg", "kept", delete=False)
    arm.vm("rg", "gone")
    vms = arm.compute.virtual_machines
    vms.begin_delete("rg", "kept").result()
    vms.begin_delete("rg", "gone").result()
    names = {kind: sorted(r["name"] for r in arm.server.find(kind)) for kind in (
        "Microsoft.Compute/disks", "Microsoft.Network/networkInterfaces", "Microsoft.Network/publicIPAddresses")}
    # Without deleteOption Delete the disk, NIC and public IP outlive the VM, billed: an Azure trap.
    assert [n.split("_")[0] for n in names["Microsoft.Compute/disks"]] == ["kept"]
    assert names["Microsoft.Network/networkInterfaces"] == ["kept-nic"]
    assert names["Microsoft.Network/publicIPAddresses"] == ["kept-nic-ip"]
    vms.begin_delete("rg", "gone").result()  # already gone: 204, fine


def test_deleting_a_group_takes_everything_in_it(arm: Arm) -> None:
    arm.group("rg", tags={"cloudtrain-cluster": "c"})
    arm.group("other")
    arm.vm("rg", "vm0")
    assert [g.name for g in arm.resource.resource_groups.list(filter="tagName eq 'cloudtrain-cluster'")] == ["rg"]
    arm.resource.resource_groups.begin_delete("rg").result()
    assert [g["name"] for g in arm.server.find("Microsoft.Resources/resourceGroups")] == ["other"]
    assert [r for r in arm.server.resources.values() if "/resourcegroups/rg/" in r["id"].lower()] == []
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.resource.resource_groups.begin_delete("rg").result()
    assert caught.value.status_code == 404 and code_of(caught) == "ResourceGroupNotFound"


# faults -------------------------------------------------------------------------------------------------


def test_capacity_faults_fail_the_operation_and_leave_a_failed_vm(arm: Arm) -> None:
    arm.group("rg")
    arm.server.faults.add("AllocationFailed", regions={"eastus"}, times=1)
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.vm("rg", "vm0")
    assert code_of(caught) == "AllocationFailed"
    assert arm.compute.virtual_machines.get("rg", "vm0").provisioning_state == "Failed"  # as Azure keeps it
    arm.vm("rg", "vm1")  # `times=1`: the shortage is over
    assert arm.server.faults.count("vm.create", region="eastus") == 2


def test_other_faults_answer_the_request_itself_per_region(arm: Arm) -> None:
    arm.group("rg")
    arm.group("west", region="westus2")
    arm.server.faults.add("SkuNotAvailable", regions={"eastus"})
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.vm("rg", "vm0")
    assert caught.value.status_code == 409 and code_of(caught) == "SkuNotAvailable"
    assert "Standard_D2s_v5" in caught.value.error.message and "eastus" in caught.value.error.message
    assert arm.server.find("Microsoft.Compute/virtualMachines") == []
    arm.vm("west", "vm0", region="westus2")
    arm.server.faults.add("AuthorizationFailed", action="write")
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.group("another")
    assert caught.value.status_code == 403
    assert "Microsoft.Resources/subscriptions/resourceGroups/write" in caught.value.error.message
    arm.resource.resource_groups.get("rg")  # reads still work


def test_a_disabled_subscription_is_read_only(arm: Arm) -> None:
    arm.group("rg")
    arm.server.subscription_state = "Disabled"
    with pytest.raises(azure_errors.HttpResponseError) as caught:
        arm.group("rg2")
    assert code_of(caught) == "ReadOnlyDisabledSubscription"
    assert arm.resource.resource_groups.get("rg").name == "rg"


def test_spot_evictions_follow_the_eviction_policy(arm: Arm) -> None:
    arm.group("rg")
    spot = {"priority": "Spot", "billing_profile": cm.BillingProfile(max_price=-1)}
    arm.vm("rg", "keep", eviction_policy="Deallocate", **spot)
    arm.vm("rg", "drop", eviction_policy="Delete", **spot)
    arm.server.evict("keep")
    arm.server.evict("drop")
    assert arm.power("rg", "keep") == ["PowerState/deallocated"]
    assert [v.name for v in arm.compute.virtual_machines.list("rg")] == ["keep"]


# machines ------------------------------------------------------------------------------------------------


def test_authorized_keys_command_prints_the_keys_of_running_vms(arm: Arm) -> None:
    arm.group("rg")
    arm.vm("rg", "vm0")
    command = arm.server.authorized_keys_command().split()
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split("\n")[0] == KEY
    arm.compute.virtual_machines.begin_deallocate("rg", "vm0").result()
    assert subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout == ""


def test_machine_hooks_follow_the_vm_and_public_ips_can_be_routed(arm: Arm) -> None:
    events: list[tuple[str, str]] = []
    arm.server.machine_hooks.append(lambda event, vm: events.append((event, vm["name"])))
    routed: list[str] = []
    arm.server.public_ip_hooks.append(routed.append)
    arm.group("rg")
    arm.vm("rg", "vm0")
    vms = arm.compute.virtual_machines
    vms.begin_deallocate("rg", "vm0").result()
    vms.begin_start("rg", "vm0").result()
    vms.begin_delete("rg", "vm0").result()
    assert events == [("boot", "vm0"), ("power_off", "vm0"), ("power_on", "vm0"), ("power_off", "vm0")]
    assert len(routed) == 1 and routed[0].startswith("20.")
