"""The `gcp` provider: Compute Engine VMs (N1 + attached GPUs, or a2/a3/g2 with GPUs built in).

What one `launch` creates, in the project's `default` VPC network:
- firewall rule `cloudtrain-<cluster>-ssh`: tcp:22 from one CIDR only, to the cluster's network
  tag; with several nodes also `cloudtrain-<cluster>-internal` (the nodes to each other). Firewall
  rules carry no labels in Compute Engine: the description names the cluster and owner;
- one instance per node (`instances.insert`, see below), labelled `cloudtrain-cluster` and
  `cloudtrain-owner` (the boot disk too, deleted with it: a labelled disk no instance uses is a
  leftover, which `list_resources` lists and `release_resources` deletes, see resources.py), our
  public key in its `ssh-keys` metadata. Only when its watchdog may have to delete it
  (autostop.down, a sweep's lease) does it run as a service account, `gcp.service_account` (the
  project's default compute one unless configured), with the `compute` scope only: the watchdog
  deletes its VM with that account's token from the metadata server. Otherwise, or with
  `gcp.service_account: none`, no account: no Google credentials on the VM (a stop is an OS
  shutdown, which needs none). A recipe with `gs://` buckets also makes it run as that account,
  with a devstorage scope, and gives the account bucket-level IAM bindings for exactly those
  buckets (storage.py), before the VMs exist; they go with the cluster's last instance.
- firewall rule `cloudtrain-<cluster>-deny`: every other ingress to the tag, outranking the default
  network's rules that open SSH to the internet (see build.firewall_bodies).

Why one `insert` per node and not `bulkInsert`: clusters are a handful of nodes, each insert is one
operation whose errors we read directly (bulkInsert reports per-zone outcomes in operation
metadata), names stay ours (`<cluster>-<rank>-<suffix>`, the cluster readable from the name), and
zone failover is ours anyway. A launch is all nodes or none: if one node fails the others go.

Capacity (see api.failover_error): stockouts move to the region's next zone; a quota error ends the
region (CapacityError scope "region"), or all of GCP when it names GPUS_ALL_REGIONS ("cloud");
permission and credential errors stop at once (CredentialsError). A failed launch deletes the
instances and firewall rules it made before raising.

Spot VMs: provisioningModel SPOT, automaticRestart false, onHostMaintenance TERMINATE and
instanceTerminationAction STOP or DELETE from the teardown policy; they can be stopped and started.
`spec.max_run_s` (the budget's cloud-side backstop) becomes scheduling.maxRunDuration with the same
termination action: Compute Engine itself stops or deletes the VM if everything else fails.

Waiting: operations through zoneOperations.wait / globalOperations.wait (server-side long polls,
api.ComputeApi.wait); this module never sleeps and never opens SSH.

Everything but `launch` speaks Compute Engine's REST API without the SDK (api.ComputeApi.get_json,
post_json, delete_json): reading instances (`describe`, `list_tagged`, the read before a stop,
start, delete or label), `stop`, `start`, `terminate`, `mark_alive` and `release_resources` (see
resources.py). An instance is its JSON here (build.instance_record reads it), so `status
--refresh`, `stop`, `start` and `down` never import google.cloud.compute_v1 (2-4 s). The SDK is
imported on launch's first write or lookup, or by `grant_buckets` (api.ComputeApi.v1).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from cloudtrain.catalog import Catalog, default_catalog
from cloudtrain.config import Config
from cloudtrain.errors import (
    CapacityError,
    CredentialsError,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.base import (
    TAG_ALIVE,
    TAG_CLUSTER,
    alive_value,
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
from cloudtrain.providers.gcp import build
from cloudtrain.providers.gcp.api import (
    PUBLIC_ENDPOINT,
    ComputeApi,
    GcpApiError,
    failover_error,
    log,
)
from cloudtrain.providers.gcp.resources import Disks, Firewalls
from cloudtrain.providers.gcp.storage import BucketBindings, gcs_grants, scopes_for

__all__ = ["GcpApiError", "GcpProvider", "make_provider"]


class GcpProvider:
    name = "gcp"
    # autostop: an OS shutdown stops a GCE VM (no credentials needed for that); autostop.down: the
    # VM deletes itself through the Compute API with its service account's token (see launch).
    # IAM access change propagation: "typically 2 minutes", "in some cases 7 minutes or more".
    traits = Traits(remote=True, priced=True, owns_machines=True, stops_spot=True, cloud_fields=True,
                    grant_propagation_s=420)
    # Stores its VMs get an identity for: the VM's service account with bucket IAM bindings (storage.py).
    bucket_stores = ("gs",)

    @staticmethod
    def image_pins_region(image: str) -> bool:
        """Compute Engine images are global: any region can use them."""
        return False

    def __init__(self, project: str | None = None, region: str | None = None, api_endpoint: str | None = None, *,
                 service_account: str = build.DEFAULT_SERVICE_ACCOUNT, all_owners: bool = False,
                 owner: str | None = None, catalog: Catalog | None = None) -> None:
        """Listing shows only this user's (`owner_id()`) instances and firewalls unless `all_owners`.
        `service_account`: what every launched VM runs as (`default`, an email, or `none`)."""
        self.api = ComputeApi(project, region, api_endpoint)
        self.service_account = service_account
        self.owner: str | None = None if all_owners else (owner or owner_id())
        self.catalog = catalog or default_catalog()
        self.firewalls = Firewalls(self.api, self.owner)
        self.disks = Disks(self.api, self.owner)
        self.bindings = BucketBindings(self.api, self.owner)
        self._account_email: str | None = None
        # cluster -> buckets holding its bindings, as this process learnt them (the deleted VMs'
        # metadata, gc's scan): what release_resources unbinds.
        self._bound: dict[str, set[str]] = {}
        self._read_vms: set[str] = set()  # clusters whose VMs terminate() read (their metadata)

    @property
    def default_region(self) -> str | None:
        return self.api.default_region

    def check_credentials(self) -> CredentialStatus:
        return self.api.check_credentials()

    # launch ----------------------------------------------------------------------------------

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        if count < 1:
            raise UsageError(f"cannot launch {count} instances")
        if not spec.instance_type:
            raise UsageError("resources.instance_type: GCP needs a machine type",
                             hint="set instance_type or accelerators")
        if not spec.ssh_public_key:
            raise UsageError(f"cluster {spec.cluster}: no SSH public key to install on GCP instances")
        machine = build.parse_instance_type(spec.instance_type)
        region = spec.region or (build.region_of(spec.zone) if spec.zone else None) or self.default_region
        if not region:
            raise UsageError("no GCP region: set resources.region in the recipe or gcp.region in the config")
        cidr, open_to_all = build.ingress_cidr(spec.allowed_cidr)
        if open_to_all:
            log.warning("gcp: SSH is open to the whole internet (allowed_cidr %s); prefer your address/32", cidr)
        self.api.credentials()
        image = self._image(spec, machine)
        zones = [spec.zone] if spec.zone else [z for z in self._zones_offering(region, machine, spec.instance_type)
                                               if z not in spec.avoid_zones]
        grants = gcs_grants(spec.buckets)
        if grants and self.account_for(spec) == build.NO_SERVICE_ACCOUNT:
            raise UsageError(f"{grants[0].url}: the VMs have no identity to read it with (gcp.service_account is "
                             "none)", hint="set gcp.service_account to an account (or `default`); docs/data.md")
        try:
            self.firewalls.ensure(spec.cluster, spec.owner, cidr, count)
            if grants:  # before the VMs exist: the copy is their first act
                self.bindings.bind(spec.cluster, spec.owner, f"serviceAccount:{self.account_email()}", grants)
            return self._insert_in_zones(region, zones, spec, count, machine, image)
        except BaseException:
            # No instance of this launch is left (_insert_in_zones deletes its own): the firewall
            # rules and bucket bindings go too unless instances of the cluster still use them.
            self.firewalls.release_quietly(spec.cluster, lambda: self._live_count(spec.cluster))
            if grants:
                try:
                    live = self._live_count(spec.cluster)
                except (ProviderError, CredentialsError):
                    live = 1  # unknown: keep them; down or gc removes them
                if not live:
                    self.bindings.unbind_quietly(spec.cluster, [g.url.bucket for g in grants])
            raise

    def _insert_in_zones(self, region: str, zones: Sequence[str], spec: InstanceSpec, count: int,
                         machine: build.MachineChoice, image: build.ImageChoice) -> list[Instance]:
        attempts: list[build.ZoneAttempt] = []
        for zone in zones:
            names = [build.instance_name(spec.cluster, rank, uuid.uuid4().hex[:4]) for rank in range(count)]
            try:
                self._insert_all(zone, names, spec, machine, image)
            except GcpApiError as exc:
                error = failover_error(exc, f"{count} x {spec.instance_type} in {zone}")
                if not isinstance(error, CapacityError):
                    raise error from None
                attempts.append(build.ZoneAttempt(zone, exc.code, exc.gcp_message))
                log.info("gcp: %s in %s: %s; %s", spec.instance_type, zone, exc.code, exc.gcp_message)
                if error.scope != "zone":
                    raise error from None
                continue
            return [self._get(zone, name) for name in names]
        tried = ", ".join(f"{a.zone}: {a.code}" for a in attempts) or "no zone offers it"
        raise CapacityError(f"no capacity for {count} x {spec.instance_type} in {region} ({tried})",
                            hint="another region or machine type may have capacity", scope="zone")

    def _insert_all(self, zone: str, names: list[str], spec: InstanceSpec, machine: build.MachineChoice,
                    image: build.ImageChoice) -> None:
        """Insert every node in `zone` and wait for all of them: all or none. Whatever was asked
        for is deleted (and waited for) before an error, or an interrupt, goes up."""
        user = spec.ssh_user or image.ssh_user
        tags = spec.all_tags()
        if user != build.SSH_USER:
            if build.label_value(user) != user:
                raise UsageError(f"login user {user!r} cannot be stored as a GCP label",
                                 hint="use a user name of lowercase letters, digits, '-' and '_'")
            tags[build.LABEL_SSH_USER] = user
        disk_gb = spec.disk_gb or build.DEFAULT_DISK_GB
        if image.size_gb and disk_gb < image.size_gb:
            log.warning("gcp: disk_gb %s is below the image's %s GB; using %s GB",
                        disk_gb, image.size_gb, image.size_gb)
            disk_gb = image.size_gb
        instances = self.api.client("instances")
        operations: list[tuple[Any, Any]] = []
        failure: GcpApiError | None = None

        def inserter(name: str) -> Any:
            body = build.instance_body(
                name=name, zone=zone, machine=machine, image=image, disk_gb=disk_gb, ssh_user=user,
                public_key=spec.ssh_public_key or "", tags=tags, cluster=spec.cluster, spot=spec.spot,
                shutdown=spec.shutdown_behavior, max_run_s=getattr(spec, "max_run_s", None),
                service_account=self.account_for(spec), scopes=self.scopes_for(spec),
                buckets=sorted({g.url.bucket for g in gcs_grants(spec.buckets)}))

            def insert() -> Any:
                # One requestId per issue: `call` repeats it verbatim (Compute Engine answers a repeat
                # with the first operation); issuing anew after a failed operation takes a new one.
                request = {"project": self.api.project, "zone": zone, "instance_resource": self.api.v1.Instance(body),
                           "request_id": str(uuid.uuid4())}
                return self.api.call(f"creating instance {name}", instances.insert_unary, request=request)
            return insert

        try:
            for name in names:
                insert = inserter(name)
                try:
                    operations.append((insert, insert()))
                except GcpApiError as exc:
                    failure = exc
                    break
            for insert, operation in operations:
                try:
                    self.api.wait(f"creating an instance in {zone}", operation, zone, again=insert)
                except GcpApiError as exc:
                    failure = failure or exc
        except BaseException:
            self._delete_quietly(zone, names)
            raise
        if failure is not None:
            # A failed insert may still leave the instance behind: delete by name, gone is fine.
            self._delete_quietly(zone, names)
            raise failure

    def _zones_offering(self, region: str, machine: build.MachineChoice, instance_type: str) -> list[str]:
        """The region's zones that sell the machine type (and its attached GPU), in name order."""
        def zones_with(what: str, fn: Any, field: str, name: str) -> set[str]:
            found = self.api.aggregated(what, fn, field, project=self.api.project, filter=f'name = "{name}"')
            return {zone for zone, _ in found if build.region_of(zone) == region}

        zones = zones_with("listing machine types", self.api.client("machine_types").aggregated_list,
                           "machine_types", machine.machine_type)
        if machine.accelerator:
            zones &= zones_with("listing accelerator types", self.api.client("accelerator_types").aggregated_list,
                                "accelerator_types", machine.accelerator)
        if not zones:
            raise CapacityError(f"{instance_type} is not offered in any zone of {region}",
                                hint="another region or machine type", scope="zone")
        return sorted(zones)

    def _image(self, spec: InstanceSpec, machine: build.MachineChoice) -> build.ImageChoice:
        """The recipe's image or our default (Deep Learning VM for GPUs, Ubuntu otherwise), resolved
        to one image so every node boots the same; its `cloudtrain-ssh-user` label names the login."""
        wanted = spec.image or (build.GPU_IMAGE if machine.gpu else build.CPU_IMAGE)
        project, name, family = build.parse_image(wanted)
        images = self.api.client("images")
        try:
            if family:
                found = self.api.call("reading the image family", images.get_from_family, project=project, family=name)
            else:
                found = self.api.call("reading the image", images.get, project=project, image=name)
        except GcpApiError as exc:
            if exc.not_found:
                raise UsageError(f"resources.image: {wanted} not found", hint=exc.gcp_message) from None
            raise
        user = dict(found.labels or {}).get(build.LABEL_SSH_USER, build.SSH_USER)
        return build.ImageChoice(f"projects/{project}/global/images/{found.name}", user, int(found.disk_size_gb or 0))

    def follow_caller(self, cluster: str, cidr: str) -> str | None:
        """Before connecting: SSH to the cluster admitted from `cidr`, the caller's address now
        (the rule was written for the address at launch). The old ranges when changed, else None."""
        cidr, open_to_all = build.ingress_cidr(cidr)
        if open_to_all:
            log.warning("gcp: SSH is open to the whole internet (allowed_cidr %s); prefer your address/32", cidr)
        return self.firewalls.follow(cluster, cidr)

    # the VM's own identity ----------------------------------------------------------------------

    def account_for(self, spec: InstanceSpec) -> str:
        """The service account a VM runs as: one only when its watchdog may have to delete it
        (autostop.down, a sweep's lease), since any process on the VM can use its token. A stop
        needs none: Compute Engine turns an OS shutdown into a stop."""
        needed = spec.watchdog_needs() == "delete" or gcs_grants(spec.buckets)
        return self.service_account if needed else build.NO_SERVICE_ACCOUNT

    def scopes_for(self, spec: InstanceSpec) -> list[str]:
        """The VM's access scopes: compute for a watchdog that deletes, devstorage for buckets."""
        return ([build.COMPUTE_SCOPE] if spec.watchdog_needs() == "delete" else []) + scopes_for(spec.buckets)

    def account_email(self) -> str:
        """The VMs' service account's email (`default`: the project's default compute account,
        as projects.get names it)."""
        if self._account_email is None:
            if self.service_account != build.DEFAULT_SERVICE_ACCOUNT:
                self._account_email = self.service_account
            else:
                project = self.api.call("reading the project", self.api.client("projects").get,
                                        project=self.api.project)
                if not project.default_service_account:
                    raise ProviderError(f"project {self.api.project} has no default compute service account",
                                        hint="set gcp.service_account to an account's email")
                self._account_email = project.default_service_account
        return self._account_email

    def bucket_identity(self, cluster: str) -> str:
        """What the nodes read and write buckets with, in words (cloudtrain/buckets/steps.py)."""
        try:
            who = self.account_email()
        except (ProviderError, CredentialsError):
            who = self.service_account
        return f"the VM's service account {who} (metadata server; no user credentials on the VM)"

    def grant_buckets(self, cluster: str, instance_ids: Sequence[str], grants: Sequence[Any]) -> None:
        """A reused cluster's VMs may reach exactly this recipe's GCS buckets: its bindings move to
        them, and each VM's metadata names them (first with the old ones too, so that a `down`
        after an interruption still finds every binding). A VM launched without a service account
        or storage scope cannot be given one while it runs (setServiceAccount needs it stopped):
        refused in one line."""
        wanted = gcs_grants(grants)
        vms = self._existing(instance_ids, "grant buckets to")
        previous: set[str] = set()
        for _, name, raw in vms:
            previous |= build.instance_buckets(raw)
            if wanted and not build.can_use_storage(raw, any(g.write for g in wanted)):
                raise UsageError(f"instance {name} was launched without a service account and storage scope for "
                                 f"{wanted[0].url}", hint=f"`cloudtrain down {cluster}` and run again")
        now = {g.url.bucket for g in wanted}
        if not (now or previous):
            return
        self._name_buckets(vms, previous | now)
        self.bindings.bind(cluster, self.owner or owner_id(), f"serviceAccount:{self.account_email()}", wanted,
                           previous)
        self._name_buckets([(z, n, self._raw(z, n)) for z, n, _ in vms], now)

    def _name_buckets(self, vms: Sequence[tuple[str, str, dict[str, Any] | None]], buckets: set[str]) -> None:
        """Write `buckets` as each VM's `cloudtrain-buckets` metadata (instances.setMetadata with the
        fingerprint read, so a concurrent change is refused rather than lost)."""
        client = self.api.client("instances")
        for zone, name, raw in vms:
            if raw is None or build.instance_buckets(raw) == buckets:
                continue
            items = build.metadata_with_buckets(raw, sorted(buckets))
            metadata = self.api.v1.Metadata(fingerprint=raw["metadata"]["fingerprint"], items=items)
            operation = self.api.call(f"naming the buckets in {name}'s metadata", client.set_metadata_unary,
                                      project=self.api.project, zone=zone, instance=name, metadata_resource=metadata)
            self.api.wait(f"naming the buckets in {name}'s metadata", operation, zone)

    def vm_identity(self, watchdog_deletes: bool, buckets: bool = False) -> str:
        """What code on a VM of this config could do with the VM's own credentials (for `plan`)."""
        needs = InstanceSpec("", "", watchdog="delete" if watchdog_deletes else None)
        account = self.service_account if (watchdog_deletes or buckets) else build.NO_SERVICE_ACCOUNT
        if account == build.NO_SERVICE_ACCOUNT:
            why = "gcp.service_account is none" if (watchdog_deletes or buckets) else "no feature needs one"
            return (f"no service account ({why}): code on the VM gets no Google credentials; "
                    "autostop stops it by an OS shutdown")
        who = "the project's default compute service account" if account == "default" else account
        said = []
        if self.account_for(needs) != build.NO_SERVICE_ACCOUNT:
            said.append("the compute scope, so its watchdog can delete it: code on the VM can use the Compute "
                        "Engine API with that account's roles (Editor for the default account)")
        if buckets:
            said.append("a devstorage scope and IAM bindings on exactly the recipe's gs:// buckets (docs/data.md): "
                        "code on the VM can read the data prefixes and write the upload prefix")
        return f"{who} with " + "; and ".join(said)

    # describe, list, stop, start, terminate --------------------------------------------------

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found: list[Instance] = []
        for value in ids:
            parsed = build.parse_instance_id(value)
            raw = self._raw(*parsed) if parsed else None
            found.append(build.instance_record(raw, parsed[0]) if raw is not None and parsed else
                         Instance(value, "", InstanceState.TERMINATED))
        return found

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        return [build.instance_record(raw, zone) for zone, raw in self._tagged(cluster)]

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        """This owner's cloudtrain firewall rules and loose labelled disks, with their sizes (of one
        cluster, or all)."""
        found = self.firewalls.list(cluster) + self.disks.list(cluster)
        if self._storage_reachable():
            bound = self.bindings.list(cluster)
            for binding in bound:
                self._bound.setdefault(binding.cluster, set()).add(binding.id)
            found += bound
        return found

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        """Delete the cluster's firewall rules and loose disks unless instances of it still exist
        (then kept, noted)."""
        live = self._live_count(cluster)
        kept = self.firewalls.release(cluster, live) + self.disks.release(cluster, live)
        if cluster not in self._bound and cluster not in self._read_vms and not live and self._storage_reachable():
            # No VM said where its bindings are (gc of a cluster whose VMs are gone): scan the project.
            # A scan that fails (credentials that may not list buckets) never fails a `down`: gc says more.
            self._bound[cluster] = self.bindings.scanned(cluster)
        buckets = self._bound.get(cluster, set())
        if buckets and live:
            kept += [ClusterResource("gcp", cluster, "bucket-binding", b, note=f"in use by {live} instance(s)")
                     for b in sorted(buckets)]
        elif buckets:
            self.bindings.unbind(cluster, buckets)
            self._bound.pop(cluster, None)
        return kept

    def _storage_reachable(self) -> bool:
        """Whether bucket IAM may be asked: Google's own APIs, or a storage endpoint configured
        beside a Compute endpoint of one's own (never Google's storage for a private Compute)."""
        return self.api.endpoint is None or bool(os.environ.get("STORAGE_EMULATOR_HOST"))

    def mark_alive(self, ids: Sequence[str], at: float) -> None:
        for value in dict.fromkeys(ids):
            parsed = build.parse_instance_id(value)
            raw = self._raw(*parsed) if parsed else None
            if raw is None or parsed is None or raw.get("status") in build.STOPPED_STATUSES:
                continue  # gone, or stopped: nothing runs there to vouch for
            labels = {**dict(raw.get("labels") or {}), TAG_ALIVE: alive_value(at)}
            # Not waited for: the label is a hint, and the next mark writes it again.
            self.api.post_json(f"labelling {parsed[1]}", f"{_instance_path(*parsed)}/setLabels",
                               {"labels": labels, "labelFingerprint": raw.get("labelFingerprint", "")})

    def stop(self, ids: Sequence[str]) -> None:
        pending = [(zone, name, self.api.post_json(f"stopping {name}", f"{_instance_path(zone, name)}/stop"))
                   for zone, name, raw in self._existing(ids, "stop")
                   if raw.get("status") not in build.STOPPED_STATUSES]
        for zone, name, operation in pending:
            self.api.wait(f"stopping {name}", operation, zone)

    def start(self, ids: Sequence[str]) -> None:
        pending = [(zone, name, self.api.post_json(f"starting {name}", f"{_instance_path(zone, name)}/start"))
                   for zone, name, raw in self._existing(ids, "start")
                   if raw.get("status") not in build.STARTED_STATUSES]
        for zone, name, operation in pending:
            try:
                self.api.wait(f"starting {name}", operation, zone)
            except GcpApiError as exc:
                error = failover_error(exc, f"{name} in {zone}")
                if isinstance(error, CapacityError):
                    # A stopped instance lives in its zone: nothing to fail over to.
                    raise CapacityError(f"no capacity to start {name} in {zone}: {exc.code}: {exc.gcp_message}",
                                        hint="try again later, or `cloudtrain down` and launch elsewhere",
                                        scope="zone") from None
                raise

    def terminate(self, ids: Sequence[str]) -> None:
        """Idempotent: delete every instance still there and wait; then each cluster's firewall
        rules go once no instance of it is left."""
        clusters: set[str] = set()
        pending = []
        for value in dict.fromkeys(ids):
            parsed = build.parse_instance_id(value)
            if parsed is None:
                continue
            zone, name = parsed
            raw = self._raw(zone, name)
            cluster = (raw.get("labels") or {}).get(TAG_CLUSTER, "") if raw is not None else build.cluster_of_name(name)
            clusters.add(cluster)
            self._read_vms.add(cluster)
            if raw is None:
                continue
            if build.instance_buckets(raw):  # its bindings go with the cluster's last VM
                self._bound.setdefault(cluster, set()).update(build.instance_buckets(raw))
            try:
                pending.append((zone, name, self.api.delete_json(f"deleting {name}", _instance_path(zone, name))))
            except GcpApiError as exc:
                if not exc.not_found:
                    raise
        for zone, name, operation in pending:
            try:
                self.api.wait(f"deleting {name}", operation, zone)
            except GcpApiError as exc:
                if not exc.not_found:
                    raise
        for cluster in sorted(c for c in clusters if c):
            for kept in self.release_resources(cluster):
                log.info("gcp: kept %s %s (%s)", kept.kind, kept.id, kept.note)

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        """Stopping needs no credentials on the VM: Compute Engine turns an OS shutdown into a stop
        (TERMINATED: no compute billed, the disk kept). Deleting: `instances.delete` of the VM
        itself on the configured endpoint, with a token of the VM's service account from the
        metadata server; refused (one line) when the VM runs as no service account whose scopes
        allow it (`gcp.service_account: none`, or launched before cloudtrain attached one)."""
        parsed = build.parse_instance_id(instance.id)
        raw = self._raw(*parsed) if parsed is not None else None
        if parsed is None or raw is None:
            raise ProviderError(f"no instance {instance.id} in project {self.api.project}",
                                hint="`cloudtrain status --refresh` shows what exists")
        if not down:
            # The watchdog powers off only after GCE's metadata server confirms this is the instance.
            return {"kind": "shutdown", "effect": "stop", "identity": build.metadata_identity(parsed[1])}
        if not build.can_delete_itself(raw):
            raise NotAvailableError(
                f"instance {parsed[1]} cannot delete itself: it runs as no service account with the compute scope",
                hint="autostop without down stops it; for down, set gcp.service_account (not `none`) and launch "
                     "the cluster again")
        return build.delete_action(self.api.endpoint or PUBLIC_ENDPOINT, self.api.project, *parsed)

    def mark_action(self, instance: Instance) -> dict[str, Any] | None:
        """The VM's own renewal of its liveness label (MarksItself): only where it already runs as
        a service account with the compute scope (a watchdog that deletes it: autostop.down, a
        sweep's lease). A VM that only stops carries no credentials, and none is added for the mark
        (any process on the VM could use them): the CLI's marks cover it while a command holds it."""
        parsed = build.parse_instance_id(instance.id)
        raw = self._raw(*parsed) if parsed is not None else None
        if parsed is None or raw is None or not build.can_delete_itself(raw):
            return None
        return build.mark_action(self.api.endpoint or PUBLIC_ENDPOINT, self.api.project, *parsed)

    # helpers -----------------------------------------------------------------------------------

    def _tagged(self, cluster: str | None) -> list[tuple[str, dict[str, Any]]]:
        """(zone, instance JSON) of the cluster's (or every cloudtrain) instance of this owner."""
        terms = [f'(labels.{TAG_CLUSTER} = "{build.label_value(cluster)}")' if cluster else f"(labels.{TAG_CLUSTER}:*)"]
        if self.owner:
            terms.append(f'(labels.{TAG_OWNER} = "{self.owner}")')
        return self.api.aggregated_json("listing instances", "instances", filter=" ".join(terms))

    def _live_count(self, cluster: str) -> int:
        return len(self._tagged(cluster))

    def _raw(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance's JSON (instances.get), None when it is gone."""
        try:
            return self.api.get_json(f"reading {name}", _instance_path(zone, name))
        except GcpApiError as exc:
            if exc.not_found:
                return None
            raise

    def _get(self, zone: str, name: str) -> Instance:
        raw = self._raw(zone, name)
        if raw is None:
            raise ProviderError(f"instance {name} in {zone} vanished right after it was created")
        return build.instance_record(raw, zone)

    def _existing(self, ids: Sequence[str], verb: str) -> list[tuple[str, str, dict[str, Any]]]:
        found, gone = [], []
        for value in ids:
            parsed = build.parse_instance_id(value)
            raw = self._raw(*parsed) if parsed else None
            if raw is None or parsed is None:
                gone.append(value)
            else:
                found.append((parsed[0], parsed[1], raw))
        if gone:
            raise ProviderError(f"cannot {verb} {', '.join(gone)}: no such instance in project {self.api.project}",
                                hint="`cloudtrain status --refresh` shows what exists")
        return found

    def _delete_quietly(self, zone: str, names: Sequence[str]) -> None:
        """Cleanup on a failure path: delete by name and wait; never hide the original failure."""
        pending = []
        for name in names:
            try:
                pending.append((name, self.api.delete_json(f"deleting {name}", _instance_path(zone, name))))
            except GcpApiError as exc:
                if not exc.not_found:
                    log.warning("gcp: could not delete %s in %s after a failed launch: %s", name, zone, exc.one_line())
            except (ProviderError, CredentialsError) as exc:
                log.warning("gcp: could not delete %s in %s after a failed launch: %s", name, zone, exc.one_line())
        for name, operation in pending:
            try:
                self.api.wait(f"deleting {name}", operation, zone)
            except (ProviderError, CredentialsError) as exc:
                if not (isinstance(exc, GcpApiError) and exc.not_found):
                    log.warning("gcp: deleting %s in %s after a failed launch: %s", name, zone, exc.one_line())


def _instance_path(zone: str, name: str) -> str:
    """An instance's path under the project, as the SDK's transport writes it."""
    return f"zones/{quote(zone, safe='')}/instances/{quote(name, safe='')}"


def make_provider(config: Config) -> GcpProvider:
    # The SDK is imported on first use (api.ComputeApi.v1); whether it is there is asked now,
    # without importing it, so a missing one is said here and not in the middle of a call.
    if not sdk_installed("google.cloud.compute_v1", "google.auth"):
        raise NotAvailableError("cloud gcp needs google-cloud-compute", hint="pip install 'cloudtrain[gcp]'")
    return GcpProvider(project=config.gcp.project, region=config.gcp.region, api_endpoint=config.gcp.api_endpoint,
                       service_account=config.gcp.service_account, owner=listing_owner(config),
                       all_owners=listing_owner(config) is None)
