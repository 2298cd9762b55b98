"""GCP test kit: a wire-level fake of the Compute Engine REST API (v1), and `gcp_cloud`.

`GceServer` speaks plain HTTP on 127.0.0.1 (werkzeug, in a thread). The real SDK
(google-cloud-compute with `transport="rest"` and `client_options={"api_endpoint": server.url}`)
talks to it unchanged, and so does google-auth's real credential path: `server.env()` points
GOOGLE_APPLICATION_CREDENTIALS at a service-account key file the server generated (an RSA key
it knows the public half of), google-auth signs a self-signed JWT with it and the client sends
that as its bearer token. The fake verifies the signature and expiry; a key it does not know gets
401 `authError`, as a revoked key would. The key file names its own universe domain, so google-auth
skips its background lookup at Google's IAM Credentials API: nothing leaves the machine.

What it serves, in Compute Engine's JSON shapes (camelCase, int64 as strings, selfLinks):
projects.get, zones (list/get), machineTypes and acceleratorTypes (list/get/aggregatedList, with
realistic per-zone availability), images (get, getFromFamily, list; public DLVM and Ubuntu families
plus `create_image`), networks (`default`), instances (insert/get/list/aggregatedList/delete/
stop/start/setMetadata), disks (insert/get/list/aggregatedList/delete, with labels and `users`: boot disks
follow their instance, a disk in use refuses deletion with resourceInUseByAnotherResource),
firewalls (insert/get/list/patch/delete), zone and global operations (get and `wait`). `filter`
works as the API documents it: `(labels.k = "v") (labels.o:*)`, `!=`, and the regex form
`name eq "cloudtrain-.*"`.

A VM's own credentials (the on-node watchdog deleting its VM): an instance may run as a service
account (`serviceAccounts`: at most one, `default` resolved to the project's default compute
account as the API does, scopes as URLs). A token registered with `accept_metadata_token` (what
the fake metadata server, testing/metadata.py, hands out) is taken as that account's token. One
metadata server serves every VM of a test, so the token cannot say which VM asked: it stands for
the identity of the instance it acts on, and is allowed only requests naming one instance
(`instances.get/delete/stop/start/...`), when that instance runs as a service account whose scopes
cover the call (`compute` or `cloud-platform`; `compute.readonly` for reads). Otherwise 403, as
Compute Engine answers: `forbidden` (no service account: no permission) or `insufficientPermissions`
("Request had insufficient authentication scopes."). Requests record the bearer token and the
acting account (`GceRequest.bearer`, `.caller`).

It validates like the real API where cloudtrain could get it wrong: RFC 1035 names of at most 63
characters, label keys and values, a missing or unknown machineType, unknown zones and images, a
boot disk smaller than its image, GPUs attached to anything but N1 or without
`scheduling.onHostMaintenance: TERMINATE` (attached or built in), spot settings (SPOT cannot
restart automatically nor migrate; instanceTerminationAction STOP/DELETE), `maxRunDuration`
(30 s to 120 days, needs an instanceTerminationAction), firewall protocols, ports and CIDRs.
An ingress rule with no source is open to 0.0.0.0/0, as in GCP: `firewall_ranges_seen` records
every source range any allow rule ever had, so a test can say "never 0.0.0.0/0".

Time: operations end on the next request (`op_seconds=0`), instances are RUNNING when their insert
operation is DONE (`boot_seconds` to stay STAGING longer); `advance(seconds)` moves the fake's
clock, which is how `maxRunDuration` is enforced: a VM past it is stopped or deleted by its
termination action, as Compute Engine does. `preempt(zone, name)` reclaims a spot VM. Both are
listed in `terminations`, so a test can tell them from stops and deletes someone asked for.

Faults, per action and zone/region, delivered as Compute Engine delivers them: an HTTP error
(`errors[].reason`, e.g. quotaExceeded, forbidden) or an insert operation that ends DONE with
`error.errors[].code` (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED, ...; the instance is gone):

    gce_server.faults.add("ZONE_RESOURCE_POOL_EXHAUSTED", zones={"us-central1-a"})
    gce_server.faults.add("QUOTA_EXCEEDED", regions={"us-central1"}, times=1)
    gce_server.faults.add("forbidden", action="instances.insert")   # 403: a missing permission
    gate = gce_server.faults.hold("instances.insert", after=True)   # created; the answer waits
    gce_server.faults.count("instances.insert", zone="us-central1-a")

Actions are "<collection>.<method>" (instances.insert, firewalls.delete, zoneOperations.wait, ...),
or "write" (any POST/PATCH/DELETE) or "*". Machines: `machine_hooks` get ("boot" | "power_on" |
"power_off", instance) as the hypervisor would act; `gcp_cloud` boots an sshd VM per instance that
trusts the instance's `ssh-keys` metadata (unless OS Login is on) and routes its external IP there.

Fixtures: `gce_server` (a fresh server per test, with the environment pointing at it) and
`gcp_cloud` (a `FakeCloud`: recipes run by the real CLI against it, sshd VMs behind instances;
`gcp_cloud.metadata` is the VMs' metadata server and `gcp_cloud.watchdog_env()` points an on-node
watchdog at it and at the OS-shutdown stand-in, so autostop and budget stop or delete through the fake).
"""

from __future__ import annotations

import copy
import datetime
import fnmatch
import ipaddress
import json
import random
import re
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing.bill import FakeBill
from cloudtrain.testing.cloud import CloudMachines, FakeCloud, cluster_hint
from cloudtrain.testing.faults import Gate, RequestBook
from cloudtrain.testing.metadata import MetadataServer
from cloudtrain.testing.serving import serve, stop_serving
from cloudtrain.testing.sshd import SshdFactory

PROJECT = "cloudtrain-test"
SERVICE_ACCOUNT = f"cloudtrain-kit@{PROJECT}.iam.gserviceaccount.com"
PROJECT_NUMBER = "123"
DEFAULT_SERVICE_ACCOUNT = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"  # instances' "default"
SCOPE_PREFIX = "https://www.googleapis.com/auth/"
# Which access scopes let a token call a method (the account's roles decide the rest).
WRITE_SCOPES = frozenset({SCOPE_PREFIX + "compute", SCOPE_PREFIX + "cloud-platform"})
READ_SCOPES = WRITE_SCOPES | {SCOPE_PREFIX + "compute.readonly"}
UNIVERSE_DOMAIN = "cloudtrain.test"  # the kit's key files name it (see add_service_account)
API = "https://www.googleapis.com/compute/v1/"  # selfLinks look like the real ones
ZONES = {
    "us-central1": ("a", "b", "c", "f"), "us-east1": ("b", "c", "d"), "us-east4": ("a", "b", "c"),
    "us-west1": ("a", "b", "c"), "europe-west4": ("a", "b", "c"), "asia-east1": ("a", "b", "c"),
}
ALL_ZONES = tuple(f"{r}-{z}" for r, zs in ZONES.items() for z in zs)


def _zones(*names: str) -> frozenset[str]:
    return frozenset(names)


ACCELERATORS = {  # type -> (description, max per instance, zones)
    "nvidia-tesla-t4": ("NVIDIA T4", 4, _zones(
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-c", "us-east1-d", "us-east4-a",
        "us-east4-b", "us-east4-c", "us-west1-a", "us-west1-b", "europe-west4-a", "europe-west4-b", "europe-west4-c",
        "asia-east1-a", "asia-east1-c")),
    "nvidia-tesla-v100": ("NVIDIA V100", 8, _zones(
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-c", "us-west1-a", "us-west1-b",
        "europe-west4-a", "europe-west4-b", "europe-west4-c", "asia-east1-c")),
    "nvidia-tesla-p100": ("NVIDIA P100", 4, _zones(
        "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c", "us-west1-a", "us-west1-b", "europe-west4-a")),
    "nvidia-l4": ("NVIDIA L4", 8, _zones(
        "us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b", "us-east1-c", "us-east1-d", "us-east4-a",
        "us-east4-c", "us-west1-a", "us-west1-b", "us-west1-c", "europe-west4-a", "europe-west4-b", "europe-west4-c",
        "asia-east1-a", "asia-east1-b", "asia-east1-c")),
    "nvidia-tesla-a100": ("NVIDIA A100 40GB", 16, _zones(
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-west1-b",
        "europe-west4-a", "europe-west4-b", "asia-east1-c")),
    "nvidia-h100-80gb": ("NVIDIA H100 80GB", 8, _zones(
        "us-central1-a", "us-central1-c", "us-east4-a", "us-east4-b", "us-east4-c", "us-west1-a", "europe-west4-b",
        "europe-west4-c")),
    "nvidia-tesla-p4": ("NVIDIA P4", 4, _zones(
        "us-central1-a", "us-central1-c", "us-east4-a", "us-east4-b", "us-east4-c", 
        "europe-west4-b", "europe-west4-c", "asia-east1-a")),
    "nvidia-a100-80gb": ("NVIDIA A100 80GB", 8, _zones(
        "us-central1-a", "us-central1-c", "us-east4-c", "europe-west4-a")),
    "nvidia-h100-mega-80gb": ("NVIDIA H100 Mega 80GB", 8, _zones(
        "us-central1-a", "us-central1-c", "us-east4-a", "us-east4-b", "us-east4-c", "us-west1-a", "europe-west4-b",
        "europe-west4-c")),
    "nvidia-h200-141gb": ("NVIDIA H200 141GB", 8, _zones(
        "us-central1-b", "us-east4-b", "us-west1-c", "europe-west4-c")),
}
MACHINE_TYPES: dict[str, tuple[int, int, str | None, int]] = {  # name -> (vCPUs, memory MB, GPU built in, count)
    **{f"e2-standard-{n}": (n, 4096 * n, None, 0) for n in (2, 4, 8, 16)},
    **{f"n1-standard-{n}": (n, 3840 * n, None, 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)},
    **{f"n1-highmem-{n}": (n, 6656 * n, None, 0) for n in (2, 4, 8, 16, 32, 64, 96)},
    "g2-standard-4": (4, 16384, "nvidia-l4", 1), "g2-standard-8": (8, 32768, "nvidia-l4", 1),
    "g2-standard-12": (12, 49152, "nvidia-l4", 1), "g2-standard-24": (24, 98304, "nvidia-l4", 2),
    "a2-highgpu-1g": (12, 87040, "nvidia-tesla-a100", 1), "a2-highgpu-2g": (24, 174080, "nvidia-tesla-a100", 2),
    "a2-highgpu-4g": (48, 348160, "nvidia-tesla-a100", 4), "a2-highgpu-8g": (96, 696320, "nvidia-tesla-a100", 8),
    **{f"g2-standard-{n}": (n, 4096 * n, "nvidia-l4", g) for n, g in ((16, 1), (32, 1), (48, 4), (96, 8))},
    "a2-megagpu-16g": (96, 1392640, "nvidia-tesla-a100", 16),
    **{f"a2-ultragpu-{g}g": (12 * g, 174080 * g, "nvidia-a100-80gb", g) for g in (1, 2, 4, 8)},
    **{f"a3-highgpu-{g}g": (26 * g, 239616 * g, "nvidia-h100-80gb", g) for g in (1, 2, 4, 8)},
    "a3-megagpu-8g": (208, 1916928, "nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": (224, 3022848, "nvidia-h200-141gb", 8),
}
# Public images: (project, name) -> (family, disk GB). The families cloudtrain defaults to exist.
PUBLIC_IMAGES = {
    ("deeplearning-platform-release", "common-cu128-ubuntu-2204-nvidia-570-v20250612"):
        ("common-cu128-ubuntu-2204-nvidia-570", 50),
    ("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250612"): ("ubuntu-2204-lts", 10),
    ("debian-cloud", "debian-12-bookworm-v20250610"): ("debian-12", 10),
}
NAME_REGEX = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})"
_NAME = re.compile(rf"^{NAME_REGEX}$")
_DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced")
# A blank disk inserted without sizeGb gets its type's default size (as the API and gcloud document).
_BLANK_DISK_GB = {"pd-standard": 500, "pd-balanced": 100, "pd-ssd": 100, "pd-extreme": 1000,
                  "hyperdisk-balanced": 100}
MAX_DISK_GB = 65536
_PROTOCOLS = ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
MIN_RUN_S, MAX_RUN_S = 30, 120 * 24 * 3600
FAULT_DEFAULTS = {  # code -> (delivery "http" | "operation", HTTP status, message)
    "ZONE_RESOURCE_POOL_EXHAUSTED": ("operation", 503, "The zone '{zone_path}' does not have enough resources "
                                     "available to fulfill the request.  Try a different zone, or try again later."),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (
        "operation", 503, "The zone '{zone_path}' does not have enough resources available to fulfill the request.  "
        "'(resource type:compute)'."),
    "UNSUPPORTED_OPERATION": ("operation", 400, "The selected machine type ({machine}) has a required CPU platform "
                              "that is unavailable in zone {zone}."),
    "RESOURCE_NOT_READY": ("operation", 400, "The resource '{resource}' is not ready"),
    "RESOURCE_OPERATION_RATE_EXCEEDED": ("operation", 403, "Operation rate exceeded for resource '{resource}'. "
                                         "Too frequent operations from the source resource."),
    "insufficientCapacity": ("http", 503, "The zone '{zone_path}' does not have enough resources available to "
                             "fulfill the request."),
    "QUOTA_EXCEEDED": ("operation", 403, "Quota '{quota}' exceeded.  Limit: 0.0 in region {region}."),
    "quotaExceeded": ("http", 403, "Quota '{quota}' exceeded.  Limit: 0.0 in region {region}."),
    "forbidden": ("http", 403, "Required '{permission}' permission for '{resource}'"),
    "IAM_PERMISSION_DENIED": ("operation", 403, "Required '{permission}' permission for '{resource}'"),
    "authError": ("http", 401, "Request had invalid authentication credentials. Expected OAuth 2 access token, "
                  "login cookie or other valid authentication credential."),
    "VPC_NOT_FOUND": ("operation", 404, "The resource 'projects/{project}/global/networks/default' was not found"),
    "rateLimitExceeded": ("http", 403, "Rate Limit Exceeded"),
    "userRateLimitExceeded": ("http", 403, "User Rate Limit Exceeded"),
    "backendError": ("http", 503, "Internal error. Please try again or contact Google Support."),
}
GLOBAL_GPU_QUOTA_MESSAGE = "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
# The rules GCP creates with a project's `default` network (VPC docs, "Prepopulated rules in the
# default network"): SSH, RDP and ICMP open to the internet, everything within 10.128.0.0/9. All at
# priority 65534, above only the implied rules (deny all ingress, allow all egress, 65535).
DEFAULT_NETWORK_RULES = tuple({
    "name": f"default-allow-{what}", "description": description, "network": "global/networks/default",
    "direction": "INGRESS", "priority": 65534, "sourceRanges": [source], "allowed": allowed,
} for what, description, source, allowed in (
    ("internal", "Allow internal traffic on the default network", "10.128.0.0/9",
     [{"IPProtocol": "tcp", "ports": ["0-65535"]}, {"IPProtocol": "udp", "ports": ["0-65535"]}, {"IPProtocol": "icmp"}]),
    ("ssh", "Allow SSH from anywhere", "0.0.0.0/0", [{"IPProtocol": "tcp", "ports": ["22"]}]),
    ("rdp", "Allow RDP from anywhere", "0.0.0.0/0", [{"IPProtocol": "tcp", "ports": ["3389"]}]),
    ("icmp", "Allow ICMP from anywhere", "0.0.0.0/0", [{"IPProtocol": "icmp"}]),
))
DEFAULT_RULE_NAMES = frozenset(r["name"] for r in DEFAULT_NETWORK_RULES)


class GceError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


def _invalid(field_path: str, value: Any, why: str) -> GceError:
    return GceError(400, "invalid", f"Invalid value for field '{field_path}': '{value}'. {why}")


def _not_found(path: str) -> GceError:
    return GceError(404, "notFound", f"The resource '{path}' was not found")


@dataclass(frozen=True)
class GceRequest:
    method: str
    path: str
    action: str  # e.g. "instances.insert", "zoneOperations.wait"
    project: str
    zone: str | None
    region: str | None
    name: str | None
    body: Any = field(default=None, compare=False, hash=False, repr=False)
    caller: str = ""  # the service account acting (a VM's, for a metadata server token)
    bearer: str = field(default="", compare=False, hash=False, repr=False)  # the bearer token sent


@dataclass
class Fault:
    """Answer matching requests with `code` (None in a filter means any). `delivery`: "http" (the
    request fails), "operation" (accepted, then its operation ends DONE with the error) or "reply"
    (the request is carried out, then answered with the HTTP error: a 503 from a frontend after the
    backend acted, which a retry must survive); None means how Compute Engine delivers that code
    (FAULT_DEFAULTS)."""

    code: str
    action: str = "instances.insert"
    zones: frozenset[str] | None = None
    regions: frozenset[str] | None = None
    message: str | None = None
    status: int | None = None
    delivery: str | None = None
    times: int | None = None
    when: Callable[[GceRequest], bool] | None = None
    hits: int = 0

    @property
    def how(self) -> tuple[str, int]:
        default = FAULT_DEFAULTS.get(self.code, ("http" if self.code[:1].islower() else "operation", 400, ""))
        return self.delivery or default[0], self.status or default[1]

    def matches(self, request: GceRequest) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if not _action_matches(self.action, request):
            return False
        if self.zones is not None and request.zone not in self.zones:
            return False
        if self.regions is not None and request.region not in self.regions:
            return False
        return self.when is None or self.when(request)


def _action_matches(pattern: str, request: GceRequest) -> bool:
    if pattern == "*":
        return True
    if pattern == "write":
        return request.method in ("POST", "PATCH", "DELETE", "PUT") and not request.action.endswith(".wait")
    return pattern == request.action


class Faults(RequestBook[GceRequest, Fault]):
    def __init__(self) -> None:
        super().__init__(_action_matches)

    def add(self, code: str, *, action: str = "instances.insert", zones: Iterable[str] | None = None,
            regions: Iterable[str] | None = None, message: str | None = None, status: int | None = None,
            delivery: str | None = None, times: int | None = None,
            when: Callable[[GceRequest], bool] | None = None) -> Fault:
        return self.add_fault(Fault(code, action, frozenset(zones) if zones is not None else None,
                                    frozenset(regions) if regions is not None else None, message, status, delivery,
                                    times, when))

    def count(self, action: str, *, zone: str | None = None, region: str | None = None) -> int:
        return len(self.matching(action, lambda r: zone in (None, r.zone) and region in (None, r.region)))

    def seen(self, action: str) -> list[GceRequest]:
        """The requests of `action` so far (with their JSON bodies), oldest first."""
        return self.matching(action)


@dataclass
class _Op:
    project: str
    name: str
    zone: str | None
    kind: str
    target: str
    finish_at: float
    on_done: Callable[[], None] | None = None
    error: GceError | None = None  # the operation ends DONE with this error
    code: str | None = None
    on_error: Callable[[], None] | None = None
    status: str = "RUNNING"
    inserted: str = ""
    ended: str = ""


@dataclass
class _Account:
    email: str
    key_id: str
    public_pem: str


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def _fingerprint() -> str:
    return uuid.uuid4().hex[:12]


class FakeGce:
    """The state and the WSGI app. Resources are kept as the API returns them (JSON dicts)."""

    def __init__(self, *, op_seconds: float = 0.0, boot_seconds: float = 0.0, wait_seconds: float = 2.0,
                 require_auth: bool = True) -> None:
        self.project = PROJECT
        self.op_seconds, self.boot_seconds, self.wait_seconds = op_seconds, boot_seconds, wait_seconds
        self.require_auth = require_auth
        self.accounts: dict[str, _Account] = {}  # key id -> account
        self.metadata_tokens: set[str] = set()  # VMs' service-account tokens (from a metadata server)
        # Service accounts of the project an instance may run as (the launcher may act as them).
        self.project_service_accounts: set[str] = {DEFAULT_SERVICE_ACCOUNT, SERVICE_ACCOUNT}
        self.project_metadata: dict[str, str] = {}  # commonInstanceMetadata (e.g. enable-oslogin)
        self.images: dict[tuple[str, str], dict[str, Any]] = {}
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name)
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.networks: dict[str, dict[str, Any]] = {"default": self._network("default")}
        # Called (under the lock) after every request that may change who can reach what.
        self.network_hooks: list[Callable[[], None]] = []
        self.ops: dict[str, _Op] = {}
        self.request_ids: dict[str, str] = {}
        self.firewall_ranges_seen: set[str] = set()
        # (zone, name, "maxRunDuration" | "preemption"): what Compute Engine ended by itself, no call asked.
        self.terminations: list[tuple[str, str, str]] = []
        self.faults = Faults()
        self.machine_hooks: list[Callable[[str, dict[str, Any]], None]] = []
        self.hook_errors: list[str] = []
        self.lock = threading.RLock()
        self._offset = 0.0
        self._meta: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> boot_at, booted, run_start
        self._ips: set[str] = set()
        self._next_internal = 2
        for (project, name), (family, size) in PUBLIC_IMAGES.items():
            self.create_image(name, family=family, disk_gb=size, project=project)
        for body in DEFAULT_NETWORK_RULES:
            self.firewalls[body["name"]] = self._check_firewall(body, None)

    # clock --------------------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock (operations, boots, maxRunDuration) forward, then settle."""
        with self.lock:
            self._offset += seconds
            self._tick()

    # WSGI ---------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        gate = None
        try:
            status, body, gate = self._handle(request)
        except GceError as exc:
            status, body = exc.status, exc.body()
        if gate is not None:
            gate.park()
        return Response(json.dumps(body), status=status, mimetype="application/json")(environ, start_response)

    def _handle(self, request: Any) -> tuple[int, Any, Gate | None]:
        parts = [p for p in request.path.split("/") if p]
        if parts[:2] not in (["compute", "v1"], ["compute", "beta"]) or len(parts) < 4 or parts[2] != "projects":
            raise GceError(404, "notFound", f"no route for {request.method} {request.path}")
        project, rest = parts[3], tuple(parts[4:])
        email, bearer = self._authenticate(request) if self.require_auth else (SERVICE_ACCOUNT, "")
        try:
            body = json.loads(request.get_data() or b"null")
        except ValueError:
            raise GceError(400, "parseError", "This API does not support parsing form-encoded input.") from None
        action, zone, name = _classify(request.method, rest)
        gce_request = GceRequest(request.method, request.path, action, project, zone,
                                 zone.rsplit("-", 1)[0] if zone else None, name, body, email or "", bearer)
        denied = None
        if email is None:  # a VM's token from the metadata server: the instance it acts on decides
            with self.lock:
                self._tick()
                caller, denied = self._authorize_metadata_token(gce_request)
            gce_request = replace(gce_request, caller=caller)
        fault, gate = self.faults.record_and_match(gce_request)
        if denied is not None:
            raise denied
        if gate is not None and not gate.after:
            gate.park()
            gate = None
        with self.lock:
            self._tick()
            if fault is not None and fault.how[0] == "http":
                raise self._fault_error(fault, gce_request)
            request_id = request.args.get("requestId") if request.method != "GET" else None
            if request_id and request_id in self.request_ids:
                # A repeated request: Compute Engine answers with the first one's operation.
                status, out = 200, self.ops[self.request_ids[request_id]]
            else:
                status, out = self._route(gce_request, rest, dict(request.args), gce_request.caller,
                                          fault if fault is not None and fault.how[0] == "operation" else None)
                if request_id and isinstance(out, _Op):
                    self.request_ids[request_id] = out.name
            if fault is not None and fault.how[0] == "reply":
                raise self._fault_error(fault, gce_request)  # done, but the caller hears an error
            if request.method != "GET" or action.endswith(".wait"):
                self._network_changed()
        if action.endswith(".wait") and isinstance(out, _Op):
            out = self._wait(out)
            with self.lock:
                self._network_changed()
        if isinstance(out, _Op):
            out = self._op_json(out)
        return status, out, gate

    def _authenticate(self, request: Any) -> tuple[str | None, str]:
        """(the service account's email, the bearer token); email None: a metadata server token."""
        from google.auth import jwt

        header = request.headers.get("Authorization", "")
        denied = GceError(401, "authError", FAULT_DEFAULTS["authError"][2])
        if not header.startswith("Bearer "):
            raise denied
        token = header.removeprefix("Bearer ").strip()
        with self.lock:
            if token in self.metadata_tokens:
                return None, token
        try:
            key_id = jwt.decode_header(token).get("kid", "")
            account = self.accounts[key_id]
            claims = jwt.decode(token, certs={key_id: account.public_pem}, verify=True)
        except Exception:  # noqa: BLE001 - any unreadable, unknown, expired or forged token
            raise denied from None
        if claims.get("iss") != account.email:
            raise denied
        return account.email, token

    def accept_metadata_token(self, token: str) -> None:
        """Take `token` (e.g. `MetadataServer.token_for("gce")`) as the VMs' service-account token:
        allowed on one instance at a time, as that instance's own account (see the module docstring)."""
        with self.lock:
            self.metadata_tokens.add(token)

    def forget_metadata_token(self, token: str) -> None:
        with self.lock:
            self.metadata_tokens.discard(token)

    def _authorize_metadata_token(self, request: GceRequest) -> tuple[str, GceError | None]:
        """(the service account acting, None), or (it or "", the 403 Compute Engine would answer)."""
        permission = f"compute.{request.action}"
        resource = f"projects/{request.project}" + (f"/zones/{request.zone}" if request.zone else "") + (
            f"/instances/{request.name}" if request.name else "")
        forbidden = GceError(403, "forbidden", f"Required '{permission}' permission for '{resource}'")
        if not (request.action.startswith("instances.") and request.zone and request.name):
            return "", forbidden  # not one instance: no VM's identity to act as
        inst = self.instances.get((request.zone, request.name)) if request.project == self.project else None
        if inst is None:
            return "", None  # the route answers 404, as to a caller with rights on the project
        accounts = inst.get("serviceAccounts") or []
        if not accounts:
            return "", forbidden
        account = accounts[0]
        needed = READ_SCOPES if request.method == "GET" else WRITE_SCOPES
        if not set(account.get("scopes", [])) & needed:
            return account["email"], GceError(403, "insufficientPermissions",
                                              "Request had insufficient authentication scopes.")
        return account["email"], None

    def _fault_error(self, fault: Fault, request: GceRequest) -> GceError:
        return GceError(fault.how[1], fault.code, self._fault_message(fault, request))

    def _fault_message(self, fault: Fault, request: GceRequest) -> str:
        body = request.body or {}
        machine = _last(body.get("machineType", ""))
        gpus = [a for a in body.get("guestAccelerators", [])] or (
            [{"acceleratorType": MACHINE_TYPES[machine][2]}] if MACHINE_TYPES.get(machine, (0, 0, None))[2] else [])
        quota = (_last(gpus[0]["acceleratorType"]).upper().replace("-", "_").replace("NVIDIA_TESLA_", "NVIDIA_")
                 + "_GPUS") if gpus else "CPUS"
        verb = {"insert": "create", "aggregatedList": "list"}.get(request.action.split(".")[-1],
                                                                request.action.split(".")[-1])
        collection = request.action.split(".")[0]
        name = request.name or body.get("name")
        resource = (f"projects/{request.project}" + (f"/zones/{request.zone}" if request.zone else "/global")
                    + f"/{collection}" + (f"/{name}" if name else ""))
        template = fault.message or FAULT_DEFAULTS.get(fault.code, ("", 0, fault.code))[2]
        if fault.message and "{" not in fault.message:
            return fault.message
        return template.format(zone=request.zone or "", zone_path=f"projects/{request.project}/zones/{request.zone}",
                               region=request.region or "", machine=machine, quota=quota, project=request.project,
                               permission=f"compute.{collection}.{verb}", resource=resource)

    # operations ---------------------------------------------------------------------------------

    def _op(self, project: str, zone: str | None, kind: str, target: str, on_done: Callable[[], None] | None = None,
            *, fault: Fault | None = None, request: GceRequest | None = None,
            on_error: Callable[[], None] | None = None) -> _Op:
        op = _Op(project, f"operation-{int(self.now() * 1000)}-{uuid.uuid4().hex[:12]}", zone, kind, target,
                 time.monotonic() + self.op_seconds, on_done, inserted=_rfc3339(self.now()))
        if fault is not None and request is not None:
            op.error, op.code, op.on_error = self._fault_error(fault, request), fault.code, on_error
        self.ops[op.name] = op
        return op

    def _op_json(self, op: _Op) -> dict[str, Any]:
        scope = f"projects/{op.project}/zones/{op.zone}" if op.zone else f"projects/{op.project}/global"
        body: dict[str, Any] = {
            "kind": "compute#operation", "id": str(abs(hash(op.name)) % 10**19), "name": op.name,
            "operationType": op.kind, "targetLink": API + op.target, "status": op.status, "user": SERVICE_ACCOUNT,
            "progress": 100 if op.status == "DONE" else 0, "insertTime": op.inserted, "startTime": op.inserted,
            "selfLink": f"{API}{scope}/operations/{op.name}",
        }
        if op.zone:
            body["zone"] = f"{API}projects/{op.project}/zones/{op.zone}"
        if op.status == "DONE":
            body["endTime"] = op.ended
            if op.error is not None:
                body["error"] = {"errors": [{"code": op.code, "message": op.error.message}]}
                body["httpErrorStatusCode"] = op.error.status
                body["httpErrorMessage"] = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT FOUND",
                                            503: "SERVICE UNAVAILABLE"}.get(op.error.status, "BAD REQUEST")
        return body

    def _wait(self, op: _Op) -> _Op:
        """zoneOperations.wait: until DONE, or `wait_seconds` (then RUNNING, as the API may)."""
        deadline = time.monotonic() + self.wait_seconds
        while True:
            with self.lock:
                self._tick()
                if op.status == "DONE" or time.monotonic() >= deadline:
                    return op
            time.sleep(0.01)

    def _tick(self) -> None:
        mono, now = time.monotonic(), self.now()
        for op in list(self.ops.values()):
            if op.status != "DONE" and op.finish_at <= mono:
                op.status, op.ended = "DONE", _rfc3339(now)
                callback = op.on_error if op.error is not None else op.on_done
                if callback is not None:
                    callback()
        for key, inst in list(self.instances.items()):
            meta = self._meta[key]
            if inst["status"] == "STAGING" and meta.get("boot_at") is not None and meta["boot_at"] <= now:
                self._running(key)
            limit = inst["scheduling"].get("maxRunDuration")
            if inst["status"] == "RUNNING" and limit and now - meta["run_start"] >= int(limit["seconds"]):
                self._terminate_by_action(key, "maxRunDuration")

    # machines -----------------------------------------------------------------------------------

    def _hook(self, event: str, inst: dict[str, Any]) -> None:
        for hook in list(self.machine_hooks):
            try:
                hook(event, inst)
            except Exception as exc:  # noqa: BLE001 - reported to the test, never to the client
                self.hook_errors.append(f"{event} {inst['name']}: {type(exc).__name__}: {exc}")

    def _running(self, key: tuple[str, str]) -> None:
        inst, meta = self.instances[key], self._meta[key]
        inst["status"] = "RUNNING"
        meta["run_start"] = self.now()
        first = not meta.get("booted")
        meta["booted"] = True
        self._hook("boot" if first else "power_on", inst)

    def _start_machine(self, key: tuple[str, str]) -> None:
        """The instance gets an ephemeral external IP and boots (STAGING, then RUNNING)."""
        inst, meta = self.instances[key], self._meta[key]
        for config in inst["networkInterfaces"][0].get("accessConfigs", []):
            config["natIP"] = self._new_ip()
        inst["lastStartTimestamp"] = _rfc3339(self.now())
        inst["status"] = "STAGING"
        meta["boot_at"] = self.now() + self.boot_seconds
        if self.boot_seconds <= 0:
            self._running(key)

    def _stop_machine(self, key: tuple[str, str]) -> None:
        inst = self.instances[key]
        was_running = inst["status"] in ("RUNNING", "STOPPING")
        inst["status"] = "TERMINATED"
        inst["lastStopTimestamp"] = _rfc3339(self.now())
        for config in inst["networkInterfaces"][0].get("accessConfigs", []):
            self._ips.discard(config.pop("natIP", ""))
        if was_running:
            self._hook("power_off", inst)

    def _delete_machine(self, key: tuple[str, str]) -> None:
        inst = self.instances.pop(key, None)
        self._meta.pop(key, None)
        if inst is None:
            return
        for config in inst["networkInterfaces"][0].get("accessConfigs", []):
            self._ips.discard(config.get("natIP", ""))
        for disk in inst.get("disks", []):
            disk_key = (key[0], _last(disk["source"]))
            if disk.get("autoDelete"):
                self.disks.pop(disk_key, None)
            elif disk_key in self.disks:
                self.disks[disk_key]["users"] = []
        self._hook("power_off", inst)

    def _terminate_by_action(self, key: tuple[str, str], why: str) -> None:
        action = self.instances[key]["scheduling"].get("instanceTerminationAction", "STOP")
        self.terminations.append((key[0], key[1], why))
        (self._delete_machine if action == "DELETE" else self._stop_machine)(key)

    def _new_ip(self) -> str:
        while True:
            address = f"34.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
            if address not in self._ips:
                self._ips.add(address)
                return address

    # routing ------------------------------------------------------------------------------------

    def _route(self, request: GceRequest, rest: tuple[str, ...], args: dict[str, str], email: str,
               fault: Fault | None) -> tuple[int, Any]:
        project, method = request.project, request.method
        if len(rest) >= 3 and rest[:2] == ("global", "images"):
            return 200, self._image_get(project, rest[2:])
        if rest[:2] == ("global", "images"):
            images = [i for (p, _), i in self.images.items() if p == project]
            return 200, self._list(project, "compute#imageList", images, args)
        if project != self.project:
            raise _not_found(f"projects/{project}")
        if rest == ():
            return 200, {"kind": "compute#project", "name": project, "id": "4815162342",
                         "commonInstanceMetadata": {"items": [{"key": k, "value": v}
                                                              for k, v in self.project_metadata.items()]},
                         "defaultServiceAccount": DEFAULT_SERVICE_ACCOUNT,
                         "selfLink": f"{API}projects/{project}"}
        if rest[0] == "aggregated" and len(rest) == 2:
            return 200, self._aggregated(project, rest[1], args)
        if rest[0] == "zones":
            return self._zonal(request, rest, args, fault)
        if rest[:2] == ("global", "operations") and len(rest) >= 3:
            return 200, self._operation(rest[2], None)
        if rest[:2] == ("global", "networks"):
            if len(rest) == 2:
                return 200, self._list(project, "compute#networkList", list(self.networks.values()), args)
            if rest[2] not in self.networks:
                raise _not_found(f"projects/{project}/global/networks/{rest[2]}")
            return 200, self.networks[rest[2]]
        if rest[:2] == ("global", "firewalls"):
            return self._firewall_route(request, rest[2] if len(rest) > 2 else None, args, fault)
        raise GceError(404, "notFound", f"no route for {method} {request.path}")

    def _zonal(self, request: GceRequest, rest: tuple[str, ...], args: dict[str, str],
               fault: Fault | None) -> tuple[int, Any]:
        project, method = request.project, request.method
        if len(rest) == 1:
            return 200, self._list(project, "compute#zoneList", [self._zone(z) for z in ALL_ZONES], args)
        zone = rest[1]
        if zone not in ALL_ZONES:
            raise _not_found(f"projects/{project}/zones/{zone}")
        if len(rest) == 2:
            return 200, self._zone(zone)
        kind, name = rest[2], (rest[3] if len(rest) > 3 else None)
        if kind == "operations" and name:
            return 200, self._operation(name, zone)
        if kind == "disks" and method == "POST" and len(rest) == 3:
            return 200, self._disk_insert(request, zone, request.body or {}, fault)
        if kind == "disks" and method == "DELETE" and len(rest) == 4 and name:
            return 200, self._disk_delete(request, zone, name, fault)
        if kind in ("machineTypes", "acceleratorTypes", "disks"):
            items = {"machineTypes": self._machine_types, "acceleratorTypes": self._accelerator_types,
                     "disks": self._disks}[kind](zone)
            if name is None:
                return 200, self._list(project, f"compute#{kind[:-1]}List", items, args)
            found = next((i for i in items if i["name"] == name), None)
            if found is None:
                raise _not_found(f"projects/{project}/zones/{zone}/{kind}/{name}")
            return 200, found
        if kind != "instances":
            raise GceError(404, "notFound", f"no route for {method} {request.path}")
        if name is None:
            if method == "POST":
                return 200, self._insert(request, zone, request.body or {}, args, fault)
            return 200, self._list(project, "compute#instanceList",
                                   [i for (z, _), i in self.instances.items() if z == zone], args)
        key = (zone, name)
        if key not in self.instances:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        verb = rest[4] if len(rest) > 4 else None
        if method == "GET" and verb is None:
            return 200, self.instances[key]
        if method == "DELETE" and verb is None:
            return 200, self._delete(key, fault, request)
        if method == "POST" and verb in ("stop", "start"):
            return 200, (self._stop(key, fault, request) if verb == "stop" else self._start(key, fault, request))
        if method == "POST" and verb == "setMetadata":
            return 200, self._set_metadata(key, request.body or {}, request)
        if method == "POST" and verb == "setLabels":
            return 200, self._set_labels(key, request.body or {}, request)
        raise GceError(404, "notFound", f"no route for {method} {request.path}")

    def _operation(self, name: str, zone: str | None) -> _Op:
        op = self.ops.get(name)
        if op is None or op.zone != zone:
            where = f"zones/{zone}" if zone else "global"
            raise _not_found(f"projects/{self.project}/{where}/operations/{name}")
        return op

    # catalog resources --------------------------------------------------------------------------

    def _zone(self, zone: str) -> dict[str, Any]:
        region = zone.rsplit("-", 1)[0]
        return {"kind": "compute#zone", "id": str(2000 + ALL_ZONES.index(zone)), "name": zone, "status": "UP",
                "description": zone, "region": f"{API}projects/{self.project}/regions/{region}",
                "selfLink": f"{API}projects/{self.project}/zones/{zone}"}

    def _machine_types(self, zone: str) -> list[dict[str, Any]]:
        found = []
        for name, (cpus, memory, gpu, count) in MACHINE_TYPES.items():
            if gpu and zone not in ACCELERATORS[gpu][2]:
                continue
            item = {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name, "zone": zone,
                    "description": f"{cpus} vCPUs, {memory / 1024:g} GB RAM", "guestCpus": cpus, "memoryMb": memory,
                    "isSharedCpu": False, "maximumPersistentDisks": 128,
                    "selfLink": f"{API}projects/{self.project}/zones/{zone}/machineTypes/{name}"}
            if gpu:
                item["accelerators"] = [{"guestAcceleratorType": gpu, "guestAcceleratorCount": count}]
            found.append(item)
        return found

    def _accelerator_types(self, zone: str) -> list[dict[str, Any]]:
        return [{"kind": "compute#acceleratorType", "id": str(abs(hash(name)) % 10**12), "name": name,
                 "description": description, "maximumCardsPerInstance": most,
                 "zone": f"{API}projects/{self.project}/zones/{zone}",
                 "selfLink": f"{API}projects/{self.project}/zones/{zone}/acceleratorTypes/{name}"}
                for name, (description, most, zones) in ACCELERATORS.items() if zone in zones]

    def _disks(self, zone: str) -> list[dict[str, Any]]:
        return [d for (z, _), d in self.disks.items() if z == zone]

    def _image_get(self, project: str, rest: tuple[str, ...]) -> dict[str, Any]:
        if rest[0] == "family" and len(rest) == 2:
            matching = [i for (p, _), i in self.images.items() if p == project and i.get("family") == rest[1]]
            if not matching:
                raise _not_found(f"projects/{project}/global/images/family/{rest[1]}")
            return max(matching, key=lambda i: i["creationTimestamp"])
        image = self.images.get((project, rest[0])) if len(rest) == 1 else None
        if image is None:
            raise _not_found(f"projects/{project}/global/images/{'/'.join(rest)}")
        return image

    def _aggregated(self, project: str, kind: str, args: dict[str, str]) -> dict[str, Any]:
        per_zone = {"instances": lambda z: [i for (iz, _), i in self.instances.items() if iz == z],
                    "machineTypes": self._machine_types, "acceleratorTypes": self._accelerator_types,
                    "disks": self._disks}.get(kind)
        if per_zone is None:
            raise GceError(404, "notFound", f"no aggregated list of {kind}")
        expression = args.get("filter", "")
        items = {}
        for zone in ALL_ZONES:
            found = [i for i in per_zone(zone) if _matches(i, expression)]
            scope = f"zones/{zone}"
            items[scope] = {kind: found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{scope}' on this page.",
                "data": [{"key": "scope", "value": scope}]}}
        return {"kind": f"compute#{kind[:-1]}AggregatedList", "id": f"projects/{project}/aggregated/{kind}",
                "items": items, "selfLink": f"{API}projects/{project}/aggregated/{kind}"}

    def _list(self, project: str, kind: str, items: list[dict[str, Any]], args: dict[str, str]) -> dict[str, Any]:
        found = [i for i in items if _matches(i, args.get("filter", ""))]
        found.sort(key=lambda i: i.get("name", ""))
        start = int(args.get("pageToken") or 0)
        size = int(args.get("maxResults") or 500)
        page = found[start:start + size]
        body: dict[str, Any] = {"kind": kind, "id": f"projects/{project}", "selfLink": f"{API}projects/{project}"}
        if page:
            body["items"] = page
        if start + size < len(found):
            body["nextPageToken"] = str(start + size)
        return body

    @staticmethod
    def _network(name: str) -> dict[str, Any]:
        return {"kind": "compute#network", "id": str(abs(hash(name)) % 10**12), "name": name,
                "autoCreateSubnetworks": True, "routingConfig": {"routingMode": "REGIONAL"},
                "selfLink": f"{API}projects/{PROJECT}/global/networks/{name}"}

    # instances ----------------------------------------------------------------------------------

    def _insert(self, request: GceRequest, zone: str, body: dict[str, Any], args: dict[str, str],
                fault: Fault | None) -> _Op:
        project = request.project
        name = body.get("name", "")
        _check_name("resource.name", name)
        machine, gpus = self._check_machine(zone, body)
        image, disk_gb = self._check_disks(zone, body, name)
        network = self._check_network_interfaces(body)
        _check_labels("resource.labels", body.get("labels") or {})
        for tag in (body.get("tags") or {}).get("items", []):
            _check_name("resource.tags.items", tag)
        scheduling = _check_scheduling(body.get("scheduling") or {}, gpus)
        service_accounts = self._check_service_accounts(body.get("serviceAccounts") or [])
        if (zone, name) in self.instances:
            raise GceError(409, "alreadyExists", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                           "already exists")
        if (zone, name) in self.disks:
            raise GceError(409, "alreadyExists", f"The resource 'projects/{project}/zones/{zone}/disks/{name}' "
                           "already exists")
        key = (zone, name)
        path = f"projects/{project}/zones/{zone}/instances/{name}"
        self._next_internal += 1
        internal = str(ipaddress.ip_address("10.128.0.0") + self._next_internal)
        access = [{"kind": "compute#accessConfig", "type": c.get("type", "ONE_TO_ONE_NAT"),
                   "name": c.get("name", "External NAT"), "networkTier": c.get("networkTier", "PREMIUM")}
                  for c in body["networkInterfaces"][0].get("accessConfigs", [])]
        init = body["disks"][0].get("initializeParams") or {}
        disk_type = _last(init.get("diskType", "")) or "pd-standard"
        self.disks[(zone, name)] = {
            "kind": "compute#disk", "id": str(random.randint(10**17, 10**18)), "name": name, "sizeGb": str(disk_gb),
            "zone": f"{API}projects/{project}/zones/{zone}", "status": "READY", "sourceImage": API + image,
            "type": f"{API}projects/{project}/zones/{zone}/diskTypes/{disk_type}", "labels": init.get("labels", {}),
            "users": [API + path], "selfLink": f"{API}projects/{project}/zones/{zone}/disks/{name}",
            "creationTimestamp": _rfc3339(self.now())}
        self.instances[key] = {
            "kind": "compute#instance", "id": str(random.randint(10**18, 10**19 - 1)),
            "creationTimestamp": _rfc3339(self.now()), "name": name, "description": body.get("description", ""),
            "tags": {"items": list((body.get("tags") or {}).get("items", [])), "fingerprint": _fingerprint()},
            "machineType": f"{API}projects/{project}/zones/{zone}/machineTypes/{machine}", "status": "PROVISIONING",
            "zone": f"{API}projects/{project}/zones/{zone}", "canIpForward": False,
            "networkInterfaces": [{"kind": "compute#networkInterface", "name": "nic0", "fingerprint": _fingerprint(),
                                   "network": f"{API}projects/{project}/global/networks/{network}",
                                   "subnetwork": f"{API}projects/{project}/regions/{request.region}/subnetworks/"
                                                 "default",
                                   "networkIP": internal, "accessConfigs": access}],
            "disks": [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "index": 0,
                       "source": f"{API}projects/{project}/zones/{zone}/disks/{name}", "deviceName": name,
                       "boot": True, "autoDelete": bool(body["disks"][0].get("autoDelete", False)),
                       "interface": "SCSI", "diskSizeGb": str(disk_gb)}],
            "metadata": {"kind": "compute#metadata", "fingerprint": _fingerprint(),
                         "items": list((body.get("metadata") or {}).get("items", []))},
            "scheduling": scheduling, "labels": dict(body.get("labels") or {}), "labelFingerprint": _fingerprint(),
            "guestAccelerators": [{"acceleratorType": f"{API}projects/{project}/zones/{zone}/acceleratorTypes/{t}",
                                   "acceleratorCount": n} for t, n in gpus if body.get("guestAccelerators")],
            "cpuPlatform": "Intel Broadwell", "startRestricted": False, "deletionProtection": False,
            "fingerprint": _fingerprint(), "selfLink": API + path,
        }
        if not self.instances[key]["guestAccelerators"]:
            del self.instances[key]["guestAccelerators"]
        if service_accounts:
            self.instances[key]["serviceAccounts"] = service_accounts
        self._meta[key] = {"booted": False, "run_start": self.now()}
        return self._op(project, zone, "insert", path, lambda: self._start_machine(key),
                        fault=fault, request=request, on_error=lambda: self._delete_machine(key))

    def _check_machine(self, zone: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, int]]]:
        value = body.get("machineType")
        if not value:
            raise GceError(400, "required", "Required field 'resource.machineType' not specified")
        match = re.match(r"^(?:.*/)?zones/([^/]+)/machineTypes/([^/]+)$", value)
        if not match:
            raise _invalid("resource.machineType", value, "Must be a URL to a machine type resource "
                           "(zones/ZONE/machineTypes/TYPE).")
        if match.group(1) != zone:
            raise _invalid("resource.machineType", value, f"Machine type must be in zone {zone}.")
        machine = match.group(2)
        if machine not in {m["name"] for m in self._machine_types(zone)}:
            raise _invalid("resource.machineType", value,
                           f"Machine type with name '{machine}' does not exist in zone '{zone}'.")
        built_in = MACHINE_TYPES[machine][2]
        gpus = [(built_in, MACHINE_TYPES[machine][3])] if built_in else []
        for index, accelerator in enumerate(body.get("guestAccelerators") or []):
            where = f"resource.guestAccelerators[{index}].acceleratorType"
            ref = accelerator.get("acceleratorType", "")
            found = re.match(r"^(?:.*/)?zones/([^/]+)/acceleratorTypes/([^/]+)$", ref)
            sold = {a["name"] for a in self._accelerator_types(zone)}
            if not found or found.group(1) != zone or found.group(2) not in sold:
                raise _invalid(where, ref, f"Accelerator type '{_last(ref)}' is not available in zone '{zone}'.")
            if not machine.startswith("n1-"):
                raise _invalid(where, ref, f"Machine type '{machine}' does not support attaching accelerators of type "
                               f"'{found.group(2)}'. Use an N1 machine type, or an accelerator-optimized one alone.")
            count = int(accelerator.get("acceleratorCount") or 0)
            if not 1 <= count <= ACCELERATORS[found.group(2)][1]:
                raise _invalid(f"resource.guestAccelerators[{index}].acceleratorCount", count,
                               f"Must be between 1 and {ACCELERATORS[found.group(2)][1]}.")
            gpus.append((found.group(2), count))
        return machine, gpus

    def _check_disks(self, zone: str, body: dict[str, Any], name: str) -> tuple[str, int]:
        disks = body.get("disks") or []
        boot = [d for d in disks if d.get("boot")]
        if len(disks) != 1 or len(boot) != 1:
            raise _invalid("resource.disks", "", "Exactly one boot disk must be specified (in this fake, no other).")
        init = boot[0].get("initializeParams") or {}
        source = init.get("sourceImage", "")
        if not source:
            raise GceError(400, "required", "Required field 'resource.disks[0].initializeParams.sourceImage' not "
                           "specified")
        image_path, image = self._source_image("resource.disks[0].initializeParams.sourceImage", source)
        image_gb = int(image["diskSizeGb"])
        size = int(init.get("diskSizeGb") or image_gb)
        if size < image_gb:
            raise _invalid("resource.disks[0].initializeParams.diskSizeGb", size,
                           f"Requested disk size cannot be smaller than the image size ({image_gb} GB)")
        disk_type = init.get("diskType")
        known = rf"^(?:.*/)?zones/{re.escape(zone)}/diskTypes/({'|'.join(_DISK_TYPES)})$"
        if disk_type and not re.match(known, disk_type):
            raise _invalid("resource.disks[0].initializeParams.diskType", disk_type, "Unknown disk type for this zone.")
        _check_labels("resource.disks[0].initializeParams.labels", init.get("labels") or {})
        return image_path, size

    def _check_service_accounts(self, accounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """At most one; `default` is the project's default compute account (the API stores its
        email); the launcher must be able to act as it; scopes are full URLs."""
        if len(accounts) > 1:
            raise _invalid("resource.serviceAccounts", len(accounts), "At most one service account may be "
                           "specified per instance.")
        out = []
        for account in accounts:
            email = account.get("email") or ""
            email = DEFAULT_SERVICE_ACCOUNT if email == "default" else email
            if email not in self.project_service_accounts:
                raise GceError(400, "invalid", f"The user does not have access to service account '{email}'.  User: "
                               f"'{SERVICE_ACCOUNT}'.  Ask a project owner to grant you the iam.serviceAccountUser "
                               "role on the service account")
            scopes = list(account.get("scopes") or [])
            for index, scope in enumerate(scopes):
                if not str(scope).startswith(SCOPE_PREFIX):
                    raise _invalid(f"resource.serviceAccounts[0].scopes[{index}]", scope, "Must be an OAuth2 scope "
                                   f"URL such as {SCOPE_PREFIX}compute.")
            out.append({"email": email, "scopes": scopes})
        return out

    def _check_network_interfaces(self, body: dict[str, Any]) -> str:
        nics = body.get("networkInterfaces") or []
        if not nics:
            raise _invalid("resource.networkInterfaces", "", "At least one network interface is required.")
        network = _last(nics[0].get("network", "global/networks/default"))
        if network not in self.networks:
            raise _not_found(f"projects/{self.project}/global/networks/{network}")
        return network

    def _delete(self, key: tuple[str, str], fault: Fault | None, request: GceRequest) -> _Op:
        inst = self.instances[key]
        inst["status"] = "STOPPING"
        return self._op(request.project, key[0], "delete", inst["selfLink"].removeprefix(API),
                        lambda: self._delete_machine(key), fault=fault, request=request)

    def _stop(self, key: tuple[str, str], fault: Fault | None, request: GceRequest) -> _Op:
        inst = self.instances[key]
        before = inst["status"]
        if before in ("PROVISIONING", "STAGING", "RUNNING"):
            inst["status"] = "STOPPING"
        return self._op(request.project, key[0], "stop", inst["selfLink"].removeprefix(API),
                        (lambda: self._stop_machine(key)) if before != "TERMINATED" else None, fault=fault,
                        request=request, on_error=lambda: inst.__setitem__("status", before))

    def _start(self, key: tuple[str, str], fault: Fault | None, request: GceRequest) -> _Op:
        inst = self.instances[key]
        if inst["status"] == "TERMINATED":
            inst["status"] = "PROVISIONING"
            on_done: Callable[[], None] | None = lambda: self._start_machine(key)
        else:
            on_done = None  # already running (or on its way): nothing to do
        return self._op(request.project, key[0], "start", inst["selfLink"].removeprefix(API), on_done,
                        fault=fault, request=request, on_error=lambda: inst.__setitem__("status", "TERMINATED"))

    def _set_metadata(self, key: tuple[str, str], body: dict[str, Any], request: GceRequest) -> _Op:
        """instances.setMetadata: the whole item list, guarded by the fingerprint read before (a
        stale or missing one is 412 conditionNotMet, as Compute Engine answers)."""
        inst = self.instances[key]
        if body.get("fingerprint") != inst["metadata"]["fingerprint"]:
            raise GceError(412, "conditionNotMet", "Supplied fingerprint does not match current metadata fingerprint.")
        items = list(body.get("items") or [])
        for index, item in enumerate(items):
            if not isinstance(item, dict) or not item.get("key"):
                raise _invalid(f"metadata.items[{index}].key", item, "Required field 'key' not specified")
        inst["metadata"] = {"kind": "compute#metadata", "fingerprint": _fingerprint(), "items": items}
        return self._op(request.project, key[0], "setMetadata", inst["selfLink"].removeprefix(API))

    def _set_labels(self, key: tuple[str, str], body: dict[str, Any], request: GceRequest) -> _Op:
        """instances.setLabels: the whole label map, guarded by the labelFingerprint read before (a
        stale or missing one is 412 conditionNotMet); keys and values as labels allow."""
        inst = self.instances[key]
        if body.get("labelFingerprint") != inst["labelFingerprint"]:
            raise GceError(412, "conditionNotMet", "Labels fingerprint either invalid or resource labels have changed")
        labels = dict(body.get("labels") or {})
        for name, value in labels.items():
            if not re.match(r"^[a-z][a-z0-9_-]{0,62}$", str(name)) or not re.match(r"^[a-z0-9_-]{0,63}$", str(value)):
                raise _invalid(f"labels.{name}", value, "Invalid label key or value")
        inst["labels"], inst["labelFingerprint"] = labels, _fingerprint()
        return self._op(request.project, key[0], "setLabels", inst["selfLink"].removeprefix(API))

    # disks --------------------------------------------------------------------------------------

    def _disk_insert(self, request: GceRequest, zone: str, body: dict[str, Any], fault: Fault | None) -> _Op:
        """disks.insert: a blank disk (sizeGb, else its type's default) or one from `sourceImage`,
        CREATING until its operation is DONE, then READY; attached to nothing (no `users`)."""
        project = request.project
        name = body.get("name", "")
        _check_name("resource.name", name)
        known = rf"^(?:.*/)?zones/{re.escape(zone)}/diskTypes/({'|'.join(_DISK_TYPES)})$"
        if body.get("type") and not re.match(known, body["type"]):
            raise _invalid("resource.type", body["type"], "Unknown disk type for this zone.")
        disk_type = _last(body.get("type") or "pd-standard")
        image_path, image_gb = None, 0
        if body.get("sourceImage"):
            image_path, image = self._source_image("resource.sourceImage", body["sourceImage"])
            image_gb = int(image["diskSizeGb"])
        try:
            size = int(body.get("sizeGb") or image_gb or _BLANK_DISK_GB[disk_type])
        except ValueError:
            raise _invalid("resource.sizeGb", body.get("sizeGb"), "Must be an integer.") from None
        if not max(1, image_gb) <= size <= MAX_DISK_GB:
            raise _invalid("resource.sizeGb", size, f"Must be between {max(1, image_gb)} and {MAX_DISK_GB} GB "
                           "(at least the source image's size).")
        _check_labels("resource.labels", body.get("labels") or {})
        key = (zone, name)
        path = f"projects/{project}/zones/{zone}/disks/{name}"
        if key in self.disks:
            raise GceError(409, "alreadyExists", f"The resource '{path}' already exists")
        disk = {"kind": "compute#disk", "id": str(random.randint(10**17, 10**18)), "name": name,
                "description": body.get("description", ""), "sizeGb": str(size),
                "zone": f"{API}projects/{project}/zones/{zone}", "status": "CREATING",
                "type": f"{API}projects/{project}/zones/{zone}/diskTypes/{disk_type}",
                "labels": dict(body.get("labels") or {}), "labelFingerprint": _fingerprint(),
                "selfLink": API + path, "creationTimestamp": _rfc3339(self.now())}
        if image_path:
            disk["sourceImage"] = API + image_path
        self.disks[key] = disk
        return self._op(project, zone, "insert", path, lambda: disk.update(status="READY"),
                        fault=fault, request=request, on_error=lambda: self.disks.pop(key, None))

    def _disk_delete(self, request: GceRequest, zone: str, name: str, fault: Fault | None) -> _Op:
        """disks.delete: refused while an instance uses the disk (400, as Compute Engine answers);
        else DELETING until its operation is DONE, then gone."""
        project = request.project
        key = (zone, name)
        path = f"projects/{project}/zones/{zone}/disks/{name}"
        disk = self.disks.get(key)
        if disk is None:
            raise _not_found(path)
        if disk.get("users"):
            raise GceError(400, "resourceInUseByAnotherResource", f"The disk resource '{path}' is already being used "
                           f"by '{str(disk['users'][0]).removeprefix(API)}'")
        before = disk["status"]
        disk["status"] = "DELETING"
        return self._op(project, zone, "delete", path, lambda: self.disks.pop(key, None), fault=fault,
                        request=request, on_error=lambda: disk.__setitem__("status", before))

    def _source_image(self, field_path: str, source: str) -> tuple[str, dict[str, Any]]:
        """(projects/P/global/images/NAME, the image) of an image URL or family URL; 400 or 404 otherwise."""
        path = re.sub(r"^https?://[^/]+/compute/(v1|beta)/", "", source)
        match = re.match(r"^projects/([^/]+)/global/images/(.+)$", path)
        if not match:
            raise _invalid(field_path, source, "Must be an image URL.")
        image = self._image_get(match.group(1), tuple(match.group(2).split("/")))
        return f"projects/{match.group(1)}/global/images/{image['name']}", image

    # firewalls ----------------------------------------------------------------------------------

    def _firewall_route(self, request: GceRequest, name: str | None, args: dict[str, str],
                        fault: Fault | None) -> tuple[int, Any]:
        project, method, body = request.project, request.method, request.body or {}
        if name is None:
            if method == "POST":
                rule = self._check_firewall(body, None)
                if rule["name"] in self.firewalls:
                    raise GceError(409, "alreadyExists",
                                   f"The resource 'projects/{project}/global/firewalls/{rule['name']}' already exists")
                path = f"projects/{project}/global/firewalls/{rule['name']}"
                self.firewalls[rule["name"]] = rule
                if rule.get("allowed"):  # what was ever let in (a deny from 0.0.0.0/0 opens nothing)
                    self.firewall_ranges_seen.update(rule.get("sourceRanges", []))
                return 200, self._op(project, None, "insert", path, fault=fault, request=request)
            return 200, self._list(project, "compute#firewallList", list(self.firewalls.values()), args)
        if name not in self.firewalls:
            raise _not_found(f"projects/{project}/global/firewalls/{name}")
        path = f"projects/{project}/global/firewalls/{name}"
        if method == "GET":
            return 200, self.firewalls[name]
        if method == "DELETE":
            del self.firewalls[name]
            return 200, self._op(project, None, "delete", path, fault=fault, request=request)
        if method == "PATCH":
            merged = {**self.firewalls[name], **body, "name": name}
            if "sourceRanges" in body and "sourceTags" not in body:
                merged.pop("sourceTags", None)
            rule = self._check_firewall(merged, self.firewalls[name])
            self.firewalls[name] = rule
            if rule.get("allowed"):
                self.firewall_ranges_seen.update(rule.get("sourceRanges", []))
            return 200, self._op(project, None, "patch", path, fault=fault, request=request)
        raise GceError(404, "notFound", f"no route for {method} {request.path}")

    def _check_firewall(self, body: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
        name = body.get("name", "")
        _check_name("resource.name", name)
        network = _last(body.get("network", "global/networks/default"))
        if network not in self.networks:
            raise _not_found(f"projects/{self.project}/global/networks/{network}")
        direction = body.get("direction", "INGRESS")
        if direction not in ("INGRESS", "EGRESS"):
            raise _invalid("resource.direction", direction, "Must be INGRESS or EGRESS.")
        allowed, denied = body.get("allowed") or [], body.get("denied") or []
        if bool(allowed) == bool(denied):
            raise _invalid("resource.allowed", "", "Exactly one of 'allowed' or 'denied' must be specified.")
        for index, rule in enumerate(allowed or denied):
            protocol = str(rule.get("IPProtocol", "")).lower()
            if protocol not in _PROTOCOLS and not protocol.isdigit():
                raise _invalid(f"resource.allowed[{index}].IPProtocol", protocol, "Unknown protocol.")
            for port in rule.get("ports", []):
                if protocol not in ("tcp", "udp", "sctp", "all") or not re.match(r"^\d{1,5}(-\d{1,5})?$", str(port)):
                    raise _invalid(f"resource.allowed[{index}].ports", port, "Ports apply to tcp, udp and sctp only, "
                                   "as PORT or PORT-PORT.")
        for cidr in body.get("sourceRanges", []):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise _invalid("resource.sourceRanges", cidr, "Must be a valid IPv4 or IPv6 CIDR.") from None
        for tag in [*body.get("targetTags", []), *body.get("sourceTags", [])]:
            _check_name("resource.targetTags", tag)
        priority = int(body.get("priority", 1000))
        if not 0 <= priority <= 65535:
            raise _invalid("resource.priority", priority, "Must be between 0 and 65535.")
        if len(body.get("description", "")) > 2048:
            raise _invalid("resource.description", "...", "Must be at most 2048 characters.")
        if "labels" in body:
            raise GceError(400, "badRequest", "Invalid JSON payload received. Unknown name \"labels\" at 'resource': "
                           "Cannot find field.")
        rule = {key: value for key, value in body.items() if key not in ("id", "kind", "selfLink", "creationTimestamp")}
        if direction == "INGRESS" and not (body.get("sourceRanges") or body.get("sourceTags")
                                           or body.get("sourceServiceAccounts")):
            rule["sourceRanges"] = ["0.0.0.0/0"]  # GCP's default for an ingress rule without a source
        rule.update(kind="compute#firewall", network=f"{API}projects/{self.project}/global/networks/{network}",
                    direction=direction, priority=priority, disabled=bool(body.get("disabled", False)),
                    id=(existing or {}).get("id") or str(random.randint(10**17, 10**18)),
                    creationTimestamp=(existing or {}).get("creationTimestamp") or _rfc3339(self.now()),
                    selfLink=f"{API}projects/{self.project}/global/firewalls/{name}")
        return rule

    # who can reach an instance ---------------------------------------------------------------------

    @property
    def added_firewalls(self) -> dict[str, dict[str, Any]]:
        """The firewall rules someone created (the default network's own left out)."""
        with self.lock:
            return {n: r for n, r in self.firewalls.items() if n not in DEFAULT_RULE_NAMES}

    def ingress_rules(self, zone: str, name: str) -> list[dict[str, Any]]:
        """The enabled INGRESS rules of the instance's network that apply to it (no target, or a
        target tag it carries) and admit traffic from outside by address, in the route map's rule
        format (cloudtrain.testing.route); every other source falls to the implied deny. Rules that
        name sources by tag or service account concern the network's own instances only."""
        with self.lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                return []
            network = _last(inst["networkInterfaces"][0]["network"])
            tags = set((inst.get("tags") or {}).get("items", []))
            found = []
            for rule in self.firewalls.values():
                if (rule["direction"] != "INGRESS" or rule.get("disabled") or _last(rule["network"]) != network
                        or (rule.get("targetTags") and not tags & set(rule["targetTags"]))
                        or not rule.get("sourceRanges")):
                    continue
                entries, action = (rule["allowed"], "allow") if rule.get("allowed") else (rule["denied"], "deny")
                for entry in entries:
                    protocol = str(entry.get("IPProtocol", "")).lower()
                    if protocol in ("tcp", "all"):  # SSH is TCP
                        found.append({"name": rule["name"], "priority": rule["priority"], "action": action,
                                      "sources": list(rule["sourceRanges"]), "ports": list(entry.get("ports", []))})
            return found

    def _network_changed(self) -> None:
        for hook in list(self.network_hooks):
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - reported to the test, never to the client
                self.hook_errors.append(f"network: {type(exc).__name__}: {exc}")

    # helpers for tests --------------------------------------------------------------------------

    def create_image(self, name: str, *, family: str | None = None, labels: dict[str, str] | None = None,
                     disk_gb: int = 10, project: str = PROJECT) -> str:
        """An image (in the test project unless `project`), optionally in `family`, with labels such
        as `cloudtrain-ssh-user`. Returns its path `projects/P/global/images/NAME`."""
        _check_name("resource.name", name)
        _check_labels("resource.labels", labels or {})
        with self.lock:
            self.images[(project, name)] = {
                "kind": "compute#image", "id": str(random.randint(10**17, 10**18)), "name": name,
                "creationTimestamp": _rfc3339(time.time() + len(self.images) * 1e-3), "status": "READY",
                "diskSizeGb": str(disk_gb), "labels": dict(labels or {}), "sourceType": "RAW",
                "selfLink": f"{API}projects/{project}/global/images/{name}", **({"family": family} if family else {})}
        return f"projects/{project}/global/images/{name}"

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """A copy of the instance's JSON now (None when there is no such instance)."""
        with self.lock:
            self._tick()
            return copy.deepcopy(self.instances.get((zone, name)))

    def find_instances(self, expression: str = "") -> list[tuple[str, dict[str, Any]]]:
        """(zone, a copy of the instance JSON) of every instance matching a list filter, e.g.
        'labels.k = "v"'."""
        with self.lock:
            self._tick()
            return [(z, copy.deepcopy(i)) for (z, _), i in self.instances.items() if _matches(i, expression)]

    def settle(self) -> None:
        """Finish every operation and boot now."""
        with self.lock:
            for op in self.ops.values():
                op.finish_at = 0.0
            for meta in self._meta.values():
                if meta.get("boot_at") is not None:
                    meta["boot_at"] = min(meta["boot_at"], self.now())
            self._tick()

    def preempt(self, zone: str, name: str) -> None:
        """Reclaim a spot VM: its instanceTerminationAction stops (TERMINATED) or deletes it."""
        with self.lock:
            inst = self.instances[(zone, name)]
            if inst["scheduling"].get("provisioningModel") != "SPOT":
                raise ValueError(f"{name} is not a spot VM")
            self._terminate_by_action((zone, name), "preemption")

    def authorized_keys(self, inst: dict[str, Any]) -> list[str]:
        """The public keys the guest agent would install from `ssh-keys` metadata (none with OS Login)."""
        items = {i["key"]: i.get("value", "") for i in inst.get("metadata", {}).get("items", [])}
        oslogin = items.get("enable-oslogin", self.project_metadata.get("enable-oslogin", "FALSE"))
        if oslogin.upper() == "TRUE":
            return []
        lines = items.get("ssh-keys", "").splitlines() + self.project_metadata.get("ssh-keys", "").splitlines()
        return [line.split(":", 1)[1].strip() for line in lines if ":" in line]

    def add_service_account(self, path: Path, email: str = SERVICE_ACCOUNT, *, known: bool = True) -> Path:
        """Write a service-account key file (a fresh RSA key) at `path`; `known`: the fake accepts it."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = uuid.uuid4().hex
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "type": "service_account", "project_id": self.project, "private_key_id": key_id, "private_key": private,
            "client_email": email, "client_id": str(random.randint(10**20, 10**21)),
            # Never used: with a scope, google-auth signs its own JWT and asks no token endpoint.
            "token_uri": "https://oauth2.googleapis.com/token",
            # Outside googleapis.com's universe google-auth skips its background call to Google's
            # IAM Credentials API (the regional access boundary lookup): the kit stays offline.
            "universe_domain": UNIVERSE_DOMAIN}))
        path.chmod(0o600)
        if known:
            with self.lock:
                self.accounts[key_id] = _Account(email, key_id, public)
        return path


def _classify(method: str, rest: tuple[str, ...]) -> tuple[str, str | None, str | None]:
    """(action, zone, resource name) of a request path below projects/P."""
    verbs = {"GET": "get", "DELETE": "delete", "PATCH": "patch", "POST": "insert", "PUT": "update"}
    if not rest:
        return "projects.get", None, None
    if rest[0] == "aggregated" and len(rest) > 1:
        return f"{rest[1]}.aggregatedList", None, None
    if rest[0] == "zones":
        if len(rest) <= 2:
            return f"zones.{'list' if len(rest) == 1 else 'get'}", rest[1] if len(rest) > 1 else None, None
        zone, kind = rest[1], rest[2]
        if kind == "operations":
            return f"zoneOperations.{'wait' if rest[-1] == 'wait' else 'get'}", zone, rest[3] if len(rest) > 3 else None
        if len(rest) == 3:
            return f"{kind}.{'insert' if method == 'POST' else 'list'}", zone, None
        if len(rest) >= 5:
            return f"{kind}.{rest[4]}", zone, rest[3]
        return f"{kind}.{verbs.get(method, method.lower())}", zone, rest[3]
    if rest[0] == "global" and len(rest) >= 2:
        kind = {"operations": "globalOperations"}.get(rest[1], rest[1])
        if rest[1] == "operations":
            return f"{kind}.{'wait' if rest[-1] == 'wait' else 'get'}", None, rest[2] if len(rest) > 2 else None
        if rest[1] == "images" and len(rest) == 4 and rest[2] == "family":
            return "images.getFromFamily", None, rest[3]
        if len(rest) == 2:
            return f"{kind}.{'insert' if method == 'POST' else 'list'}", None, None
        return f"{kind}.{verbs.get(method, method.lower())}", None, rest[2]
    return f"{rest[0]}.{verbs.get(method, method.lower())}", None, None


def _check_name(field_path: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise _invalid(field_path, name, f"Must be a match of regex '{NAME_REGEX}'")


def _label_chars_ok(text: str) -> bool:
    return all(c in "_-" or c.isdigit() or (c.isalpha() and not c.isupper()) for c in text)


def _check_labels(field_path: str, labels: dict[str, str]) -> None:
    if len(labels) > 64:
        raise _invalid(field_path, "", "At most 64 labels are allowed.")
    for key, value in labels.items():
        if not (1 <= len(key) <= 63 and key[0].isalpha() and not key[0].isupper() and _label_chars_ok(key)):
            raise _invalid(field_path, "", f"Label key '{key}' violates format constraints. The key must start with a "
                           "lowercase character, can only contain lowercase letters, numeric characters, underscores "
                           "and dashes. The key can be at most 63 characters long. International characters are "
                           "allowed.")
        if not (isinstance(value, str) and len(value) <= 63 and _label_chars_ok(value)):
            raise _invalid(field_path, "", f"Label value '{value}' violates format constraints. The value can only "
                           "contain lowercase letters, numeric characters, underscores and dashes. The value can be at "
                           "most 63 characters long. International characters are allowed.")


def _check_scheduling(body: dict[str, Any], gpus: list[tuple[str, int]]) -> dict[str, Any]:
    """Validate scheduling as Compute Engine does and return it with the API's defaults filled in."""
    where = "resource.scheduling"
    model = body.get("provisioningModel", "SPOT" if body.get("preemptible") else "STANDARD")
    if model not in ("STANDARD", "SPOT"):
        raise _invalid(f"{where}.provisioningModel", model, "Must be STANDARD or SPOT.")
    spot = model == "SPOT"
    on_host = body.get("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
    if on_host not in ("MIGRATE", "TERMINATE"):
        raise _invalid(f"{where}.onHostMaintenance", on_host, "Must be MIGRATE or TERMINATE.")
    restart = body.get("automaticRestart", not spot)
    if spot and restart:
        raise _invalid(f"{where}.automaticRestart", "true",
                       "Spot and preemptible VMs cannot be automatically restarted.")
    if spot and on_host != "TERMINATE":
        raise _invalid(f"{where}.onHostMaintenance", on_host,
                       "Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.")
    if gpus and on_host != "TERMINATE":
        raise _invalid(f"{where}.onHostMaintenance", on_host,
                       "Instances with guest accelerators do not support live migration.")
    action = body.get("instanceTerminationAction")
    if action not in (None, "STOP", "DELETE"):
        raise _invalid(f"{where}.instanceTerminationAction", action, "Must be STOP or DELETE.")
    out = {**body, "provisioningModel": model, "onHostMaintenance": on_host, "automaticRestart": bool(restart),
           "preemptible": spot or bool(body.get("preemptible"))}
    if spot:
        out.setdefault("instanceTerminationAction", "STOP")
    limit = body.get("maxRunDuration")
    if limit is not None:
        try:
            seconds = int(limit.get("seconds", 0))
        except (TypeError, ValueError, AttributeError):
            raise _invalid(f"{where}.maxRunDuration.seconds", limit, "Must be an integer.") from None
        if not MIN_RUN_S <= seconds <= MAX_RUN_S:
            raise _invalid(f"{where}.maxRunDuration.seconds", seconds,
                           f"Must be between {MIN_RUN_S} and {MAX_RUN_S} seconds.")
        if action is None:
            raise _invalid(f"{where}.instanceTerminationAction", "",
                           "instanceTerminationAction must be specified when maxRunDuration is set.")
        out["maxRunDuration"] = {"seconds": str(seconds), **({"nanos": limit["nanos"]} if limit.get("nanos") else {})}
    return out


_TERM = re.compile(r"^\s*(?P<field>[A-Za-z_][\w.-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*(?P<value>.*?)\s*$")


def _matches(item: dict[str, Any], expression: str) -> bool:
    """A Compute Engine list filter: `(a = "x") (b:*)` or `a != x` (AND), or the regex form
    `name eq "re"` / `(a eq re) (b ne re)`. Mixing the two forms, or OR, is refused (400)."""
    expression = (expression or "").strip()
    if not expression:
        return True
    terms = re.findall(r"\(([^()]*)\)", expression) if expression.startswith("(") else [expression]
    rest = re.sub(r"\([^()]*\)", "", expression).replace("AND", "").strip() if expression.startswith("(") else ""
    if rest or not terms:
        raise GceError(400, "invalid", f"Invalid list filter expression '{expression}'.")
    parsed = [_TERM.match(term) for term in terms]
    if any(p is None for p in parsed):
        raise GceError(400, "invalid", f"Invalid list filter expression '{expression}'.")
    regex_form = {p.group("op") in ("eq", "ne") for p in parsed if p}
    if len(regex_form) > 1:
        raise GceError(400, "invalid", f"Invalid list filter expression '{expression}': cannot mix eq/ne with =, != "
                       "or :.")
    return all(_term(item, p.group("field"), p.group("op"), p.group("value")) for p in parsed if p)


def _term(item: dict[str, Any], path: str, op: str, raw: str) -> bool:
    value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" else raw
    current: Any = item
    for part in path.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    present = current is not None
    text = "" if current is None else (str(current).lower() if isinstance(current, bool) else str(current))
    if op == ":":
        return present if value == "*" else present and fnmatch.fnmatchcase(text, value)
    if op == "=":
        return present and text == value
    if op == "!=":
        return text != value
    matched = re.fullmatch(value, text) is not None
    return matched if op == "eq" else not matched


def _last(url: str) -> str:
    return str(url).rstrip("/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------------- the server and fixtures


class GceServer(FakeGce):
    """FakeGce served over HTTP on 127.0.0.1 by werkzeug, in a thread."""

    def __init__(self, directory: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.directory = directory
        self.key_file = directory / "service-account.json"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> GceServer:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None

        self.directory.mkdir(parents=True, exist_ok=True)
        self.add_service_account(self.key_file)
        self._server = make_server("127.0.0.1", 0, self, threaded=True, request_handler=Quiet)
        self._thread = serve(self._server, "fake-gce")
        return self

    def stop(self) -> None:
        self.faults.clear()
        stop_serving(self._server, self._thread)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def env(self) -> dict[str, str]:
        """google-auth's real default chain finds the fake's service account key; no GCE probe."""
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file), "NO_GCE_CHECK": "true",
                "CLOUDSDK_CONFIG": str(self.directory / "gcloud")}

    def config(self, region: str | None = None) -> dict[str, str]:
        """The `gcp:` section of cloudtrain's config.yaml that points at this server."""
        section = {"project": self.project, "api_endpoint": self.url}
        if region:
            section["region"] = region
        return section

    def client(self, kind: str) -> Any:
        """A real SDK client of this server, e.g. "instances", "firewalls", "zone_operations",
        with the kit's own service account (requests counted and faulted like cloudtrain's)."""
        from google.cloud import compute_v1
        from google.oauth2 import service_account

        credentials = service_account.Credentials.from_service_account_file(
            str(self.key_file), scopes=["https://www.googleapis.com/auth/cloud-platform"])
        name = "".join(part.title() for part in kind.split("_")) + "Client"
        return getattr(compute_v1, name)(credentials=credentials, transport="rest",
                                         client_options={"api_endpoint": self.url})


# Variables that would send google-auth or gcloud to a real account or change their defaults.
_GCP_VARS_TO_CLEAR = (
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_COMPUTE_REGION", "CLOUDSDK_COMPUTE_ZONE", "GOOGLE_CLOUD_QUOTA_PROJECT", "GCE_METADATA_HOST",
    "GCE_METADATA_IP", "GOOGLE_API_USE_CLIENT_CERTIFICATE", "GOOGLE_CLOUD_UNIVERSE_DOMAIN",
)


@pytest.fixture
def gce_server(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[GceServer]:
    """A fresh fake Compute Engine per test (`GceServer`), with google-auth in this test (and in
    every subprocess it starts) pointed at the server's own service-account key and your gcloud
    settings hidden. `gce_server.config(region)` is the `gcp:` config section; `client(kind)` a
    real SDK client; `faults` injects errors (see the module docstring)."""
    server = GceServer(tmp_path_factory.mktemp("gce")).start()
    for name in _GCP_VARS_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.stop()


FAULT_KINDS = {  # GcpCloud.fail(kind): (code, action, message)
    "capacity": ("ZONE_RESOURCE_POOL_EXHAUSTED", "instances.insert", None),  # a DONE operation: next zone
    "quota": ("QUOTA_EXCEEDED", "instances.insert", None),  # the region's quota: next region
    "global-quota": ("QUOTA_EXCEEDED", "instances.insert", GLOBAL_GPU_QUOTA_MESSAGE),  # all of GCP
    "permission": ("forbidden", "instances.insert", None),  # 403 on the create: stop at once
    "auth": ("forbidden", "*", None),  # every call refused
}


class GcpCloud(FakeCloud):
    """`cloud: gcp` against the fake Compute Engine, for one test (see the `gcp_cloud` fixture).

    server      this test's GceServer; `faults` is its injector (add, count, hold, seen)
    machines    CloudMachines: `vm(zone, name)` is the sshd VM behind an instance
    image       an image (in the test project) whose `cloudtrain-ssh-user` label is the VMs' user
    metadata    the VMs' metadata server (a MetadataServer, given or started here): Compute Engine
                takes its token as the VMs' service accounts' (FakeGce.accept_metadata_token).
                `watchdog_env()` points a watchdog at it and at the OS-shutdown stand-in, so
                autostop and budget stop (OS shutdown) or delete (API call) instances through the fake.
    """

    name = "gcp"
    machine_fields = ("region", "zone", "instance_type", "accelerators", "cpus", "memory", "spot", "disk_gb")
    region = "us-central1"
    allowed_cidr = "203.0.113.7/32"  # TEST-NET-3: the "caller's address" the firewall admits
    instance_type = "e2-standard-2"

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, server: GceServer, machines: CloudMachines,
                 *, hint: str = "t", metadata: MetadataServer | None = None) -> None:
        self.server = server
        self.faults = server.faults
        self.machines = machines
        self._own_metadata = metadata is None
        self.metadata = metadata if metadata is not None else MetadataServer().start()
        server.accept_metadata_token(self.metadata.token_for("gce"))
        self.image = server.create_image(f"kit-vm-{uuid.uuid4().hex[:6]}", family="cloudtrain-kit",
                                         labels={"cloudtrain-ssh-user": machines.user})
        # Every watchdog action goes to the fake (the VMs are sshd processes on the test machine).
        super().__init__(root, monkeypatch, env={**server.env(), **self.watchdog_env()}, hint=hint,
                         config={"ssh": {"proxy_command": machines.proxy_command, "allowed_cidr": self.allowed_cidr},
                                 "gcp": server.config(self.region)})
        self.move_caller(self.allowed_cidr.split("/")[0], reconfigure=False)
        # What Compute Engine would bill, from the fake's own machine events (cloudtrain/testing/bill.py).
        self.bill = FakeBill("gcp")
        server.machine_hooks.append(self._observe)
        server.network_hooks.append(self._follow_rules)

    def move_caller(self, address: str, *, reconfigure: bool = True) -> None:
        """The test's connections now come from `address` (the firewall sees this source); with
        `reconfigure`, cloudtrain's config says so too (`ssh.allowed_cidr`), as a laptop moving
        from home to the office finds its new address."""
        self.machines.factory.set_source(address)
        if reconfigure:
            self.allowed_cidr = f"{address}/32"
            self.configure(ssh={"allowed_cidr": self.allowed_cidr})

    def _follow_rules(self) -> None:
        """Every instance's external address gets the rules that apply to it, evaluated for every
        SSH connection the kit routes there (cloudtrain.testing.route)."""
        for (zone, name), inst in list(self.server.instances.items()):
            for config in inst["networkInterfaces"][0].get("accessConfigs", []):
                if config.get("natIP"):
                    self.machines.factory.set_ingress(config["natIP"], self.server.ingress_rules(zone, name))

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        """`{cloud: gcp, instance_type: e2-standard-2, image: <the kit's image>}`: no region, so the
        plan starts in the cheapest (ties: the config's us-central1) and fails over."""
        resources: dict[str, Any] = {"cloud": "gcp", "image": self.image}
        if not {"instance_type", "accelerators", "cpus", "memory"} & overrides.keys():
            resources["instance_type"] = self.instance_type
        resources.update(overrides)
        return resources

    def fail(self, kind: str, *, zones: Iterable[str] | None = None, regions: Iterable[str] | None = None,
             times: int | None = None, message: str | None = None, action: str | None = None,
             delivery: str | None = None) -> Fault:
        """Make Compute Engine refuse: "capacity" (ZONE_RESOURCE_POOL_EXHAUSTED: the next zone),
        "quota" (QUOTA_EXCEEDED: the next region), "global-quota" (GPUS_ALL_REGIONS: no GCP at all),
        "permission" (403 on instances.insert), "auth" (403 on every call), or any code."""
        code, default_action, default_message = FAULT_KINDS.get(kind, (kind, "instances.insert", None))
        return self.faults.add(code, action=action or default_action, zones=zones, regions=regions, times=times,
                               message=message or default_message, delivery=delivery)

    def instances(self, cluster: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(zone, instance JSON) of this test's clusters (or of `cluster`)."""
        names = {cluster} if cluster else set(self.clusters)
        return [(z, i) for z, i in self.server.find_instances() if i["labels"].get("cloudtrain-cluster") in names]

    def firewall_rules(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """cloudtrain's rules of this test's clusters (or of `cluster`)."""
        names = {cluster} if cluster else set(self.clusters)
        with self.server.lock:
            return [r for r in self.server.firewalls.values()
                    if any(r["name"].startswith(f"cloudtrain-{n}-") for n in names)]

    def watchdog_env(self) -> dict[str, str]:
        """The test-only watchdog knobs (docs/watchdog.md) that send a VM's watchdog to this fake:
        its token from `metadata` (the delete), and as its OS shutdown the GCE stand-in, which stops
        the instance through the fake as Compute Engine does when a guest powers off (the stop)."""
        shutdown = [sys.executable, "-m", "cloudtrain.testing.metadata", "gce-shutdown", "--endpoint", self.server.url,
                    "--project", self.server.project, "--key-file", str(self.server.key_file)]
        return {"CLOUDTRAIN_WATCHDOG_METADATA_URL": self.metadata.url,
                "CLOUDTRAIN_WATCHDOG_SHUTDOWN": shlex.join(shutdown)}

    def vm(self, zone: str, name: str) -> Any:
        inst = self.server.instance(zone, name)
        if inst is None:
            raise KeyError(f"no instance {name} in {zone}")
        return self.machines.vm(inst["id"])

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        found += [f"gcp instance {i['name']} ({i['status']}) in {z}" for z, i in self.instances()]
        found += [f"gcp firewall rule {r['name']}" for r in self.firewall_rules()]
        with self.server.lock:
            found += [f"gcp disk {d['name']} in {z}" for (z, _), d in self.server.disks.items()
                      if d["labels"].get("cloudtrain-cluster") in self.clusters]
        return sorted(found)

    def close(self) -> None:
        if self._observe in self.server.machine_hooks:
            self.server.machine_hooks.remove(self._observe)
        if self._follow_rules in self.server.network_hooks:
            self.server.network_hooks.remove(self._follow_rules)
        with self.server.lock:
            for zone, inst in self.instances():
                self.server._delete_machine((zone, inst["name"]))
            for rule in self.firewall_rules():
                self.server.firewalls.pop(rule["name"], None)
        for _, vm in self.machines:
            vm.stop()
        self.server.forget_metadata_token(self.metadata.token_for("gce"))
        if self._own_metadata:
            self.metadata.stop()
        if self.server.hook_errors:
            raise RuntimeError("gcp_cloud could not follow the fake: " + "; ".join(self.server.hook_errors))

    def _bill(self, event: str, inst: dict[str, Any]) -> None:
        """GCE bills a VM while RUNNING (each start at least a minute) and its disks from creation
        to deletion: priced from the catalog (the machine type and its GPUs, in its zone and
        market) and the storage table."""
        from cloudtrain.catalog import default_catalog
        from cloudtrain.cost import HOURS_PER_MONTH, disk_price
        from cloudtrain.providers.gcp.build import instance_id, instance_type_name, last_part, region_of

        zone = _last(inst["zone"])
        key = instance_id(zone, inst["name"])
        at = self.server.now()
        if event == "boot":
            accelerators = [(last_part(a["acceleratorType"]), int(a["acceleratorCount"]))
                            for a in inst.get("guestAccelerators", [])]
            kind = instance_type_name(last_part(inst["machineType"]), accelerators)
            spot = inst["scheduling"].get("provisioningModel") == "SPOT"
            hourly = default_catalog().price("gcp", region_of(zone), kind, spot=spot, zone=zone) or 0.0
            size = sum(int(self.server.disks[(zone, _last(d["source"]))]["sizeGb"]) for d in inst.get("disks", [])
                       if (zone, _last(d["source"])) in self.server.disks)
            self.bill.created(key, inst.get("labels", {}).get("cloudtrain-cluster", ""), hourly,
                              (disk_price("gcp") or 0.0) * size / HOURS_PER_MONTH, at=at)
        elif event == "power_on":
            self.bill.started(key, at=at)
        elif (zone, inst["name"]) in self.server.instances:
            self.bill.stopped(key, at=at)
        else:
            self.bill.deleted(key, at=at)

    def _observe(self, event: str, inst: dict[str, Any]) -> None:
        self._bill(event, inst)
        address = next((c.get("natIP") for c in inst["networkInterfaces"][0].get("accessConfigs", [])
                        if c.get("natIP")), None)
        if event in ("boot", "power_on"):
            self._follow_rules()  # the new address's rules first: no moment without them
        if event == "boot":
            self.machines.boot(inst["id"], self.server.authorized_keys(inst))
            self.machines.address(inst["id"], address)
        elif inst["id"] in self.machines:
            if event == "power_on":
                self.machines.power_on(inst["id"])
                self.machines.address(inst["id"], address)
            else:
                self.machines.power_off(inst["id"])


@pytest.fixture
def gcp_cloud(gce_server: GceServer, sshd_vm_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[GcpCloud]:
    """`cloud: gcp` for this test, offline, with no settings of yours (a `GcpCloud`).

    Compute Engine is this test's `gce_server`; the CLI finds the fake's service-account key
    through GOOGLE_APPLICATION_CREDENTIALS and its endpoint in the config (`gcp.api_endpoint`).
    Each instance the fake runs boots its own sshd VM trusting the instance's `ssh-keys` metadata,
    reached at its external IP (a new one after stop/start, followed); stop, delete, preemption and
    maxRunDuration power it off, start powers it on. Recipes get the kit's image (login user: the
    VMs' user). `fail("capacity" | "quota" | "global-quota" | "permission" | "auth", zones=...)`.
    `metadata` is the VMs' fake metadata server, whose token Compute Engine takes as their service
    accounts'; `watchdog_env()` the knobs that point a watchdog at it. At teardown the test's instances and firewall rules are deleted and its VMs stopped.
    """
    cloud = GcpCloud(tmp_path_factory.mktemp("gcp-cloud"), monkeypatch, gce_server, CloudMachines(sshd_vm_factory),
                     hint=cluster_hint(request))
    try:
        yield cloud
    finally:
        cloud.close()
