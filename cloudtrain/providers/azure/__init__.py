"""The `azure` provider: N-series (and CPU) virtual machines reached over SSH.

What one `launch` creates, in a resource group of its own per cluster and region (see build.py),
every resource tagged `cloudtrain-cluster` and `cloudtrain-owner`: an NSG allowing SSH from one
CIDR only, a VNet/subnet, a user-assigned managed identity that gets Contributor on that group only
and a Storage Blob Data role on each container the recipe names (storage.py: Reader for data,
Contributor for the upload; found and removed by `down` and `gc` through their description, as they
carry no tags), all before any VM exists; then per node a public IP, a NIC and the VM (OS disk, NIC
and IP deleted with it) acting as that identity. VMs launched by earlier versions have a
system-assigned identity instead, whose role came after the VM: they keep working.

Money rules Azure makes easy to break:
- `stop` deallocates. A VM shut down from inside, or powered off through the API, is "Stopped
  (allocated)" and still billed; we report it as STOPPING (not stopped) and `stop` deallocates it.
- `terminate` deletes the whole resource group (and waits for it), so no disk, NIC or public IP
  outlives the VMs. Gone is success.
- autostop and budget: the VM's watchdog deallocates (or deletes) it through ARM with the VM's
  managed identity (`watchdog_action`); an OS shutdown alone would keep it billed. The budget (and a
  sweep's lease) also travels in the launch request: custom data that cloud-init runs at first boot
  (templates/deadline_arm.sh) makes the same ARM call at the deadline, even if the watchdog never
  got installed.
- A failed create can leave a VM resource behind (AllocationFailed arrives after ARM accepted the
  VM): the launch deletes its half-created VMs, then the group, before raising.

Capacity: AllocationFailed, ZonalAllocationFailed, Overconstrained*AllocationRequest and
SkuNotAvailable end this placement (CapacityError scope "zone": lifecycle tries the next size or
region in price order); quota errors (OperationNotAllowed about quota) end the region. Credential,
authorization and subscription errors stop the launch at once (CredentialsError). The SDKs poll
long-running operations (paced by ARM's Retry-After); this module never sleeps otherwise.

Reading (`describe`, `list_tagged`, the read before a stop, start, delete or tag, the listings of
groups and VMs) is ARM's REST API without the SDKs (api.ArmApi.get_json / list_json): a VM, NIC,
public IP or resource group is its JSON here (records.vm_record reads it), so `status --refresh`
never imports azure.mgmt.compute, azure.mgmt.network or azure.mgmt.resource (1-2 s each). Whatever
changes something (creates, deallocate, start, deletes, tags, role assignments) keeps the SDKs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from cloudtrain.catalog import Catalog, default_catalog
from cloudtrain.config import Config
from cloudtrain.cost import flat_hourly
from cloudtrain.errors import (
    CapacityError,
    CloudtrainError,
    CredentialsError,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.azure import access, build, storage
from cloudtrain.providers.azure.api import (
    COMPUTE_API_VERSION,
    NETWORK_API_VERSION,
    RESOURCE_API_VERSION,
    ArmApi,
    AzureApiError,
    log,
)
from cloudtrain.providers.azure.records import (
    PLACEMENT_CAPACITY_CODES,
    REGION_QUOTA_CODES,
    VmRecord,
    by_group,
    capacity_error,
    resolve_image,
    vm_record,
)
from cloudtrain.providers.base import (
    TAG_ALIVE,
    alive_value,
    note_launched,
    TAG_CLUSTER,
    TAG_OWNER,
    Traits,
    ClusterResource,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
    listing_owner,
    owner_id,
    sdk_installed,
)

__all__ = ["AzureApiError", "AzureProvider", "make_provider"]

class AzureProvider:
    name = "azure"
    # autostop: the VM deallocates (or deletes) itself through ARM with its managed identity.
    # Azure RBAC: a new role assignment "can take up to 10 minutes" to take effect (RBAC troubleshooting docs).
    traits = Traits(remote=True, priced=True, owns_machines=True, stops_spot=True, cloud_fields=True,
                    grant_propagation_s=600)
    # Stores its VMs get an identity for (a Storage Blob Data role for the VM's managed identity: storage.py).
    bucket_stores = ("az",)

    @staticmethod
    def image_pins_region(image: str) -> bool:
        """A managed image exists in one region; URNs and gallery images are available in many."""
        return "/providers/microsoft.compute/images/" in image.lower()

    def __init__(
        self,
        subscription_id: str | None = None,
        region: str | None = None,
        arm_endpoint: str | None = None,
        authority: str | None = None,
        *,
        all_owners: bool = False,
        owner: str | None = None,
        catalog: Catalog | None = None,
        polling_interval: float | None = None,
        credential: Any = None,
    ) -> None:
        """Listing shows only resource groups whose owner tag is this user's `owner_id()` unless
        `all_owners`. `polling_interval`: seconds between LRO polls when ARM sends no Retry-After."""
        self.api = ArmApi(subscription_id, arm_endpoint, authority, polling_interval, credential)
        self._region = region
        self.owner: str | None = None if all_owners else (owner or owner_id())
        self.catalog = catalog or default_catalog()

    @property
    def default_region(self) -> str | None:
        return self._region

    def check_credentials(self) -> CredentialStatus:
        return self.api.check_credentials(self.default_region)

    # launch ----------------------------------------------------------------------------------

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        if count < 1:
            raise UsageError(f"cannot launch {count} instances")
        if not spec.instance_type:
            raise UsageError("resources.instance_type: Azure needs a VM size", hint="set instance_type or accelerators")
        if not spec.ssh_public_key:
            raise UsageError(f"cluster {spec.cluster}: no SSH public key to install on Azure VMs")
        region = spec.region or self.default_region
        if not region:
            raise UsageError("no Azure region: set resources.region in the recipe or azure.region in the config")
        cidr = build.ingress_cidr(spec.allowed_cidr)
        image = resolve_image(self.api, self.catalog, spec, region)
        group = build.group_name(spec.cluster, region)
        names = [build.vm_name(spec.cluster, rank) for rank in range(count)]
        tags = spec.all_tags()
        self._check_group_free(group, spec.cluster)
        try:
            group_id = self._call("creating resource group", self.api.resource.resource_groups.create_or_update,
                                  group, build.resource_group(region, tags)).id
            if spec.buckets:  # an unknown storage account, or no right to assign roles, before any VM exists
                storage.require_grant(self.api, storage.find_accounts(
                    self.api, {a for a, _ in storage.container_roles(spec.buckets)}))
            if spec.watchdog_needs() is not None:
                self._require_grant(group)  # in the empty group: nothing billed exists yet
            # The VMs' identity and its roles before any VM: from its first second a VM may
            # deallocate itself (its deadline), whatever happens to this process after the create.
            identity_id, principal = self._make_identity(spec.cluster, region, group_id, tags)
            self._grant_group_role(group_id, group, identity_id, principal)
            self._grant_buckets(spec.cluster, [principal], spec.buckets)
            vms = self._create(spec, region, group, names, image, cidr, tags, identity_id)
        except BaseException as exc:
            if spec.buckets:
                self._release_buckets_quietly(spec.cluster)
            self._delete_half_created(group, spec.cluster, names, exc)
            raise
        self._tag_disks(group, vms, tags)
        return [vm.instance for vm in self._vms(group, names)]

    def _make_identity(self, cluster: str, region: str, group_id: str, tags: dict[str, str]) -> tuple[str, str]:
        """The cluster's user-assigned identity in its group (free; deleted with the group):
        (resource id, principal id)."""
        resource_id = f"{group_id}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/{build.identity_name(cluster)}"
        made = self._wait("creating the VMs' managed identity", self._call(
            "creating the VMs' managed identity", self.api.resource.resources.begin_create_or_update_by_id,
            resource_id, build.identity_body(region, tags), api_version=build.IDENTITY_API_VERSION))
        principal = str((made.properties or {}).get("principalId") or "")
        if not principal:
            raise ProviderError(f"azure: the managed identity {resource_id} came back without a principal id",
                                hint="run the command again")
        return made.id or resource_id, principal

    def _grant_group_role(self, group_id: str, group: str, holder_id: str, principal: str) -> None:
        """Contributor on the cluster's group for the VMs' identity. Not needed to run a job, so a
        refusal (e.g. no roleAssignments/write for a plain Contributor) is a warning, not a failed
        launch; autostop and budget, which need the role, are then refused by `watchdog_action`
        (asked right after the launch)."""
        try:
            self._call("assigning a role to the VMs' identity", self.api.authorization.role_assignments.create,
                       group_id, build.role_assignment_name(holder_id, principal),
                       build.role_assignment(self.api.require_subscription(), principal))
        except (AzureApiError, CredentialsError) as exc:
            if getattr(exc, "code", "") != "RoleAssignmentExists":
                log.warning("azure: the VMs of %s cannot stop or delete themselves (autostop): their identity got "
                            "no role: %s", group, exc.one_line())

    def _create(self, spec: InstanceSpec, region: str, group: str, names: list[str], image: build.ImageChoice,
                cidr: str, tags: dict[str, str], identity_id: str) -> list[Any]:
        """Network, then the VMs; each step's long-running operations run side by side."""
        net, compute = self.api.network, self.api.compute
        nsg_poller = self._call("creating the network security group",
                                net.network_security_groups.begin_create_or_update,
                                group, f"{spec.cluster}-nsg", build.security_group(region, cidr, tags))
        zones = build.zone_of(spec.zone)
        ip_pollers = [self._call("creating a public IP", net.public_ip_addresses.begin_create_or_update, group,
                                 f"{name}-ip", build.public_ip(region, zones, tags)) for name in names]
        nsg = self._wait("creating the network security group", nsg_poller)
        vnet = self._wait("creating the virtual network", self._call(
            "creating the virtual network", net.virtual_networks.begin_create_or_update, group,
            f"{spec.cluster}-vnet", build.virtual_network(region, nsg.id, tags)))
        ips = [self._wait("creating a public IP", poller) for poller in ip_pollers]
        nic_pollers = [self._call("creating a network interface", net.network_interfaces.begin_create_or_update, group,
                                  f"{name}-nic", build.network_interface(region, vnet.subnets[0].id, ip.id, tags))
                       for name, ip in zip(names, ips, strict=True)]
        nics = [self._wait("creating a network interface", poller) for poller in nic_pollers]
        # Every VM create that ARM accepted is seen to its end before we raise, so the cleanup
        # that follows never races a create still in flight.
        vm_pollers, vms, failure = [], [], None
        subscription = self.api.require_subscription()
        for name, nic in zip(names, nics, strict=True):
            deadline = build.deadline_script(self.api.arm_endpoint, subscription, group, name, spec)
            body = build.virtual_machine(spec, region, name, nic.id, image, tags, custom_data=deadline,
                                         identity_id=identity_id)
            try:
                vm_pollers.append(self._vm_call(spec, region, compute.virtual_machines.begin_create_or_update,
                                                group, name, body))
            except CloudtrainError as exc:
                failure = exc
                break
        for poller in vm_pollers:
            try:
                vms.append(self._vm_wait(spec, region, poller))
            except CloudtrainError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return vms

    def _grant_buckets(self, cluster: str, principals: Sequence[str], grants: Sequence[Any]) -> None:
        if grants or storage.ours(self.api, cluster):
            storage.grant(self.api, cluster, self.owner or owner_id(), principals, grants)

    def grant_buckets(self, cluster: str, instance_ids: Sequence[str], grants: Sequence[Any]) -> None:
        """A reused cluster's VM identities get exactly this recipe's containers (storage.grant)."""
        vms = [self._call("reading a VM", self.api.compute.virtual_machines.get, vm.group, vm.name)
               for vm in self._existing(instance_ids, "grant buckets to")]
        self._grant_buckets(cluster, storage.principals_of(vms), grants)

    def bucket_identity(self, cluster: str) -> str:
        """What the nodes read and write buckets with, in words (cloudtrain/buckets/steps.py)."""
        return storage.describe()

    def _release_buckets_quietly(self, cluster: str) -> None:
        try:
            storage.release(self.api, cluster)
        except (ProviderError, CredentialsError) as exc:
            log.warning("azure: could not remove the storage role assignments of cluster %s: %s; `cloudtrain gc` "
                        "finds them", cluster, exc.one_line())

    def _require_grant(self, group: str) -> None:
        """CredentialsError (one line, the role it takes) unless these credentials may grant the VMs'
        identities their role in `group`: asked of ARM before any billed resource exists."""
        permissions = self._list("reading the permissions of these credentials",
                                 self.api.authorization.permissions.list_for_resource_group, group)
        if not access.allows(permissions, access.GRANT_ACTION):
            raise CredentialsError(f"autostop and budget need the VMs' identities to get a role, and these credentials "
                                   f"may not grant one ({access.GRANT_ACTION})", hint=access.GRANT_HINT)

    def _vm_call(self, spec: InstanceSpec, region: str, fn: Any, *args: Any) -> Any:
        try:
            return self.api.call(f"creating VM {args[1]} ({spec.instance_type}) in {region}", fn, *args)
        except AzureApiError as exc:
            raise capacity_error(exc, spec, region) from None

    def _vm_wait(self, spec: InstanceSpec, region: str, poller: Any) -> Any:
        try:
            return self.api.wait(f"creating a {spec.instance_type} VM in {region}", poller)
        except AzureApiError as exc:
            raise capacity_error(exc, spec, region) from None

    def _check_group_free(self, group: str, cluster: str) -> None:
        existing = self._group(group)
        if existing is None:
            return
        if (existing.get("tags") or {}).get(TAG_CLUSTER) != cluster:
            raise ProviderError(f"resource group {group} exists and is not cloudtrain's for cluster {cluster}",
                                hint="delete it or use another cluster name")
        if ((existing.get("properties") or {}).get("provisioningState") or "").lower() == "deleting":
            raise ProviderError(f"resource group {group} is still being deleted", hint="try again in a few minutes")
        if self._vm_names(group):
            raise ProviderError(f"resource group {group} already holds VMs of cluster {cluster}",
                                hint=f"`cloudtrain down {cluster}` (or `cloudtrain gc`) first")

    def _delete_half_created(self, group: str, cluster: str, names: list[str], cause: BaseException) -> None:
        """After a failed launch: the VMs ARM may have kept (Failed), then the whole group. Quietly:
        a cleanup failure must not hide the failure it cleans up after."""
        try:
            existing = self._group(group)
            if existing is None or (existing.get("tags") or {}).get(TAG_CLUSTER) != cluster:
                return
            compute = self.api.compute
            # As last seen, with their creation times, for the ledger (note_launched).
            note_launched(cause, [vm.instance for vm in self._vms(group, names)])
            pollers = [self._call("deleting a half-created VM", compute.virtual_machines.begin_delete, group, name)
                       for name in names]
            for poller in pollers:
                self._wait("deleting a half-created VM", poller)
            self._wait("deleting the resource group", self._call(
                "deleting the resource group", self.api.resource.resource_groups.begin_delete, group))
        except (ProviderError, CredentialsError) as exc:
            log.warning("azure: launch failed (%s) and resource group %s could not be deleted: %s; "
                        "`cloudtrain down %s` removes it", type(cause).__name__, group, exc.one_line(), cluster)

    def _tag_disks(self, group: str, vms: Sequence[Any], tags: dict[str, str]) -> None:
        """Our tags on the OS disks (ARM gives a VM's implicit disk none); a refusal is only noted:
        the disk goes with its VM."""
        for vm in vms:
            disk = vm.storage_profile.os_disk.name if vm.storage_profile and vm.storage_profile.os_disk else None
            if disk:
                try:
                    poller = self._call("tagging the OS disk", self.api.compute.disks.begin_update, group, disk,
                                        build.disk_tags(tags))
                    self._wait("tagging the OS disk", poller)
                except (AzureApiError, CredentialsError) as exc:
                    log.info("azure: OS disk %s keeps no tags (%s); it goes with the VM", disk, exc.one_line())

    def follow_caller(self, cluster: str, cidr: str) -> str | None:
        """Before connecting: the cluster's NSG admits SSH from `cidr`, the caller's address now
        (its rule was written for the address at launch). The old prefix when changed, else None."""
        cidr = build.ingress_cidr(cidr)
        net = self.api.network
        for group in self._groups(cluster):
            try:
                nsg = self._call("reading the network security group", net.network_security_groups.get,
                                 group["name"], f"{cluster}-nsg")
            except AzureApiError as exc:
                if exc.status == 404:
                    continue
                raise
            rule = next((r for r in nsg.security_rules or [] if r.name == build.SSH_RULE_NAME), None)
            if rule is None or rule.source_address_prefix == cidr:
                continue
            before = rule.source_address_prefix or ", ".join(rule.source_address_prefixes or [])
            rule.source_address_prefix, rule.source_address_prefixes = cidr, None
            self._wait("updating the network security group", self._call(
                "updating the network security group", net.network_security_groups.begin_create_or_update,
                group["name"], nsg.name, nsg))
            return before
        return None

    # describe, list, stop, start, terminate --------------------------------------------------

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found: dict[str, Instance] = {}
        for group, names in by_group(ids).items():
            for vm in self._vms(group, names):
                found[vm.instance.id] = vm.instance
        gone = InstanceState.TERMINATED
        return [found.get(i) or Instance(i, "", gone) for i in ids]

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        found = []
        for group in self._groups(cluster):
            found.extend(vm.instance for vm in self._vms(group["name"]) if vm.instance.cluster)
        return found

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        """An ARM call the VM makes with its own managed identity (token from IMDS), never an OS
        shutdown: that leaves an Azure VM "Stopped (allocated)" and billed. Stop: deallocate. Down:
        delete the resource group when this VM is the cluster's only one, else this VM alone (a
        node's idle decision must not delete busy peers; the group left holds nothing billed and
        goes with `down` / `gc`). The identity needs a role on its group (`_grant_group_role`):
        without one the watchdog could only fail, so autostop and budget are refused here, at `up`
        (which then tears the new cluster down) or `cloudtrain autostop`."""
        parsed = build.parse_instance_id(instance.id)
        if parsed is None:
            raise ProviderError(f"{instance.id} is not an Azure VM id of cloudtrain's (<resource group>:<vm>)")
        group, name = parsed
        compute = self.api.compute
        try:
            vm = self._call(f"reading VM {name}", compute.virtual_machines.get, group, name)
        except AzureApiError as exc:
            if exc.status == 404:
                raise ProviderError(f"no VM {name} in resource group {group}",
                                    hint="`cloudtrain status --refresh` shows what exists") from None
            raise
        whole_group = False
        if down:
            whole_group = {n.lower() for n in self._vm_names(group)} <= {name.lower()}
        self._require_self_role(group, vm, build.GROUP_DELETE_ROLES if whole_group else build.VM_SELF_ROLES)
        return build.watchdog_action(self.api.arm_endpoint, self.api.require_subscription(), group, name,
                                     down=down, whole_group=whole_group)

    def mark_action(self, instance: Instance) -> dict[str, Any] | None:
        """The VM's own renewal of its liveness tag (MarksItself), with the identity and role its
        stop and delete already use (watchdog_action refuses a watchdog whose identity has none)."""
        parsed = build.parse_instance_id(instance.id)
        if parsed is None:
            return None
        return build.mark_action(self.api.arm_endpoint, self.api.require_subscription(), *parsed)

    def _require_self_role(self, group: str, vm: Any, roles: frozenset[str]) -> None:
        """NotAvailableError unless the VM's identity (user-assigned, or the system-assigned one of
        VMs launched by earlier versions) holds one of `roles` on its group (or wider): what its
        watchdog's ARM call needs to be allowed."""
        principals = set(build.vm_principals(vm))
        refusal = f"autostop and budget are not available for Azure VM {vm.name}"
        if not principals:
            raise NotAvailableError(f"{refusal}: it has no managed identity to stop itself with",
                                    hint="`cloudtrain down` it and launch again (cloudtrain gives new VMs one)")
        try:
            assignments = self._list("reading the role assignments of the resource group",
                                     self.api.authorization.role_assignments.list_for_resource_group, group)
        except (AzureApiError, CredentialsError) as exc:
            raise NotAvailableError(f"{refusal}: cannot tell whether its identity may stop it ({exc.one_line()})",
                                    hint="these credentials need Microsoft.Authorization/roleAssignments/read "
                                         f"on {group}") from None
        for assignment in assignments:
            role = (assignment.role_definition_id or "").rsplit("/", 1)[-1].lower()
            if assignment.principal_id in principals and role in roles:
                return
        raise NotAvailableError(
            f"{refusal}: its managed identity has no role on resource group {group} (the launch could not assign "
            "one), so it could not deallocate or delete itself",
            hint="launch with credentials allowed Microsoft.Authorization/roleAssignments/write (Owner or User Access "
                 "Administrator), or drop autostop and budget and use `cloudtrain stop` / `down`")

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        """This owner's cloudtrain resource groups (containers: free in themselves), and in each one
        that holds no VM (a launch killed early, a VM deleted alone) what stays billed there: public
        IPs (`public-ip`, priced per hour) and managed disks (`disk`, with their size). Those go with
        their group in `release_resources`, never on their own. A group with VMs is a live cluster's
        network: it goes with its VMs (`terminate`), and gc prices those VMs. Also the clusters'
        Storage Blob Data role assignments (`role-assignment`, free), which live outside their groups."""
        found = []
        for group in self._groups(cluster):
            owner_cluster = group["tags"][TAG_CLUSTER]
            found.append(ClusterResource("azure", owner_cluster, "resource-group", group["name"], group.get("location")))
            found += self._billed_without_vms(group["name"], owner_cluster)
        found += [ClusterResource("azure", a.cluster, "role-assignment", a.id, hourly_usd=0.0)
                  for a in storage.ours(self.api, cluster, self.owner)]
        return found

    def _billed_without_vms(self, group: str, cluster: str) -> list[ClusterResource]:
        """The public IPs and disks of `group` when it holds no VM ([] when it does, or is gone)."""
        try:
            if self._vm_names(group):
                return []
            ips = self._list("listing public IPs", self.api.network.public_ip_addresses.list, group)
            disks = self._list("listing disks", self.api.compute.disks.list_by_resource_group, group)
        except AzureApiError as exc:
            if exc.status == 404:  # deleted since the groups were listed: nothing left to bill
                return []
            raise
        found = [ClusterResource("azure", cluster, "public-ip", build.instance_id(group, ip.name), ip.location,
                                 hourly_usd=_public_ip_hourly(ip)) for ip in ips]
        found += [ClusterResource("azure", cluster, "disk", build.instance_id(group, disk.name), disk.location,
                                  size_gb=float(disk.disk_size_gb) if disk.disk_size_gb else None) for disk in disks]
        return found

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        """Delete the cluster's resource groups that hold no VM (a launch killed before its VM
        existed leaves a group with a billed public IP); keep the others. Waits for the deletes.
        With no VM of the cluster left, its container role assignments go too (storage.release)."""
        left, pollers = [], []
        for group in self._groups(cluster):
            vms = self._vm_names(group["name"])
            if vms:
                left.append(ClusterResource("azure", cluster, "resource-group", group["name"], group.get("location"),
                                            f"holds {len(vms)} VM(s)"))
                continue
            pollers.append(self._call("deleting a resource group", self.api.resource.resource_groups.begin_delete,
                                      group["name"]))
        for poller in pollers:
            self._wait_gone("deleting a resource group", poller)
        if not left:  # no VM of the cluster is left whose identity could still use them
            storage.release(self.api, cluster)
        return left

    def mark_alive(self, ids: Sequence[str], at: float) -> None:
        compute = self.api.compute
        pollers = []
        for group, names in by_group(ids).items():
            for vm in self._vms(group, names):
                if vm.power not in ("running", "starting"):
                    continue  # deallocated or going: nothing runs there to vouch for
                raw = self._call(f"reading VM {vm.name}", compute.virtual_machines.get, group, vm.name)
                # PATCH replaces the whole tag map: the VM's own tags, with the mark renewed.
                tags = {**(raw.tags or {}), TAG_ALIVE: alive_value(at)}
                pollers.append(self._call(f"tagging {vm.name}", compute.virtual_machines.begin_update, group,
                                          vm.name, {"tags": tags}))
        for poller in pollers:
            self._wait("tagging a VM", poller)

    def stop(self, ids: Sequence[str]) -> None:
        """Deallocate (never a power-off alone: Stopped (allocated) is still billed)."""
        compute = self.api.compute
        pollers = [self._call(f"deallocating {vm.name}", compute.virtual_machines.begin_deallocate, vm.group, vm.name)
                   for vm in self._existing(ids, "stop") if vm.power not in ("deallocated", "deallocating")]
        for poller in pollers:
            self._wait("deallocating a VM", poller)

    def start(self, ids: Sequence[str]) -> None:
        compute = self.api.compute
        todo = [vm for vm in self._existing(ids, "start") if vm.power not in ("running", "starting")]
        pollers = [(vm, self._call(f"starting {vm.name}", compute.virtual_machines.begin_start, vm.group, vm.name))
                   for vm in todo]
        for vm, poller in pollers:
            try:
                self._wait(f"starting {vm.name}", poller)
            except AzureApiError as exc:
                if exc.code in PLACEMENT_CAPACITY_CODES or exc.code in REGION_QUOTA_CODES:
                    # A deallocated VM stays in its region: nothing to fail over to.
                    raise CapacityError(f"no capacity to start {vm.name} in {vm.instance.region}: {exc.code}",
                                        hint="try again later, or `cloudtrain down` and launch elsewhere",
                                        scope="region") from None
                raise

    def terminate(self, ids: Sequence[str]) -> None:
        """Delete each VM's resource group when every VM in it is being terminated (the usual
        case: the whole cluster), else just those VMs (their disk, NIC and IP go with them).
        Idempotent; waits until ARM reports the deletes done. Then the cluster's empty groups go."""
        clusters, pollers = set(), []
        for group, names in by_group(ids).items():
            existing = self._group(group)
            if existing is None:
                continue
            cluster = (existing.get("tags") or {}).get(TAG_CLUSTER)
            present = {n.lower() for n in self._vm_names(group)}
            if cluster and present <= {n.lower() for n in names}:
                clusters.add(cluster)
                pollers.append(self._call(f"deleting resource group {group}",
                                          self.api.resource.resource_groups.begin_delete, group))
            else:
                pollers += [self._call(f"deleting VM {n}", self.api.compute.virtual_machines.begin_delete, group, n)
                            for n in names if n.lower() in present]
        for poller in pollers:
            self._wait_gone("deleting", poller)
        for cluster in sorted(clusters):
            for kept in self.release_resources(cluster):
                log.info("azure: kept %s %s (%s)", kept.kind, kept.id, kept.note)

    # helpers -----------------------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.api.call(what, fn, *args, **kwargs)

    def _wait(self, what: str, poller: Any) -> Any:
        return self.api.wait(what, poller)

    def _wait_gone(self, what: str, poller: Any) -> None:
        try:
            self._wait(what, poller)
        except AzureApiError as exc:
            if exc.status != 404:
                raise

    def _list(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """A paged list, read to the end (errors surface while paging)."""
        return self._call(what, lambda: list(fn(*args, **kwargs)))

    def _group(self, group: str) -> dict[str, Any] | None:
        """The resource group's JSON (Resource Groups - Get), None when there is none."""
        try:
            return self.api.get_json("reading a resource group", self.api.url(f"resourcegroups/{_part(group)}"),
                                     **{"api-version": RESOURCE_API_VERSION})
        except AzureApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _groups(self, cluster: str | None) -> list[dict[str, Any]]:
        """This owner's cloudtrain resource groups (of `cluster`), as JSON (Resource Groups - List)."""
        wanted = f"tagName eq '{TAG_CLUSTER}'" + (f" and tagValue eq '{cluster}'" if cluster else "")
        groups = self.api.list_json("listing resource groups", self.api.url("resourcegroups"),
                                    **{"$filter": wanted, "api-version": RESOURCE_API_VERSION})
        return [g for g in groups if (g.get("tags") or {}).get(TAG_CLUSTER)
                and (self.owner is None or (g.get("tags") or {}).get(TAG_OWNER) == self.owner)]

    def _group_url(self, group: str, kind: str) -> str:
        """The URL of a resource type's collection in `group`, e.g. Microsoft.Compute/virtualMachines."""
        return self.api.url(f"resourceGroups/{_part(group)}/providers/{kind}")

    def _vm_names(self, group: str) -> list[str]:
        """The names of the group's VMs (Virtual Machines - List, every page)."""
        return [vm["name"] for vm in self.api.list_json(
            "listing VMs", self._group_url(group, "Microsoft.Compute/virtualMachines"),
            **{"api-version": COMPUTE_API_VERSION})]

    def _vms(self, group: str, names: Sequence[str] | None = None) -> list[VmRecord]:
        """The group's VMs (or those named) with power state and addresses; missing ones left out.
        The calls the SDKs made: Virtual Machines - Get with $expand=instanceView per VM, then the
        group's NICs and public IPs (one listing each, whatever the number of VMs)."""
        vm_url = self._group_url(group, "Microsoft.Compute/virtualMachines")
        try:
            if names is None:
                names = self._vm_names(group)
            raw = []
            for name in names:
                try:
                    raw.append(self.api.get_json(f"reading VM {name}", f"{vm_url}/{_part(name)}", **{
                        "$expand": "instanceView", "api-version": COMPUTE_API_VERSION}))
                except AzureApiError as exc:
                    if exc.status != 404 or exc.code == "ResourceGroupNotFound":
                        raise
            if not raw:
                return []
            network = {"api-version": NETWORK_API_VERSION}
            nics = {n["id"].lower(): n for n in self.api.list_json(
                "listing NICs", self._group_url(group, "Microsoft.Network/networkInterfaces"), **network)}
            ips = {i["id"].lower(): i for i in self.api.list_json(
                "listing public IPs", self._group_url(group, "Microsoft.Network/publicIPAddresses"), **network)}
        except AzureApiError as exc:
            if exc.status == 404:
                return []
            raise
        return [vm_record(group, vm, nics, ips) for vm in raw]

    def _existing(self, ids: Sequence[str], verb: str) -> list[VmRecord]:
        found = {vm.instance.id: vm for group, names in by_group(ids).items() for vm in self._vms(group, names)}
        gone = [i for i in ids if i not in found or found[i].instance.state is InstanceState.TERMINATED]
        if gone:
            raise ProviderError(f"cannot {verb} {', '.join(gone)}: no such VM",
                                hint="`cloudtrain status --refresh` shows what exists")
        return [found[i] for i in ids]


def _part(name: str) -> str:
    """A name as one URL path segment (the SDKs quote theirs alike)."""
    return quote(name, safe="")


def _public_ip_hourly(ip: Any) -> float | None:
    """The listed hourly price of a Standard static IPv4 address (what launch creates; Basic is
    retired); None for any other kind, whose price the table does not hold."""
    sku = (ip.sku.name if ip.sku else "") or ""
    method = ip.public_ip_allocation_method or ""
    version = ip.public_ip_address_version or "IPv4"
    if (sku.lower(), method.lower(), version.lower()) != ("standard", "static", "ipv4"):
        return None
    return flat_hourly("azure", "public-ip")


def make_provider(config: Config) -> AzureProvider:
    # The SDKs are imported on first use (api.ArmApi); whether they are there is asked now.
    if not sdk_installed("azure.core", "azure.identity", "azure.mgmt.compute", "azure.mgmt.network",
                         "azure.mgmt.resource"):
        raise NotAvailableError("cloud azure needs the Azure SDKs", hint="pip install 'cloudtrain[azure]'")
    return AzureProvider(subscription_id=config.azure.subscription_id, region=config.azure.region,
                         arm_endpoint=config.azure.arm_endpoint, authority=config.azure.authority,
                         owner=listing_owner(config), all_owners=listing_owner(config) is None)
