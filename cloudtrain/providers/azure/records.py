"""Reading what ARM says about VMs, and deciding what its errors mean.

- `vm_record`: an ARM VirtualMachine's JSON (with instanceView) plus its NIC and public IP -> Instance.
  Power states map to ours with one Azure-specific rule: "Stopped (allocated)" is STOPPING, not
  STOPPED, because it is still billed for compute (only deallocated is STOPPED).
- `capacity_error`: which ARM codes mean "try the next placement" (scope zone) or "this region's
  quota is spent" (scope region); anything else stays the error it was.
- `resolve_image`: the recipe's image (or our default for the size) and the login user its VMs get.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
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


def vm_record(group: str, vm: Mapping[str, Any], nics: Mapping[str, Mapping[str, Any]],
              ips: Mapping[str, Mapping[str, Any]]) -> VmRecord:
    """A VM as ARM's JSON has it (Virtual Machines - Get with $expand=instanceView: camelCase, the
    VM's settings under `properties`), with its group's NICs and public IPs (JSON, by lower-case
    id) -> ours. Absent fields are absent: each read below says what it falls back to."""
    props = vm.get("properties") or {}
    statuses = list((props.get("instanceView") or {}).get("statuses") or ())
    power = next((code.split("/", 1)[1].lower() for code in map(_code, statuses) if code.startswith("PowerState/")),
                 None)
    provisioning = (props.get("provisioningState") or "").lower()
    if provisioning == "deleting":
        state = InstanceState.TERMINATED
    elif provisioning == "creating" or power is None:
        starting = provisioning in ("creating", "updating", "succeeded")
        state = InstanceState.PENDING if starting else InstanceState.UNKNOWN
    else:
        state = POWER_STATES.get(power, InstanceState.UNKNOWN)
    public_ip = private_ip = None
    refs = (props.get("networkProfile") or {}).get("networkInterfaces") or []
    nic = nics.get((refs[0].get("id") or "").lower()) if refs else None
    configs = ((nic or {}).get("properties") or {}).get("ipConfigurations") or []
    if configs:
        config = configs[0].get("properties") or {}
        private_ip = config.get("privateIPAddress")
        address_id = (config.get("publicIPAddress") or {}).get("id")
        if address_id:
            address = ips.get(address_id.lower())
            public_ip = (address.get("properties") or {}).get("ipAddress") if address is not None else None
    tags = vm.get("tags") or {}
    zones = vm.get("zones") or []
    instance = Instance(
        id=build.instance_id(group, vm["name"]),
        cluster=tags.get(TAG_CLUSTER, ""),
        incarnation=tags.get(TAG_INCARNATION),
        alive_at=alive_of(tags),
        expiry=expiry_of(tags),
        state=state,
        instance_type=(props.get("hardwareProfile") or {}).get("vmSize"),
        region=vm.get("location"),
        zone=zones[0] if zones else None,
        public_ip=public_ip,
        private_ip=private_ip,
        ssh_user=(props.get("osProfile") or {}).get("adminUsername") or build.SSH_USER,
        launched_at=_timestamp(props.get("timeCreated")),
        # When the power state began, by Azure's clock (the ledger bills from it).
        state_since=_power_since(statuses),
        # For gc's price of a leak: spot is billed at the spot price, a stopped VM for its disks.
        spot=(props.get("priority") or "").lower() == "spot",
        disk_gb=((props.get("storageProfile") or {}).get("osDisk") or {}).get("diskSizeGB") or None,
    )
    return VmRecord(instance, group, vm["name"], power)


def _code(status: Mapping[str, Any]) -> str:
    return str(status.get("code") or "")


def _power_since(statuses: Sequence[Mapping[str, Any]]) -> float | None:
    """When the VM entered its power state, by Azure's clock. Azure puts no time on the PowerState
    status; the ProvisioningState status has the end of the VM's last operation, which for a VM
    that cloudtrain did not stop (the watchdog's deallocate, a spot eviction, the portal) is that
    stop. A later update (a tag) moves it later: billed a little long, never short. A PowerState
    time, where an API version gives one, wins."""
    power = next((s["time"] for s in statuses if _code(s).startswith("PowerState/") and s.get("time")), None)
    if power is not None:
        return _timestamp(power)
    settled = next((s["time"] for s in statuses if _code(s).lower().startswith("provisioningstate/succeeded")
                    and s.get("time")), None)
    return _timestamp(settled)


def _timestamp(value: str | None) -> float | None:
    """An ARM date-time (ISO 8601; ARM writes seven fractional digits, which Python truncates to
    six as the SDK's deserializer did) -> epoch seconds; one without an offset is UTC, as ARM's
    clock is. None when absent or unreadable."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


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
