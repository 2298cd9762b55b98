"""The azure provider against the fake ARM (real SDKs, real azure-identity, HTTPS), in process.

What a launch creates and how (tags, NSG, spot, identity), what ARM's errors mean (capacity,
quota, credentials) and what a failure leaves (nothing), stop = deallocate, terminate = the group.
The CLI-level flows are in tests/e2e/test_azure_e2e.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import (
    CapacityError,
    CredentialsError,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.base import (
    TAG_CLUSTER,
    TAG_OWNER,
    CreatesMachines,
    InstanceSpec,
    InstanceState,
    SelfStopping,
    StopsMachines,
    owner_id,
    supports,
)
from cloudtrain.testing.azure import SUBSCRIPTION, ArmServer, acting_principal

from cloudtrain.providers.azure import AzureProvider, make_provider
from tests.lazy import requires

pytestmark = [pytest.mark.quick, requires("azure.identity")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheAzureProviderTests test"
CIDR = "203.0.113.7/32"


@pytest.fixture
def provider(arm_server: ArmServer) -> AzureProvider:
    return AzureProvider(**arm_server.config(region="eastus"), polling_interval=0)


def spec(cluster: str = "box", **kwargs: Any) -> InstanceSpec:
    defaults: dict[str, Any] = {"instance_type": "Standard_D2s_v5", "region": "eastus", "ssh_public_key": KEY,
                                "allowed_cidr": CIDR}
    return InstanceSpec(cluster=cluster, owner=owner_id(), **{**defaults, **kwargs})


def vms(arm: ArmServer, group: str | None = None) -> list[dict]:
    return arm.find("Microsoft.Compute/virtualMachines", group=group)


def groups(arm: ArmServer) -> list[str]:
    return sorted(g["name"] for g in arm.find("Microsoft.Resources/resourceGroups"))


# capabilities and wiring ---------------------------------------------------------------------------


def test_capabilities_config_and_lazy_sdk_import(arm_server: ArmServer) -> None:
    traits = AzureProvider.traits
    assert (traits.remote, traits.priced, traits.owns_machines, traits.stops_spot) == (True,) * 4
    assert all(supports(AzureProvider, c) for c in (CreatesMachines, StopsMachines, SelfStopping))
    # SelfStopping: the VM deallocates / deletes itself through ARM
    config = Config.model_validate({"azure": arm_server.config(region="westus2")})
    provider = make_provider(config)
    assert provider.default_region == "westus2" and provider.api.arm_endpoint == arm_server.url
    assert provider.check_credentials().ok
    assert AzureProvider.image_pins_region("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i")
    assert not AzureProvider.image_pins_region("Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest")
    code = ("import sys; from cloudtrain.providers import traits; traits('azure'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('azure', 'msal')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_check_credentials_says_which_and_why_not(arm_server: ArmServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ok = AzureProvider(**arm_server.config(region="eastus")).check_credentials()
    assert ok.ok and "service principal" in ok.detail and SUBSCRIPTION in ok.detail and "region eastus" in ok.detail
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    bad = AzureProvider(**arm_server.config()).check_credentials()
    assert not bad.ok and "AADSTS7000215" in bad.detail and "\n" not in bad.detail
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID")
    none = AzureProvider(arm_endpoint=arm_server.url, authority=arm_server.url).check_credentials()
    assert not none.ok and "no subscription" in none.detail


def test_a_disabled_subscription_is_refused(arm_server: ArmServer, provider: AzureProvider) -> None:
    arm_server.subscription_state = "Disabled"
    status = provider.check_credentials()
    assert not status.ok and "Disabled" in status.detail
    with pytest.raises(CredentialsError, match="ReadOnlyDisabledSubscription"):
        provider.launch(spec(), 1)


# launch -----------------------------------------------------------------------------------------------


def test_launch_builds_a_tagged_group_with_ssh_from_one_address(arm_server: ArmServer, provider: AzureProvider) -> None:
    (inst,) = provider.launch(spec(), 1)
    assert inst.id == "cloudtrain-box-eastus:box-0" and inst.state is InstanceState.RUNNING
    assert inst.public_ip.startswith("20.") and inst.private_ip == "10.0.0.4" and inst.ssh_user == "azureuser"
    assert inst.region == "eastus" and inst.instance_type == "Standard_D2s_v5" and inst.launched_at
    inside = [r for r in arm_server.resources.values() if "/resourcegroups/cloudtrain-box-eastus" in r["id"].lower()]
    kinds = sorted(r["type"] for r in inside)
    assert kinds == ["Microsoft.Authorization/roleAssignments", "Microsoft.Compute/disks",
                     "Microsoft.Compute/virtualMachines", "Microsoft.ManagedIdentity/userAssignedIdentities",
                     "Microsoft.Network/networkInterfaces", "Microsoft.Network/networkSecurityGroups",
                     "Microsoft.Network/publicIPAddresses", "Microsoft.Network/virtualNetworks",
                     "Microsoft.Resources/resourceGroups"]
    for resource in inside:
        if resource["type"] != "Microsoft.Authorization/roleAssignments":
            assert resource["tags"][TAG_CLUSTER] == "box" and resource["tags"][TAG_OWNER] == owner_id(), resource["id"]
    (nsg,) = arm_server.find("Microsoft.Network/networkSecurityGroups")
    rules = [r["properties"] for r in nsg["properties"]["securityRules"]]
    assert [(r["direction"], r["access"], r["sourceAddressPrefix"], r["destinationPortRange"]) for r in rules] == [
        ("Inbound", "Allow", CIDR, "22")]
    (vnet,) = arm_server.find("Microsoft.Network/virtualNetworks")
    assert vnet["properties"]["subnets"][0]["properties"]["networkSecurityGroup"]["id"] == nsg["id"]


def test_the_vm_gets_size_image_disk_key_spot_and_identity(arm_server: ArmServer, provider: AzureProvider) -> None:
    provider.launch(spec(instance_type="Standard_NC4as_T4_v3", disk_gb=128, spot=True), 1)
    provider.launch(spec("cpu", spot=True, shutdown_behavior="terminate"), 1)
    gpu, cpu = (vm["properties"] for vm in sorted(vms(arm_server), key=lambda v: v["name"]))
    assert gpu["hardwareProfile"]["vmSize"] == "Standard_NC4as_T4_v3"
    image = gpu["storageProfile"]["imageReference"]
    assert (image["publisher"], image["offer"]) == ("microsoft-dsvm", "ubuntu-hpc")  # NVIDIA driver, CUDA
    assert cpu["storageProfile"]["imageReference"]["offer"] == "0001-com-ubuntu-server-jammy"
    disk = gpu["storageProfile"]["osDisk"]
    assert disk["diskSizeGB"] == 128 and disk["deleteOption"] == "Delete"
    assert gpu["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] == "Delete"
    assert gpu["osProfile"]["linuxConfiguration"] == {
        "disablePasswordAuthentication": True,
        "ssh": {"publicKeys": [{"path": "/home/azureuser/.ssh/authorized_keys", "keyData": KEY}]}}
    assert (gpu["priority"], gpu["evictionPolicy"], gpu["billingProfile"]["maxPrice"]) == ("Spot", "Deallocate", -1)
    assert cpu["evictionPolicy"] == "Delete"  # the teardown policy says terminate
    roles = arm_server.find("Microsoft.Authorization/roleAssignments")
    for vm in vms(arm_server):
        assert vm["identity"]["type"] == "UserAssigned"  # made and given its role before the VM
        (role,) = [r for r in roles if r["properties"]["principalId"] == acting_principal(vm)]
        group = vm["id"].split("/providers/")[0]
        assert role["properties"]["scope"] == group and role["properties"]["roleDefinitionId"].endswith(
            "b24988ac-6180-42a0-ab88-20f7382dd24c")  # Contributor on its own resource group only


def test_the_vms_identity_has_its_role_before_any_vm_is_asked_for(arm_server: ArmServer,
                                                                   provider: AzureProvider) -> None:
    # A CLI killed right after ARM took a VM's create must leave a VM that can deallocate itself at
    # its deadline: its identity, and that identity's role on the group, exist before the create.
    seen: list[set[str]] = []

    def at_vm_create(_request: object) -> bool:
        identities = {r["properties"]["principalId"] for r in arm_server.find("Microsoft.ManagedIdentity/userAssignedIdentities")}
        seen.append({r["properties"]["principalId"] for r in arm_server.find("Microsoft.Authorization/roleAssignments")
                     if r["properties"]["roleDefinitionId"].endswith("b24988ac-6180-42a0-ab88-20f7382dd24c")}
                    & identities)
        return False  # only looks

    arm_server.faults.add("Looked", action="vm.create", when=at_vm_create)
    provider.launch(spec(), 2)
    assert len(seen) == 2 and all(len(found) == 1 for found in seen), seen
    assert {acting_principal(vm) for vm in vms(arm_server)} == seen[0]  # both VMs act as that identity


def test_several_nodes_share_one_network(arm_server: ArmServer, provider: AzureProvider) -> None:
    launched = provider.launch(spec(), 3)
    assert [i.id.split(":")[1] for i in launched] == ["box-0", "box-1", "box-2"]
    assert len({i.public_ip for i in launched}) == 3 and len(arm_server.find("Microsoft.Network/virtualNetworks")) == 1


GRANT = [  # (the launching principal's role, what the watchdog must do) -> refused before anything exists
    ("Owner", "stop", False),
    ("Contributor", None, False),  # no watchdog: no role to grant, nothing to check
    ("Contributor", "stop", True),
    ("Contributor", "delete", True),
]


@pytest.mark.parametrize("role,watchdog,refused", GRANT)
def test_credentials_that_cannot_grant_the_vms_role_are_refused_before_anything_is_created(
    arm_server: ArmServer, provider: AzureProvider, role: str, watchdog: str | None, refused: bool
) -> None:
    arm_server.principal_role = role
    if not refused:
        (inst,) = provider.launch(spec(watchdog=watchdog), 1)
        assert inst.state is InstanceState.RUNNING
        return
    with pytest.raises(CredentialsError) as caught:
        provider.launch(spec(watchdog=watchdog), 1)
    assert "roleAssignments/write" in caught.value.message
    assert "Owner or User Access Administrator" in (caught.value.hint or "") and "Contributor lacks it" in (
        caught.value.hint or "")
    assert arm_server.faults.count("nsg.create") == arm_server.faults.count("vm.create") == 0
    assert arm_server.faults.count("ip.create") == 0 and groups(arm_server) == []


def test_a_refused_role_assignment_is_a_warning_not_a_failed_launch(
    arm_server: ArmServer, provider: AzureProvider, caplog: pytest.LogCaptureFixture
) -> None:
    arm_server.faults.add("AuthorizationFailed", action="role.create")
    with caplog.at_level(logging.WARNING, logger="cloudtrain.providers.azure"):
        (inst,) = provider.launch(spec(), 1)
    assert inst.state is InstanceState.RUNNING
    assert "cannot stop or delete themselves" in caplog.text and "roleAssignments/write" in caplog.text
    # ... and since its watchdog could only fail, autostop and budget are refused for it, in one line.
    for down in (False, True):
        with pytest.raises(NotAvailableError) as caught:
            provider.watchdog_action(inst, down)
        assert "has no role on resource group cloudtrain-box-eastus" in caught.value.one_line()
        assert "\n" not in caught.value.one_line()


def test_custom_images_say_their_login_user_and_managed_ones_pin_a_region(
    arm_server: ArmServer, provider: AzureProvider
) -> None:
    gallery = arm_server.create_image("imgs", "team", ssh_user="trainer", gallery="g", region="westus2")
    (inst,) = provider.launch(spec(image=gallery), 1)
    assert inst.ssh_user == "trainer"
    managed = arm_server.create_image("imgs", "solo", region="westus2")
    with pytest.raises(UsageError, match="is in westus2, not eastus"):
        provider.launch(spec("other", image=managed), 1)
    with pytest.raises(UsageError, match="not found"):
        provider.launch(spec("other", image=managed + "-missing"), 1)
    with pytest.raises(UsageError, match="publisher:offer:sku:version"):
        provider.launch(spec("other", image="ubuntu"), 1)
    assert groups(arm_server) == ["cloudtrain-box-eastus", "imgs"]


def test_a_group_that_is_not_ours_is_never_touched(arm_server: ArmServer, provider: AzureProvider) -> None:
    from azure.mgmt.resource.resources.models import ResourceGroup

    arm_server.client("resource").resource_groups.create_or_update(
        "cloudtrain-box-eastus", ResourceGroup(location="eastus", tags={"team": "data"}))
    with pytest.raises(ProviderError, match="not cloudtrain's"):
        provider.launch(spec(), 1)
    assert groups(arm_server) == ["cloudtrain-box-eastus"]


def test_a_group_still_holding_vms_of_the_cluster_is_refused(arm_server: ArmServer, provider: AzureProvider) -> None:
    provider.launch(spec(), 1)
    with pytest.raises(ProviderError, match="already holds VMs"):
        provider.launch(spec(), 1)
    assert len(vms(arm_server)) == 1


# failures ----------------------------------------------------------------------------------------------


def test_allocation_failed_deletes_the_half_created_vm_then_the_group(
    arm_server: ArmServer, provider: AzureProvider
) -> None:
    arm_server.faults.add("AllocationFailed", regions={"eastus"})
    with pytest.raises(CapacityError) as caught:
        provider.launch(spec(), 2)
    assert caught.value.scope == "zone" and "AllocationFailed" in caught.value.message
    actions = [r.action for r in arm_server.faults.requests if r.method in ("PUT", "DELETE")]
    assert actions.count("vm.create") == 2
    assert actions[-3:] == ["vm.delete", "vm.delete", "group.delete"]  # the Failed VMs first, then everything
    assert groups(arm_server) == [] and arm_server.find("Microsoft.Network/publicIPAddresses") == []


@pytest.mark.parametrize(
    "code,message,scope",
    [
        ("SkuNotAvailable", None, "zone"),
        ("ZonalAllocationFailed", None, "zone"),
        ("OverconstrainedAllocationRequest", None, "zone"),
        ("OperationNotAllowed", None, "region"),  # the fake's default message is about quota
        ("QuotaExceeded", "Quota exceeded for LowPriorityCores", "region"),
    ],
)
def test_capacity_and_quota_codes_name_their_scope(
    arm_server: ArmServer, provider: AzureProvider, code: str, message: str | None, scope: str
) -> None:
    arm_server.faults.add(code, message=message)
    with pytest.raises(CapacityError) as caught:
        provider.launch(spec(zone="eastus-2" if code.startswith("Zonal") else None), 1)
    assert caught.value.scope == scope and code in caught.value.message
    assert groups(arm_server) == []


def test_operation_not_allowed_about_something_else_is_not_capacity(
    arm_server: ArmServer, provider: AzureProvider
) -> None:
    arm_server.faults.add("OperationNotAllowed", message="The operation is not allowed on a VM being migrated.")
    with pytest.raises(ProviderError) as caught:
        provider.launch(spec(), 1)
    assert not isinstance(caught.value, CapacityError) and groups(arm_server) == []


def test_permission_denied_stops_at_once_and_leaves_nothing(arm_server: ArmServer, provider: AzureProvider) -> None:
    arm_server.faults.add("AuthorizationFailed", action="nic.create")
    with pytest.raises(CredentialsError) as caught:
        provider.launch(spec(), 1)
    assert "AuthorizationFailed" in caught.value.message and "\n" not in caught.value.one_line()
    assert groups(arm_server) == []


def test_rejected_credentials_create_nothing(arm_server: ArmServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    provider = AzureProvider(**arm_server.config(region="eastus"), polling_interval=0)
    with pytest.raises(CredentialsError, match="AADSTS7000215"):
        provider.launch(spec(), 1)
    assert arm_server.faults.count("write") == 0


# describe, stop, start, terminate ------------------------------------------------------------------------


def test_stop_deallocates_even_a_vm_stopped_from_inside(arm_server: ArmServer, provider: AzureProvider) -> None:
    a, b = provider.launch(spec(), 2)
    compute = arm_server.client("compute")
    compute.virtual_machines.begin_power_off("cloudtrain-box-eastus", "box-1").result()  # like `shutdown -h`
    assert [i.state for i in provider.describe([a.id, b.id])] == [InstanceState.RUNNING, InstanceState.STOPPING]
    provider.stop([a.id, b.id])
    assert [arm_server.power_state(n) for n in ("box-0", "box-1")] == ["PowerState/deallocated"] * 2
    assert [i.state for i in provider.describe([a.id, b.id])] == [InstanceState.STOPPED] * 2
    provider.stop([a.id])  # already deallocated: nothing to do
    provider.start([a.id, b.id])
    started = provider.describe([a.id, b.id])
    assert [i.state for i in started] == [InstanceState.RUNNING] * 2
    assert [i.public_ip for i in started] == [a.public_ip, b.public_ip]  # static: the address stays
    with pytest.raises(ProviderError, match="no such VM"):
        provider.stop(["cloudtrain-box-eastus:box-9"])


def test_no_capacity_to_start_again_is_a_region_capacity_error(arm_server: ArmServer, provider: AzureProvider) -> None:
    (inst,) = provider.launch(spec(spot=True), 1)
    arm_server.evict("box-0")
    assert provider.describe([inst.id])[0].state is InstanceState.STOPPED
    arm_server.faults.add("AllocationFailed", action="vm.start")
    with pytest.raises(CapacityError) as caught:
        provider.start([inst.id])
    assert caught.value.scope == "region"


def test_terminate_deletes_the_group_and_is_idempotent(arm_server: ArmServer, provider: AzureProvider) -> None:
    launched = provider.launch(spec(), 2)
    provider.terminate([i.id for i in launched])
    assert groups(arm_server) == [] and arm_server.resources == {}  # nothing billed, nothing at all
    provider.terminate([i.id for i in launched])
    provider.terminate(["cloudtrain-nope-eastus:nope-0", "not-an-azure-id"])
    assert [i.state for i in provider.describe([launched[0].id, "junk"])] == [InstanceState.TERMINATED] * 2


def test_terminating_some_nodes_deletes_just_those_vms_with_their_disk_nic_and_ip(
    arm_server: ArmServer, provider: AzureProvider
) -> None:
    a, b = provider.launch(spec(), 2)
    provider.terminate([b.id])
    assert [v["name"] for v in vms(arm_server)] == ["box-0"]
    for kind in ("Microsoft.Compute/disks", "Microsoft.Network/networkInterfaces",
                 "Microsoft.Network/publicIPAddresses"):
        assert [r["name"].split("_")[0].removesuffix("-nic").removesuffix("-ip")
                for r in arm_server.find(kind)] == ["box-0"], kind
    assert provider.describe([a.id])[0].state is InstanceState.RUNNING


# the on-VM watchdog -----------------------------------------------------------------------------------


def test_watchdog_action_is_an_arm_call_with_the_vms_managed_identity(arm_server: ArmServer,
                                                                      provider: AzureProvider) -> None:
    (single,) = provider.launch(spec("one"), 1)
    pair = provider.launch(spec("two"), 2)
    sub = f"{arm_server.url}/subscriptions/{SUBSCRIPTION}/resourceGroups"
    imds = f"http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01&resource={arm_server.url}/"
    stop = provider.watchdog_action(single, False)
    # Deallocate: an OS shutdown would leave the VM allocated and billed.
    assert stop == {"kind": "http", "effect": "stop", "method": "POST",
                    "url": f"{sub}/cloudtrain-one-eastus/providers/Microsoft.Compute/virtualMachines/one-0/deallocate"
                           "?api-version=2024-07-01", "ok": [200, 202],
                    "token": {"url": imds, "headers": {"Metadata": "true"}, "field": "access_token"}}
    # The cluster's only VM deletes its whole group (disk, NIC, IP, network with it) ...
    alone = provider.watchdog_action(single, True)
    assert (alone["effect"], alone["method"], alone["url"], alone["gone_ok"]) == (
        "delete", "DELETE", f"{sub}/cloudtrain-one-eastus?api-version=2022-09-01", True)
    # ... one of several only itself: its idle decision must not delete busy peers.
    for rank, inst in enumerate(pair):
        one = provider.watchdog_action(inst, True)
        assert (one["effect"], one["method"], one["gone_ok"]) == ("delete", "DELETE", True)
        assert one["url"] == f"{sub}/cloudtrain-two-eastus/providers/Microsoft.Compute/virtualMachines/two-{rank}" \
                             "?api-version=2024-07-01"
        assert one["token"] == stop["token"]
    with pytest.raises(ProviderError, match="no VM one-7"):
        provider.watchdog_action(replace(single, id="cloudtrain-one-eastus:one-7"), False)


def test_watchdog_action_asks_imds_for_the_configured_arm_audience() -> None:
    from cloudtrain.providers.azure import build

    action = build.watchdog_action("https://management.azure.com/", "sub", "rg", "vm", down=False, whole_group=False)
    assert action["token"]["url"] == ("http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01"
                                      "&resource=https://management.azure.com/")
    assert action["url"] == ("https://management.azure.com/subscriptions/sub/resourceGroups/rg/providers/"
                             "Microsoft.Compute/virtualMachines/vm/deallocate?api-version=2024-07-01")


def test_list_tagged_finds_vms_by_group_tag_and_owner(arm_server: ArmServer, provider: AzureProvider) -> None:
    provider.launch(spec("one"), 1)
    provider.launch(replace(spec("two"), owner="someone-else"), 1)
    assert [i.cluster for i in provider.list_tagged()] == ["one"]
    assert [i.id for i in provider.list_tagged("one")] == ["cloudtrain-one-eastus:one-0"]
    everyone = AzureProvider(**arm_server.config(), polling_interval=0, all_owners=True)
    assert sorted(i.cluster for i in everyone.list_tagged()) == ["one", "two"]
    assert [(r.cluster, r.kind, r.id) for r in provider.list_resources()] == [
        ("one", "resource-group", "cloudtrain-one-eastus")]


def test_release_resources_deletes_groups_without_vms_and_keeps_the_others(
    arm_server: ArmServer, provider: AzureProvider
) -> None:
    from azure.mgmt.resource.resources.models import ResourceGroup

    provider.launch(spec(), 1)
    tags = {TAG_CLUSTER: "box", TAG_OWNER: owner_id()}
    # A launch killed before its VM existed: a tagged group holding only network (a billed public IP).
    arm_server.client("resource").resource_groups.create_or_update(
        "cloudtrain-box-westus2", ResourceGroup(location="westus2", tags=tags))
    kept = provider.release_resources("box")
    assert [(k.id, k.note) for k in kept] == [("cloudtrain-box-eastus", "holds 1 VM(s)")]
    assert groups(arm_server) == ["cloudtrain-box-eastus"]


def test_identity_errors_come_down_to_the_credential_that_failed() -> None:
    from cloudtrain.providers.azure.api import identity_detail

    head = "DefaultAzureCredential failed to retrieve a token from the included credentials.\nAttempted credentials:\n"
    nothing = head + ("\tEnvironmentCredential: EnvironmentCredential authentication unavailable. Environment "
                      "variables are not fully configured.\n\tAzureCliCredential: Azure CLI not found on path\n"
                      "\tVisualStudioCodeCredential: VisualStudioCodeCredential requires the 'azure-identity-broker' "
                      "package to be installed.\nTo mitigate this issue, please refer to ...")
    assert identity_detail(nothing) is None  # the caller says "no Azure credentials found"
    wrong = head + ("\tEnvironmentCredential: Authentication failed: AADSTS7000215: Invalid client secret provided. "
                    "Ensure the secret being sent ...\n\tAzureCliCredential: Azure CLI not found on path\n")
    assert identity_detail(wrong) == "EnvironmentCredential: Authentication failed: AADSTS7000215: Invalid client " \
                                     "secret provided."
    assert identity_detail("ClientSecretCredential.get_token failed: boom\nmore") == \
        "ClientSecretCredential.get_token failed: boom"


def test_mark_alive_renews_the_vm_tag_and_keeps_the_others(arm_server: ArmServer, provider: AzureProvider) -> None:
    from cloudtrain.providers.base import TAG_ALIVE, MarksAlive, supports

    assert supports(provider, MarksAlive)
    (inst,) = provider.launch(spec(tags={TAG_ALIVE: "1000"}), 1)
    assert provider.describe([inst.id])[0].alive_at == 1000.0
    provider.mark_alive([inst.id], 2_000_000_000)
    (listed,) = provider.list_tagged("box")
    assert listed.alive_at == 2_000_000_000.0 and listed.cluster == "box"
    provider.stop([inst.id])
    provider.mark_alive([inst.id], 2_000_000_100)  # deallocated: left as it was
    assert provider.describe([inst.id])[0].alive_at == 2_000_000_000.0
