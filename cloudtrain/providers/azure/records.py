"""Reading what ARM says about VMs, and deciding what its errors mean.

- `vm_record`: an ARM VirtualMachine (with instanceView) plus its NIC and public IP -> Instance.
  Power states map to ours with one Azure-specific rule: "Stopped (allocated)" is STOPPING, not
  STOPPED, because it is still billed for compute (only deallocated is STOPPED).
- `capacity_error`: which ARM codes mean "try the next placement" (scope zone) or "this region's
  quota is spent" (scope region); anything else stays the error it was.
- `resolve_image`: the recipe's image (or our default for the size) and the login user its VMs get.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.expiry import expiry_of
from cloudtrain.catalog import Catalog
from cloudtrain.errors import CapacityError, ProviderError, UsageError
from cloudtrain.providers.azure import build
from cloudtrain.providers.azure.api import ArmApi, AzureApiError
from cloudtrain.providers.base import TAG_CLUSTER, TAG_INCARNATION, Instance, InstanceSpec, InstanceState, alive_of

# "Not here": this size in this region (or zone) cannot be had now; another placement may work.
PLACEMENT_CAPACITY_CODES = frozenset({
    "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest", "SkuNotAvailable",
})
# Quotas are per region: every other size of the region's plan would hit them too.
REGION_QUOTA_CODES = frozenset({"QuotaExceeded", "OperationNotAllowed"})
POWER_STATES = {
    "starting": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "deallocating": InstanceState.STOPPING,
    # Stopped (allocated): still billed for compute. Not STOPPED, which means "not billed" to us.
    "stopped": InstanceState.STOPPING,
    "deallocated": InstanceState.STOPPED,
}


@dataclass(frozen=True)
class VmRecord:
    """A VM as cloudtrain sees it, plus what stop/start need: where it is and its raw power state."""

    instance: Instance
    group: str
    name: str
    power: str | None


def by_group(ids: Sequence[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for value in dict.fromkeys(ids):
        parsed = build.parse_instance_id(value)
        if parsed is not None:
            grouped.setdefault(parsed[0], []).append(parsed[1])
    return grouped


def vm_record(group: str, vm: Any, nics: dict[str, Any], ips: dict[str, Any]) -> VmRecord:
    statuses = vm.instance_view.statuses if vm.instance_view and vm.instance_view.statuses else []
    power = next((s.code.split("/", 1)[1].lower() for s in statuses if (s.code or "").startswith("PowerState/")), None)
    provisioning = (vm.provisioning_state or "").lower()
    if provisioning == "deleting":
        state = InstanceState.TERMINATED
    elif provisioning == "creating" or power is None:
        starting = provisioning in ("creating", "updating", "succeeded")
        state = InstanceState.PENDING if starting else InstanceState.UNKNOWN
    else:
        state = POWER_STATES.get(power, InstanceState.UNKNOWN)
    public_ip = private_ip = None
    refs = vm.network_profile.network_interfaces if vm.network_profile else []
    nic = nics.get(refs[0].id.lower()) if refs else None
    if nic is not None and nic.ip_configurations:
        config = nic.ip_configurations[0]
        private_ip = config.private_ip_address
        if config.public_ip_address is not None and config.public_ip_address.id:
            address = ips.get(config.public_ip_address.id.lower())
            public_ip = address.ip_address if address is not None else None
    tags = vm.tags or {}
    instance = Instance(
        id=build.instance_id(group, vm.name),
        cluster=tags.get(TAG_CLUSTER, ""),
        incarnation=tags.get(TAG_INCARNATION),
        alive_at=alive_of(tags),
        expiry=expiry_of(tags),
        state=state,
        instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else None,
        region=vm.location,
        zone=vm.zones[0] if vm.zones else None,
        public_ip=public_ip,
        private_ip=private_ip,
        ssh_user=vm.os_profile.admin_username if vm.os_profile else build.SSH_USER,
        launched_at=vm.time_created.timestamp() if getattr(vm, "time_created", None) else None,
        # When the power state began, by Azure's clock (the ledger bills from it).
        state_since=_power_since(statuses),
        # For gc's price of a leak: spot is billed at the spot price, a stopped VM for its disks.
        spot=(vm.priority or "").lower() == "spot",
        disk_gb=_os_disk_gb(vm),
    )
    return VmRecord(instance, group, vm.name, power)


def _power_since(statuses: Any) -> float | None:
    """When the VM entered its power state, by Azure's clock. Azure puts no time on the PowerState
    status; the ProvisioningState status has the end of the VM's last operation, which for a VM
    that cloudtrain did not stop (the watchdog's deallocate, a spot eviction, the portal) is that
    stop. A later update (a tag) moves it later: billed a little long, never short. A PowerState
    time, where an API version gives one, wins."""
    power = next((s.time for s in statuses if (s.code or "").startswith("PowerState/") and s.time), None)
    if power is not None:
        return float(power.timestamp())
    settled = next((s.time for s in statuses if (s.code or "").lower().startswith("provisioningstate/succeeded")
                    and s.time), None)
    return float(settled.timestamp()) if settled is not None else None


def _os_disk_gb(vm: Any) -> int | None:
    storage = vm.storage_profile
    disk = storage.os_disk if storage is not None else None
    return disk.disk_size_gb if disk is not None and disk.disk_size_gb else None


def capacity_error(exc: AzureApiError, spec: InstanceSpec, region: str) -> ProviderError:
    where = f"{spec.instance_type} in {region}" + (f" zone {spec.zone}" if spec.zone else "")
    if exc.code in PLACEMENT_CAPACITY_CODES:
        return CapacityError(f"no capacity for {where}: {exc.code}: {exc.arm_message}",
                             hint="another region or VM size may have capacity", scope="zone")
    if exc.code in REGION_QUOTA_CODES and (exc.code == "QuotaExceeded" or "quota" in exc.arm_message.lower()):
        return CapacityError(f"quota exhausted for {where}: {exc.code}: {exc.arm_message}",
                             hint="request more vCPU quota (Azure portal > Quotas > Compute)", scope="region")
    return exc


def resolve_image(api: ArmApi, catalog: Catalog, spec: InstanceSpec, region: str) -> build.ImageChoice:
    """The image for `spec` and its login user: our default for the size (GPU or CPU), a URN, or a
    custom image, whose `cloudtrain-ssh-user` tag names the user (a managed image must be in `region`)."""
    if not spec.image:
        offer = catalog.describe_type("azure", spec.instance_type or "")
        gpu = offer.accelerator_count > 0 if offer else bool(spec.accelerators) or \
            (spec.instance_type or "").startswith("Standard_N")
        return build.ImageChoice(build.parse_image(build.GPU_IMAGE if gpu else build.CPU_IMAGE), build.SSH_USER)
    reference = build.parse_image(spec.image)
    if "id" not in reference:
        return build.ImageChoice(reference, build.SSH_USER)
    # A custom image says which login user its VMs expect with a `cloudtrain-ssh-user` tag.
    parts = build.image_id_parts(reference["id"])
    compute = api.compute
    try:
        if parts["image"]:
            found = api.call("reading the image", compute.images.get, parts["group"], parts["image"])
        else:
            found = api.call("reading the gallery image", compute.gallery_images.get, parts["group"],
                             parts["gallery"], parts["definition"])
    except AzureApiError as exc:
        if exc.status == 404:
            raise UsageError(f"resources.image: {spec.image} not found", hint=exc.arm_message) from None
        raise
    if parts["image"] and found.location and found.location.lower() != region:
        raise UsageError(f"resources.image: managed image {parts['image']} is in {found.location}, not {region}",
                         hint="set resources.region to the image's region, or use a gallery image")
    user = (found.tags or {}).get(build.TAG_SSH_USER, build.SSH_USER)
    return build.ImageChoice(reference, user, found.location)
