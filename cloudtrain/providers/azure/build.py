"""What the `azure` provider creates, as SDK model objects: names, images, network, VMs.

One resource group per cluster and region, `cloudtrain-<cluster>-<region>`, tagged like everything
in it. Region in the name because a group's location is fixed and deleting one takes minutes: a
failover to the next region must not wait for (or collide with) the group it left behind.

Inside: NSG `<cluster>-nsg` (SSH from one CIDR; Azure's default rules already let the cluster's
VMs talk to each other and deny the rest of the internet), VNet `<cluster>-vnet` 10.0.0.0/16 with
subnet `default` carrying the NSG, and per node `<cluster>-<rank>` a Standard static public IP,
a NIC and the VM. The VM's OS disk, NIC and public IP are created with deleteOption=Delete, so
deleting the VM alone also leaves nothing billed; deleting the group removes everything.

SDK model classes are used for every body (plain dicts would be sent as given and ignored).
"""

from __future__ import annotations

import base64
import ipaddress
import re
import uuid
from dataclasses import dataclass
from typing import Any

from cloudtrain.errors import NotAvailableError, UsageError
from cloudtrain.providers.azure.api import log
from cloudtrain.providers.base import TAG_ALIVE, InstanceSpec

SSH_USER = "azureuser"
TAG_SSH_USER = "cloudtrain-ssh-user"  # on a custom image: the login user its VMs expect
# GPU sizes: Ubuntu 22.04 HPC image (NVIDIA driver, CUDA, InfiniBand stack), free of marketplace plans.
# CPU sizes: Canonical's Ubuntu 22.04 LTS Gen2. Both overridable with resources.image.
GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
CPU_IMAGE = "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
OS_DISK_TYPE = "StandardSSD_LRS"  # offered for every size, unlike Premium_LRS
VNET_PREFIX = "10.0.0.0/16"
SUBNET_PREFIX = "10.0.0.0/24"
SSH_RULE_PRIORITY = 1000
SSH_RULE_NAME = "ssh-from-caller"  # the NSG rule follow_caller updates
# Contributor, at the scope of the cluster's own resource group only: the VM may deallocate or
# delete itself, or its whole group (which is what `down` does), and touch nothing else.
CONTRIBUTOR_ROLE = "b24988ac-6180-42a0-ab88-20f7382dd24c"
OWNER_ROLE = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"
VM_CONTRIBUTOR_ROLE = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
# Built-in roles that let the VM's identity do what its watchdog asks, at the group's scope or wider:
# deallocate or delete a VM (Virtual Machine Contributor suffices), or delete the whole group.
VM_SELF_ROLES = frozenset({CONTRIBUTOR_ROLE, OWNER_ROLE, VM_CONTRIBUTOR_ROLE})
GROUP_DELETE_ROLES = frozenset({CONTRIBUTOR_ROLE, OWNER_ROLE})
# The on-node watchdog's calls (cloudtrain/node/actions.py, kind "http"). IMDS is link-local on every
# Azure VM and answers only with `Metadata: true`; its token is for the audience named by
# `resource`, which must be the ARM endpoint the call goes to (https://management.azure.com/).
IMDS_TOKEN_URL = "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01&resource={resource}"
COMPUTE_API_VERSION = "2024-07-01"
RESOURCES_API_VERSION = "2022-09-01"
_IMAGE_ID = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<group>[^/]+)/providers/Microsoft\.Compute/"
    r"(?:images/(?P<image>[^/]+)|galleries/(?P<gallery>[^/]+)/images/(?P<definition>[^/]+)(?:/versions/[^/]+)?)$",
    re.IGNORECASE,
)


def group_name(cluster: str, region: str) -> str:
    return f"cloudtrain-{cluster}-{region}"


def vm_name(cluster: str, rank: int) -> str:
    return f"{cluster}-{rank}"


def instance_id(group: str, vm: str) -> str:
    """Ids must be plain words for SSH configs (no '/'): `<resource group>:<vm name>`."""
    return f"{group}:{vm}"


def parse_instance_id(value: str) -> tuple[str, str] | None:
    group, sep, vm = value.partition(":")
    return (group, vm) if sep and group and vm and ":" not in vm else None


@dataclass(frozen=True)
class ImageChoice:
    reference: dict[str, str]  # ImageReference fields: publisher/offer/sku/version, or id
    ssh_user: str
    region: str | None = None  # a managed image exists in one region only


def parse_image(image: str) -> dict[str, str]:
    """`publisher:offer:sku:version` (az CLI's URN) or an image / gallery image resource id."""
    if image.startswith("/"):
        if not _IMAGE_ID.match(image):
            raise UsageError(
                f"resources.image: {image!r} is not a managed image or gallery image id",
                hint="/subscriptions/SUB/resourceGroups/RG/providers/Microsoft.Compute/images/NAME",
            )
        return {"id": image}
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise UsageError(
            f"resources.image: expected an image URN publisher:offer:sku:version or an image resource id, "
            f"got {image!r}",
            hint=f"e.g. {CPU_IMAGE}",
        )
    return dict(zip(("publisher", "offer", "sku", "version"), parts, strict=True))


def image_id_parts(image_id: str) -> dict[str, str | None]:
    match = _IMAGE_ID.match(image_id)
    assert match is not None
    return match.groupdict()


def ingress_cidr(cidr: str | None) -> str:
    if not cidr:
        raise UsageError(
            "ssh.allowed_cidr is not set: no address to allow SSH from",
            hint="set ssh.allowed_cidr in the config, e.g. 203.0.113.7/32",
        )
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise UsageError(f"ssh.allowed_cidr: {cidr!r} is not a CIDR like 203.0.113.7/32") from None
    if network.version != 4:
        raise NotAvailableError(f"ssh.allowed_cidr: IPv6 ({cidr}) is not supported on Azure yet",
                                hint="give an IPv4 /32")
    if network.prefixlen == 0:
        log.warning("azure: SSH is open to the whole internet (allowed_cidr %s); prefer your address/32", cidr)
    return str(network)


def zone_of(zone: str | None) -> list[str] | None:
    """'1', or 'eastus-1' as other clouds spell zones, -> ['1']."""
    if not zone:
        return None
    return [zone.rsplit("-", 1)[-1]]


# bodies --------------------------------------------------------------------------------------


def resource_group(region: str, tags: dict[str, str]) -> Any:
    from azure.mgmt.resource.resources.models import ResourceGroup

    return ResourceGroup(location=region, tags=tags)


def security_group(region: str, cidr: str, tags: dict[str, str]) -> Any:
    from azure.mgmt.network import models as n

    ssh = n.SecurityRule(
        name=SSH_RULE_NAME, description="cloudtrain: SSH from the launching address only",
        protocol="Tcp", access="Allow", direction="Inbound", priority=SSH_RULE_PRIORITY,
        source_address_prefix=cidr, source_port_range="*", destination_address_prefix="*",
        destination_port_range="22",
    )
    return n.NetworkSecurityGroup(location=region, tags=tags, security_rules=[ssh])


def virtual_network(region: str, nsg_id: str, tags: dict[str, str]) -> Any:
    from azure.mgmt.network import models as n

    subnet = n.Subnet(name="default", address_prefix=SUBNET_PREFIX,
                      network_security_group=n.NetworkSecurityGroup(id=nsg_id))
    return n.VirtualNetwork(location=region, tags=tags, address_space=n.AddressSpace(address_prefixes=[VNET_PREFIX]),
                            subnets=[subnet])


def public_ip(region: str, zones: list[str] | None, tags: dict[str, str]) -> Any:
    from azure.mgmt.network import models as n

    # Standard SKU (Basic is retired) is static: the address survives deallocate/start.
    return n.PublicIPAddress(location=region, tags=tags, zones=zones, sku=n.PublicIPAddressSku(name="Standard"),
                             public_ip_allocation_method="Static", public_ip_address_version="IPv4")


def network_interface(region: str, subnet_id: str, ip_id: str, tags: dict[str, str]) -> Any:
    from azure.mgmt.network import models as n

    config = n.NetworkInterfaceIPConfiguration(
        name="ipconfig1", primary=True, subnet=n.Subnet(id=subnet_id), private_ip_allocation_method="Dynamic",
        public_ip_address=n.PublicIPAddress(id=ip_id, delete_option="Delete"),
    )
    return n.NetworkInterface(location=region, tags=tags, ip_configurations=[config])


def virtual_machine(spec: InstanceSpec, region: str, name: str, nic_id: str, image: ImageChoice,
                    tags: dict[str, str], custom_data: str | None = None, identity_id: str | None = None) -> Any:
    """The VM body; `custom_data` (a script cloud-init runs at first boot: the launch-time deadline)
    goes base64-encoded, as ARM takes it. `identity_id`: the cluster's user-assigned identity
    (`identity_name`), whose role was given before the VM existed; without one, a system-assigned
    identity (what VMs of earlier versions have)."""
    from azure.mgmt.compute import models as c

    assert spec.ssh_public_key is not None and spec.instance_type is not None
    user = spec.ssh_user or image.ssh_user
    os_disk = c.OSDisk(
        create_option="FromImage", delete_option="Delete", caching="ReadWrite", disk_size_gb=spec.disk_gb,
        managed_disk=c.ManagedDiskParameters(storage_account_type=OS_DISK_TYPE),
    )
    key = c.SshPublicKey(path=f"/home/{user}/.ssh/authorized_keys", key_data=spec.ssh_public_key.strip())
    vm = c.VirtualMachine(
        location=region,
        tags=tags,
        zones=zone_of(spec.zone),
        hardware_profile=c.HardwareProfile(vm_size=spec.instance_type),
        storage_profile=c.StorageProfile(image_reference=c.ImageReference(**image.reference), os_disk=os_disk),
        os_profile=c.OSProfile(
            computer_name=name, admin_username=user,
            linux_configuration=c.LinuxConfiguration(
                disable_password_authentication=True, ssh=c.SshConfiguration(public_keys=[key])
            ),
            custom_data=base64.b64encode(custom_data.encode()).decode() if custom_data is not None else None,
        ),
        network_profile=c.NetworkProfile(
            network_interfaces=[c.NetworkInterfaceReference(id=nic_id, primary=True, delete_option="Delete")]
        ),
        # For the VM to deallocate or delete itself (autostop, its deadline): a role on its own group.
        identity=c.VirtualMachineIdentity(
            type="UserAssigned", user_assigned_identities={identity_id: c.UserAssignedIdentitiesValue()})
        if identity_id else c.VirtualMachineIdentity(type="SystemAssigned"),
    )
    if spec.spot:
        # Evicted spot VMs are deallocated (disk kept, can be started again) or deleted, as the
        # teardown policy says; -1: pay up to the on-demand price, never evicted for price.
        vm.priority = "Spot"
        vm.eviction_policy = "Deallocate" if spec.shutdown_behavior == "stop" else "Delete"
        vm.billing_profile = c.BillingProfile(max_price=-1)
    return vm


def deadline_script(arm_endpoint: str, subscription: str, group: str, vm: str, spec: InstanceSpec) -> str | None:
    """The VM's launch-time deadline (templates/deadline_arm.sh) when its spec has one: at
    `max_run_s` (+ grace) it deallocates itself, or deletes itself when the cluster's machines delete
    themselves (autostop.down, a sweep's lease), with the watchdog's own ARM call. Only itself, not
    the group: a peer may still be busy."""
    if spec.max_run_s is None:
        return None
    from cloudtrain.providers.deadline import http_action_script

    down = spec.watchdog_needs() == "delete"
    action = watchdog_action(arm_endpoint, subscription, group, vm, down=down, whole_group=False)
    return http_action_script(spec.max_run_s, action)


IDENTITY_API_VERSION = "2023-01-31"


def identity_name(cluster: str) -> str:
    """The cluster's user-assigned managed identity, in its resource group: made, and given its
    role, before any VM exists, so a VM can deallocate itself from its first second even when the
    CLI that launched it dies during the launch (a system-assigned identity exists only once its
    VM does, and its role came after: a VM whose CLI died in between could never stop itself)."""
    return f"{cluster}-vm-identity"


def identity_body(region: str, tags: dict[str, str]) -> Any:
    from azure.mgmt.resource.resources.models import GenericResource

    return GenericResource(location=region, tags=tags)


def vm_principals(vm: Any) -> list[str]:
    """The principal ids a VM acts as: its user-assigned identities' and its system-assigned one."""
    identity = getattr(vm, "identity", None)
    if identity is None:
        return []
    found = [value.principal_id for value in (identity.user_assigned_identities or {}).values()
             if value is not None and value.principal_id]
    if identity.principal_id:
        found.append(identity.principal_id)
    return found


def role_assignment(subscription: str, principal_id: str) -> Any:
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    return RoleAssignmentCreateParameters(
        role_definition_id=f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/"
        f"{CONTRIBUTOR_ROLE}",
        principal_id=principal_id,
        # Says the principal is a service principal, so ARM does not wait for directory replication.
        principal_type="ServicePrincipal",
    )


def role_assignment_name(holder_id: str, principal_id: str) -> str:
    """Deterministic (from the identity's or VM's resource id), so a retried launch assigns the role once."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cloudtrain:{holder_id.lower()}:{principal_id}"))


def watchdog_action(arm_endpoint: str, subscription: str, group: str, vm: str, *, down: bool,
                    whole_group: bool) -> dict[str, Any]:
    """What the VM's watchdog calls, with its managed identity's token from IMDS: deallocate itself
    (an OS shutdown would leave it allocated and billed); with `down` delete its resource group
    (`whole_group`: the cluster's only VM) or only itself (one node of several must not delete the
    others; the group left behind holds nothing billed and goes with `down` or `gc`)."""
    arm = arm_endpoint.rstrip("/")
    token = {"url": IMDS_TOKEN_URL.format(resource=f"{arm}/"), "headers": {"Metadata": "true"},
             "field": "access_token"}
    group_url = f"{arm}/subscriptions/{subscription}/resourceGroups/{group}"
    vm_url = f"{group_url}/providers/Microsoft.Compute/virtualMachines/{vm}"
    if not down:
        return {"kind": "http", "effect": "stop", "method": "POST",
                "url": f"{vm_url}/deallocate?api-version={COMPUTE_API_VERSION}", "ok": [200, 202], "token": token}
    if whole_group:
        return {"kind": "http", "effect": "delete", "method": "DELETE",
                "url": f"{group_url}?api-version={RESOURCES_API_VERSION}", "ok": [200, 202], "gone_ok": True,
                "token": token}
    return {"kind": "http", "effect": "delete", "method": "DELETE",
            "url": f"{vm_url}?api-version={COMPUTE_API_VERSION}", "ok": [200, 202, 204], "gone_ok": True,
            "token": token}


def mark_action(arm_endpoint: str, subscription: str, group: str, vm: str) -> dict[str, Any]:
    """The watchdog's renewal of its own VM's liveness tag (docs/watchdog.md): GET the VM, PATCH its
    whole tag map back with the mark set (a PATCH replaces the map), with the managed identity's
    token. Its role on the group (Contributor, given at launch for the stop and delete) already
    allows Microsoft.Compute/virtualMachines/read and /write: nothing is granted for the mark."""
    arm = arm_endpoint.rstrip("/")
    url = (f"{arm}/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/"
           f"{vm}?api-version={COMPUTE_API_VERSION}")
    return {"kind": "http-mark", "key": TAG_ALIVE, "get": url, "field": "tags", "method": "PATCH", "url": url,
            "ok": [200, 202], "token": {"url": IMDS_TOKEN_URL.format(resource=f"{arm}/"),
                                         "headers": {"Metadata": "true"}, "field": "access_token"}}


def disk_tags(tags: dict[str, str]) -> Any:
    from azure.mgmt.compute import models as c

    return c.DiskUpdate(tags=tags)
