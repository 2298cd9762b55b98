"""Pure pieces of the `gcp` provider: names, labels, instance types, request bodies and records.

Nothing here imports the SDK or talks to Google: request bodies are plain dicts with the SDK's
snake_case field names (`compute_v1.Instance(body)` takes them as they are); instances are read as
Compute Engine's own JSON (camelCase, int64 as strings: `instance_record` and the helpers below),
which is what the provider's read path gets (api.ComputeApi.get_json, no SDK). So every rule below
is testable on its own.

Instance types come from the catalog (catalog_data/gcp.csv). GPUs that attach to an N1 machine are
part of the type's name, `<machine>+<gpu>x<count>` (e.g. `n1-standard-4+t4x1`), because a placement
carries one instance type and the plan prices the pair, not the machine alone. Accelerator-optimized
machines (a2, a3, g2, ...) have their GPUs built in and are named as Google names them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cloudtrain.expiry import expiry_of
from cloudtrain.errors import NotAvailableError, UsageError
from cloudtrain.providers.deadline import deadline_seconds
from cloudtrain.providers.base import TAG_ALIVE, TAG_CLUSTER, TAG_INCARNATION, TAG_OWNER, Instance, InstanceState, alive_of

SSH_USER = "cloudtrain"  # the login user our key is installed for (the guest agent creates it)
LABEL_SSH_USER = "cloudtrain-ssh-user"  # on an image: its login user; on an instance: a non-default user
NETWORK = "global/networks/default"
DISK_TYPE = "pd-balanced"
DEFAULT_DISK_GB = 100  # room for a TensorFlow install; catalog_data/storage/disks.csv prices it
# Google's Deep Learning VM with the NVIDIA driver installed, and plain Ubuntu, as image families
# (the newest image of each; `resources.image` overrides either).
GPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
CPU_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
# Short GPU names in instance types -> Compute Engine accelerator types.
ACCELERATOR_TYPES = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "p100": "nvidia-tesla-p100",
    "p4": "nvidia-tesla-p4",
}
# Machine families whose GPUs come with the machine (no guestAccelerators in the request).
BUILT_IN_GPU_FAMILIES = ("a2", "a3", "a4", "g2", "g4")
MIN_RUN_SECONDS = 30  # scheduling.maxRunDuration bounds, as the API enforces them
# The VM's service account and its access scope: the on-node watchdog deletes its own VM with a
# token from the metadata server (autostop.down). `compute` is the narrowest scope that allows
# instances.delete (`compute.readonly` does not; `cloud-platform` would reach every API).
DEFAULT_SERVICE_ACCOUNT = "default"  # the project's default compute service account
NO_SERVICE_ACCOUNT = "none"  # config value: no service account, no credentials on the VM
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"
# Scopes whose tokens may call instances.delete (what watchdog_action checks on an instance).
DELETE_SCOPES = frozenset({COMPUTE_SCOPE, "https://www.googleapis.com/auth/cloud-platform"})
METADATA_TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
MAX_RUN_SECONDS = 120 * 24 * 3600
METADATA_BUCKETS = "cloudtrain-buckets"  # instance metadata: the buckets its account is bound to
STORAGE_READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
STORAGE_WRITE_SCOPES = frozenset({"https://www.googleapis.com/auth/devstorage.read_write",
                                  "https://www.googleapis.com/auth/devstorage.full_control",
                                  "https://www.googleapis.com/auth/cloud-platform"})

# Instance.status -> ours. A stopped instance is TERMINATED in Compute Engine (it still exists, its
# disk is billed, `start` brings it back): that is our STOPPED. Deleted instances are simply gone.
STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "TERMINATED": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
}
STOPPED_STATUSES = frozenset({"STOPPING", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED"})
STARTED_STATUSES = frozenset({"PROVISIONING", "STAGING", "RUNNING", "REPAIRING"})

_RFC1035 = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_TYPE_RE = re.compile(r"^(?P<machine>[a-z][a-z0-9-]*[a-z0-9])\+(?P<gpu>[a-z0-9-]+?)x(?P<count>[1-9][0-9]?)$")
_IMAGE_RE = re.compile(r"^projects/(?P<project>[^/]+)/global/images/(?:(?P<family>family)/)?(?P<name>[^/]+)$")


@dataclass(frozen=True)
class MachineChoice:
    """What an instance type means: the machine type and the GPUs attached to it (if any)."""

    machine_type: str
    accelerator: str | None = None  # Compute Engine accelerator type, e.g. nvidia-tesla-t4
    count: int = 0

    @property
    def family(self) -> str:
        return self.machine_type.split("-", 1)[0]

    @property
    def gpu(self) -> bool:
        return self.accelerator is not None or self.family in BUILT_IN_GPU_FAMILIES


@dataclass(frozen=True)
class ImageChoice:
    source: str  # projects/P/global/images/NAME: one image for every node of a launch
    ssh_user: str
    size_gb: int  # the image's own disk size: the boot disk cannot be smaller


@dataclass(frozen=True)
class ZoneAttempt:
    zone: str
    code: str
    message: str


def parse_instance_type(value: str) -> MachineChoice:
    """'n1-standard-4+t4x1' -> n1-standard-4 with one nvidia-tesla-t4; 'g2-standard-4' as it is."""
    if "+" not in value:
        if not _RFC1035.match(value):
            raise UsageError(f"resources.instance_type: {value!r} is not a Compute Engine machine type")
        return MachineChoice(value)
    match = _TYPE_RE.match(value)
    if not match:
        raise UsageError(
            f"resources.instance_type: expected MACHINE+GPUxCOUNT like 'n1-standard-4+t4x1', got {value!r}")
    gpu = match.group("gpu")
    accelerator = ACCELERATOR_TYPES.get(gpu, gpu if gpu.startswith("nvidia-") else None)
    if accelerator is None:
        raise UsageError(f"resources.instance_type: unknown GPU {gpu!r} in {value!r}",
                         hint=f"attachable GPUs: {', '.join(sorted(ACCELERATOR_TYPES))}")
    choice = MachineChoice(match.group("machine"), accelerator, int(match.group("count")))
    if choice.family != "n1":
        raise UsageError(f"resources.instance_type: GPUs attach to N1 machines only, not {choice.machine_type}",
                         hint="a2, a3 and g2 machine types have their GPUs built in: name them alone")
    return choice


def instance_type_name(machine_type: str, accelerators: list[tuple[str, int]]) -> str:
    """The catalog's name for a machine and its attached GPUs (the inverse of parse_instance_type)."""
    if not accelerators:
        return machine_type
    short = {v: k for k, v in ACCELERATOR_TYPES.items()}
    accelerator, count = accelerators[0]
    return f"{machine_type}+{short.get(accelerator, accelerator)}x{count}"


# names and labels --------------------------------------------------------------------------------


def resource_name(base: str, *suffixes: str) -> str:
    """An RFC 1035 name of at most 63 characters: `base-suffix...`, the base shortened if needed."""
    tail = "".join(f"-{s}" for s in suffixes)
    stem = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-") or "x"
    if not stem[0].isalpha():
        stem = "c" + stem
    stem = stem[: 63 - len(tail)].rstrip("-")
    return stem + tail


def instance_name(cluster: str, rank: int, suffix: str) -> str:
    """`<cluster>-<rank>-<suffix>`: unique per launch attempt, and the cluster readable from it."""
    return resource_name(cluster, str(rank), suffix)


def cluster_of_name(name: str) -> str:
    """The cluster part of an instance name made by instance_name (a hint only: labels decide)."""
    return name.rsplit("-", 2)[0] if name.count("-") >= 2 else name


def network_tag(cluster: str) -> str:
    return resource_name(f"cloudtrain-{cluster}")


def firewall_name(cluster: str, kind: str) -> str:
    """`cloudtrain-<cluster>-ssh` (SSH from one CIDR), `-internal` (nodes) or `-deny` (the rest)."""
    return resource_name(f"cloudtrain-{cluster}", kind)


def label_key(text: str) -> str:
    """GCP label keys: lowercase letters, digits, '_' and '-', starting with a letter, <= 63."""
    key = re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]
    return key if key[:1].isalpha() else ("k" + key)[:63]


def label_value(text: str) -> str:
    """GCP label values: lowercase letters, digits, '_' and '-', at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def labels(tags: Mapping[str, str]) -> dict[str, str]:
    return {label_key(k): label_value(v) for k, v in tags.items()}


# Firewalls carry no labels in Compute Engine: who made one is written in its description.
def firewall_description(cluster: str, owner: str, what: str) -> str:
    return f"{TAG_CLUSTER}={cluster} {TAG_OWNER}={owner}: {what}"


def parse_firewall_description(text: str) -> tuple[str, str] | None:
    """(cluster, owner) from a description firewall_description wrote, else None."""
    match = re.match(rf"^{TAG_CLUSTER}=(\S+) {TAG_OWNER}=(\S+):", text or "")
    return (match.group(1), match.group(2)) if match else None


def instance_id(zone: str, name: str) -> str:
    """Ids are plain words (no '/') for SSH configs: `<zone>:<name>`."""
    return f"{zone}:{name}"


def parse_instance_id(value: str) -> tuple[str, str] | None:
    zone, sep, name = value.partition(":")
    return (zone, name) if sep and zone and name and ":" not in name else None


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def last_part(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1] if url else ""


def ingress_cidr(cidr: str | None) -> tuple[str, bool]:
    """(the CIDR SSH is allowed from, whether it is the whole internet)."""
    if not cidr:
        raise UsageError("ssh.allowed_cidr is not set: no address to allow SSH from",
                         hint="set ssh.allowed_cidr in the config, e.g. 203.0.113.7/32")
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise UsageError(f"ssh.allowed_cidr: {cidr!r} is not a CIDR like 203.0.113.7/32") from None
    if network.version != 4:
        raise NotAvailableError(f"ssh.allowed_cidr: IPv6 ({cidr}) is not supported on GCP yet", hint="give an IPv4 /32")
    return str(network), network.prefixlen == 0


def parse_image(image: str) -> tuple[str, str, bool]:
    """(project, name, is_family) of `projects/P/global/images/NAME`, `.../images/family/F` or a URL."""
    path = re.sub(r"^https?://[^/]+/compute/(v1|beta)/", "", image.strip())
    match = _IMAGE_RE.match(path)
    if not match:
        raise UsageError(f"resources.image: expected projects/PROJECT/global/images/NAME or "
                         f"projects/PROJECT/global/images/family/FAMILY, got {image!r}")
    return match.group("project"), match.group("name"), bool(match.group("family"))


# request bodies ----------------------------------------------------------------------------------


def scheduling(*, spot: bool, gpu: bool, shutdown: str, max_run_s: float | None) -> dict[str, Any]:
    """Live migration is impossible with GPUs and for spot VMs (both TERMINATE on host maintenance,
    which spot requests must say explicitly too); spot VMs never restart automatically. A run-time
    limit (the budget's cloud-side backstop) ends the VM the way the teardown policy would."""
    action = "STOP" if shutdown == "stop" else "DELETE"
    body: dict[str, Any] = {
        "on_host_maintenance": "TERMINATE" if gpu or spot else "MIGRATE",
        "automatic_restart": not spot,
    }
    if spot:
        body.update(provisioning_model="SPOT", instance_termination_action=action)
    if max_run_s is not None:
        # The backstop's own grace (providers/deadline.py): an installed watchdog acts first, with
        # its log, its notification and its exact count; Compute Engine only when it is not there.
        seconds = min(max(deadline_seconds(max_run_s), MIN_RUN_SECONDS), MAX_RUN_SECONDS)
        body.update(max_run_duration={"seconds": seconds}, instance_termination_action=action)
    return body


def instance_body(*, name: str, zone: str, machine: MachineChoice, image: ImageChoice, disk_gb: int,
                  ssh_user: str, public_key: str, tags: Mapping[str, str], cluster: str, spot: bool,
                  shutdown: str, max_run_s: float | None,
                  service_account: str = DEFAULT_SERVICE_ACCOUNT, scopes: list[str] | None = None,
                  buckets: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The insert body. `service_account`: `default`, an email, or `none` (config gcp.service_account);
    `scopes`: its access scopes (default: compute only); `buckets`: the GCS buckets its account
    was bound to, kept in the instance's metadata so `down` finds their bindings."""
    instance_labels = labels(tags)
    metadata = [
        {"key": "ssh-keys", "value": f"{ssh_user}:{public_key.strip()}"},
        # Metadata keys are ignored where OS Login is on; this instance uses its own key.
        {"key": "enable-oslogin", "value": "FALSE"},
    ]
    if machine.gpu:
        metadata.append({"key": "install-nvidia-driver", "value": "True"})
    if buckets:
        metadata.append({"key": METADATA_BUCKETS, "value": " ".join(buckets)})
    body: dict[str, Any] = {
        "name": name,
        "machine_type": f"zones/{zone}/machineTypes/{machine.machine_type}",
        "labels": instance_labels,
        "tags": {"items": [network_tag(cluster)]},
        "metadata": {"items": metadata},
        "disks": [{
            "boot": True,
            "auto_delete": True,
            "initialize_params": {
                "source_image": image.source,
                "disk_size_gb": disk_gb,
                "disk_type": f"zones/{zone}/diskTypes/{DISK_TYPE}",
                "labels": instance_labels,
            },
        }],
        "network_interfaces": [{"network": NETWORK,
                                "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]}],
        "scheduling": scheduling(spot=spot, gpu=machine.gpu, shutdown=shutdown, max_run_s=max_run_s),
    }
    if service_account != NO_SERVICE_ACCOUNT:
        body["service_accounts"] = [{"email": service_account, "scopes": list(scopes or [COMPUTE_SCOPE])}]
    if machine.accelerator:
        body["guest_accelerators"] = [{"accelerator_type": f"zones/{zone}/acceleratorTypes/{machine.accelerator}",
                                       "accelerator_count": machine.count}]
    return body


def api_base(api_endpoint: str) -> str:
    """The URL in front of `/compute/v1/...` for a configured endpoint: the SDK takes a bare host
    (and then speaks https) as well as a URL."""
    base = api_endpoint.rstrip("/")
    return base if "://" in base else "https://" + base


def delete_action(api_endpoint: str, project: str, zone: str, name: str) -> dict[str, Any]:
    """The watchdog's delete of its own VM (docs/watchdog.md, the action contract): instances.delete
    on the configured endpoint with the VM's service-account token from the metadata server."""
    base = api_base(api_endpoint)
    return {"kind": "http", "effect": "delete", "method": "DELETE",
            "url": f"{base}/compute/v1/projects/{project}/zones/{zone}/instances/{name}",
            "token": {"url": METADATA_TOKEN_URL, "headers": {"Metadata-Flavor": "Google"}, "field": "access_token"},
            "ok": [200], "gone_ok": True}


def mark_action(api_endpoint: str, project: str, zone: str, name: str) -> dict[str, Any]:
    """The watchdog's renewal of its own VM's liveness label (docs/watchdog.md): instances.get for
    the labels and their fingerprint, then instances.setLabels with the mark set, with the VM's
    service-account token (the `compute` scope: `compute.readonly` cannot set labels). A 412 (the
    labels changed since the read) reads again."""
    url = f"{api_base(api_endpoint)}/compute/v1/projects/{project}/zones/{zone}/instances/{name}"
    return {"kind": "http-mark", "key": TAG_ALIVE, "get": url, "field": "labels", "fingerprint": "labelFingerprint",
            "method": "POST", "url": f"{url}/setLabels", "ok": [200], "retry": [412],
            "token": {"url": METADATA_TOKEN_URL, "headers": {"Metadata-Flavor": "Google"}, "field": "access_token"}}


def can_delete_itself(raw: Mapping[str, Any]) -> bool:
    """Whether an instance (JSON) runs as a service account whose scopes allow instances.delete."""
    return any(set(account.get("scopes") or ()) & DELETE_SCOPES for account in raw.get("serviceAccounts") or ())


def _metadata_items(raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((raw.get("metadata") or {}).get("items") or ())


def instance_buckets(raw: Mapping[str, Any]) -> set[str]:
    """The GCS buckets an instance's (JSON) service account was bound to at launch (its metadata)."""
    return {b for item in _metadata_items(raw) if item.get("key") == METADATA_BUCKETS
            for b in (item.get("value") or "").split()}


def metadata_with_buckets(raw: Mapping[str, Any], buckets: list[str]) -> list[dict[str, str]]:
    """An instance's (JSON) metadata items with `cloudtrain-buckets` set to `buckets` (gone if none)."""
    items = [{"key": item["key"], "value": item.get("value", "")} for item in _metadata_items(raw)
             if item.get("key") != METADATA_BUCKETS]
    return items + ([{"key": METADATA_BUCKETS, "value": " ".join(buckets)}] if buckets else [])


def can_use_storage(raw: Mapping[str, Any], write: bool) -> bool:
    """Whether an instance (JSON) runs as a service account whose scopes reach GCS (for writing)."""
    wanted = STORAGE_WRITE_SCOPES if write else STORAGE_WRITE_SCOPES | {STORAGE_READ_SCOPE}
    return any(set(account.get("scopes") or ()) & wanted for account in raw.get("serviceAccounts") or ())


def metadata_identity(name: str) -> dict[str, Any]:
    """How the on-node watchdog asks this is instance `name` before an OS power-off: GCE's metadata
    server (reached only from the VM itself) says the instance's name."""
    return {"url": "http://metadata.google.internal/computeMetadata/v1/instance/name",
            "headers": {"Metadata-Flavor": "Google"}, "expect": name}


# Our allow rules, and below them a deny for everything else. The `default` network comes with
# `default-allow-ssh` (tcp:22 from 0.0.0.0/0), `-rdp`, `-icmp` at priority 65534: rules add up, so an
# allow of our own restricts nothing. A deny at a lower number than theirs, aimed at our tag, does
# (lower number wins; the project's other instances are untouched).
ALLOW_PRIORITY = 1000
DENY_PRIORITY = 1100


def firewall_bodies(cluster: str, owner: str, cidr: str, nodes: int) -> dict[str, dict[str, Any]]:
    """The cluster's firewall rules by name: SSH (tcp:22) from one CIDR to the cluster's network
    tag; with several nodes also everything between the nodes (training talks on any port); and a
    deny of all other ingress to the tag that outranks the default network's open rules."""
    tag = network_tag(cluster)
    bodies = {firewall_name(cluster, "ssh"): {
        "name": firewall_name(cluster, "ssh"),
        "description": firewall_description(cluster, owner, "SSH from one address"),
        "network": NETWORK, "direction": "INGRESS", "priority": ALLOW_PRIORITY,
        "allowed": [{"I_p_protocol": "tcp", "ports": ["22"]}],
        "source_ranges": [cidr], "target_tags": [tag],
    }, firewall_name(cluster, "deny"): {
        "name": firewall_name(cluster, "deny"),
        "description": firewall_description(cluster, owner, "no other ingress: outranks default-allow-ssh"),
        "network": NETWORK, "direction": "INGRESS", "priority": DENY_PRIORITY,
        "denied": [{"I_p_protocol": "all"}],
        "source_ranges": ["0.0.0.0/0"], "target_tags": [tag],
    }}
    if nodes > 1:
        bodies[firewall_name(cluster, "internal")] = {
            "name": firewall_name(cluster, "internal"),
            "description": firewall_description(cluster, owner, "the cluster's nodes to each other"),
            "network": NETWORK, "direction": "INGRESS", "priority": ALLOW_PRIORITY,
            "allowed": [{"I_p_protocol": "all"}],
            "source_tags": [tag], "target_tags": [tag],
        }
    return bodies


# records -----------------------------------------------------------------------------------------


def instance_record(raw: Mapping[str, Any], zone: str) -> Instance:
    """An instance as Compute Engine's JSON has it (instances.get, aggregatedList) -> ours. Absent
    fields are absent (not the SDK's zero values); int64 fields (diskSizeGb) are strings. The login
    user: our label when it is not the default one."""
    labels_ = dict(raw.get("labels") or {})
    status = raw.get("status", "")
    public_ip = private_ip = None
    nics = raw.get("networkInterfaces") or []
    if nics:
        private_ip = nics[0].get("networkIP") or None
        public_ip = next((c["natIP"] for c in nics[0].get("accessConfigs") or () if c.get("natIP")), None)
    accelerators = [(last_part(a.get("acceleratorType", "")), int(a.get("acceleratorCount", 0)))
                    for a in raw.get("guestAccelerators") or ()]
    machine_type = raw.get("machineType", "")
    started = raw.get("lastStartTimestamp") or raw.get("creationTimestamp", "")
    return Instance(
        id=instance_id(zone, raw["name"]),
        cluster=labels_.get(TAG_CLUSTER, ""),
        incarnation=labels_.get(TAG_INCARNATION),
        alive_at=alive_of(labels_),
        expiry=expiry_of(labels_),
        state=STATES.get(status, InstanceState.UNKNOWN),
        instance_type=instance_type_name(last_part(machine_type), accelerators) if machine_type else None,
        region=region_of(zone),
        zone=zone,
        public_ip=public_ip,
        private_ip=private_ip,
        ssh_user=labels_.get(LABEL_SSH_USER, SSH_USER),
        launched_at=_timestamp(started),
        # For gc's price of a leak: spot is billed at the spot price, a stopped VM for its disks.
        spot=(raw.get("scheduling") or {}).get("provisioningModel") == "SPOT",
        disk_gb=sum(int(d.get("diskSizeGb") or 0) for d in raw.get("disks") or ()) or None,
        # When it entered its state, by GCE's clock (the ledger bills from it): the last start for
        # a running VM, the last stop for a stopped one.
        state_since=_timestamp(raw.get("lastStartTimestamp", "")) if status == "RUNNING"
        else _timestamp(raw.get("lastStopTimestamp", "")) if status in ("TERMINATED", "STOPPING", "SUSPENDED")
        else None,
    )


def _timestamp(value: str) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
