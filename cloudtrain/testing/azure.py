"""Azure test kit: a wire-level fake of Azure Resource Manager and of the Entra ID token endpoint.

`ArmServer` speaks HTTPS on 127.0.0.1 with a self-signed certificate generated at start, so the
real SDK clients (azure-mgmt-compute/-network/-resource/-authorization) and azure-identity's real
credential classes talk to it unchanged: a service principal (AZURE_TENANT_ID/CLIENT_ID/
CLIENT_SECRET) fetches `/{tenant}/v2.0/.well-known/openid-configuration`, posts to the token
endpoint it names, and ARM requests carry that bearer token. REQUESTS_CA_BUNDLE makes the
certificate trusted (it holds that certificate only: HTTPS from the test goes to the fake).
A VM's managed identity calls ARM too (the on-node watchdog deallocating or deleting its VM): a
token registered with `accept_identity_token` (what the fake IMDS, testing/metadata.py, hands out)
may do what the VMs' role assignments give them, and gets 403 AuthorizationFailed otherwise.

What it serves, with ARM's shapes (long-running operations answered with Azure-AsyncOperation and
Location headers the way the SDK polls them; an operation finishes at the fake's next request unless
`lro_seconds` says otherwise, so the SDK's first poll, made at once, finds it done; paths matched
case-insensitively):
resource groups (list by tag, cascade delete), virtual networks and subnets, network security
groups, public IPs (Standard, static; addresses 20.x), NICs, managed disks (the VMs' OS disks, and
disks created on their own: 202 Accepted, as ARM answers), virtual machines (create, get with
instanceView, list, deallocate, powerOff, start, delete with deleteOption cascades), images and
gallery images, role assignments, subscriptions.

It validates like ARM where that is cheap: names, locations, api-version, unknown VM size or
image, missing or misplaced SSH key, reserved admin user names, a NIC or image in another region,
a NIC already in use, a disk smaller than the image, spot settings, NSG rules, role definitions
and principals. Errors come back as ARM does: `{"error": {"code", "message", "target"}}`.

Fixtures (pytest plugin `cloudtrain`):

- `azure_cloud`: everything a `cloudtrain run` on `cloud: azure` needs, for one test (an
  `AzureCloud`, the shape every `<cloud>_cloud` fixture shares: see cloud.py). Each VM the fake
  creates boots its own sshd VM trusting the VM's osProfile SSH keys, reached at its public IP;
  deallocate / power-off / delete / eviction power it off, start powers it on. A launch-time
  deadline in a VM's custom data (templates/deadline_arm.sh) fires as cloud-init would make it:
  its ARM call goes through the fake with a managed identity's token (`deadline_calls` records
  it); refused, the VM powers off and stays allocated. Recipes get a gallery
  image whose VMs log in as the sshd VMs' user (root in CI, which the fake is told to accept:
  Azure itself refuses root as admin user). `azure_cloud.fail("capacity" | "sku" | "quota" | "auth")`.
- `arm_server`: the bare server for this test, with the service principal's variables and
  REQUESTS_CA_BUNDLE in the environment (subprocesses inherit them); `arm_server.config()` is the
  `azure:` section for cloudtrain's config.yaml, `arm_server.client("compute")` a real SDK client.

    arm_server.faults.add("AllocationFailed", regions={"eastus"})          # VM create fails there
    arm_server.faults.add("OperationNotAllowed", action="vm.create", times=1)
    arm_server.faults.add("AuthorizationFailed", action="write")          # every write refused
    gate = arm_server.faults.hold("vm.create", after=True)                # VM made, answer held
    arm_server.lro_seconds = 30; ...; arm_server.settle()                 # slow operations
    arm_server.evict("vm-name")                                           # a spot eviction

Capacity codes (AllocationFailed, ZonalAllocationFailed, Overconstrained*) fail the VM create's
async operation and leave a Failed VM behind, as Azure does; the others answer the request itself.
Actions are "<kind>.<verb>": kinds vm, nic, ip, vnet, nsg, disk, image, group, role; verbs create,
get, list, delete, update, or the POST action (start, deallocate, poweroff). "write" and "*" match
more. Without `azure_cloud`, one sshd VM can stand for every fake VM: `route_public_ips(factory,
vm)` routes new public IPs to it and `authorized_keys_command()` makes it trust the keys of the
fake's running VMs.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import random
import re
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing.bill import FakeBill
from cloudtrain.testing.cloud import CloudMachines, FakeCloud, cluster_hint
from cloudtrain.testing.faults import Gate, RequestBook
from cloudtrain.testing.metadata import MetadataServer
from cloudtrain.testing.serving import serve, stop_serving
from cloudtrain.testing.sshd import SshdFactory

SUBSCRIPTION = "00000000-0000-4000-8000-0000000c1a0d"
TENANT = "00000000-0000-4000-8000-00000000e7e7"
CLIENT_ID = "00000000-0000-4000-8000-00000000c11e"
CLIENT_SECRET = "cloudtrain-test-secret"
REGIONS = ("eastus", "eastus2", "westus2", "westus3", "centralus", "northeurope", "westeurope", "uksouth")
VM_SIZES = {  # name -> vCPUs
    "Standard_B2s": 2, "Standard_D2s_v5": 2, "Standard_D4s_v5": 4, "Standard_D8s_v5": 8,
    "Standard_NC4as_T4_v3": 4, "Standard_NC8as_T4_v3": 8, "Standard_NC64as_T4_v3": 64,
    "Standard_NC6s_v3": 6, "Standard_NC12s_v3": 12, "Standard_NC24s_v3": 24,
    "Standard_NC24ads_A100_v4": 24, "Standard_NC48ads_A100_v4": 48,
}
PLATFORM_IMAGES = {  # (publisher, offer, sku), lower case -> OS disk size in GB
    ("canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2"): 30,
    ("canonical", "ubuntu-24_04-lts", "server"): 30,
    ("microsoft-dsvm", "ubuntu-hpc", "2204"): 64,
    ("microsoft-dsvm", "ubuntu-2204", "2204-gen2"): 150,
}
ROLES = {  # built-in role definition GUIDs
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": "Virtual Machine Contributor",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    # Data-plane roles: they give no ARM action (control plane), only blob data (testing/blob.py).
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": "Storage Blob Data Reader",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
}
# What each data role may do with blobs (Azure's built-in role definitions' dataActions, abridged
# to the fake's three operations: read includes listing).
BLOB_DATA_ROLES = {"Storage Blob Data Reader": frozenset({"read"}),
                   "Storage Blob Data Contributor": frozenset({"read", "write", "delete"})}
RESERVED_ADMIN_USERS = frozenset({  # Azure refuses these as adminUsername
    "administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1", "1", "123", "a",
    "actuser", "adm", "admin2", "aspnet", "backup", "console", "david", "guest", "john", "owner", "root", "server",
    "sql", "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5",
})
ASYNC_CODES = frozenset(
    {"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
     "OverconstrainedZonalAllocationRequest"}
)
_STATUS = {"AuthorizationFailed": 403, "InvalidAuthenticationToken": 401, "InvalidParameter": 400,
           "ResourceGroupNotFound": 404, "ResourceNotFound": 404, "NotFound": 404, "TooManyRequests": 429,
           "InternalServerError": 500}
_MESSAGES = {
    "AllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested VM size in this "
    "region. Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance",
    "ZonalAllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested VM size in "
    "this zone. Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance",
    "OverconstrainedAllocationRequest": "Allocation failed. VM(s) with the following constraints cannot be "
    "allocated, because the condition is too restrictive. Please remove some constraints and try again.",
    "SkuNotAvailable": "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
    "{size}' is currently not available in location '{region}'. Please try another size or deploy to a "
    "different location or different zone. See https://aka.ms/azureskunotavailable for details.",
    "OperationNotAllowed": "Operation could not be completed as it results in exceeding approved Total Regional "
    "Cores quota. Additional details - Deployment Model: Resource Manager, Location: {region}, Current Limit: 0, "
    "Current Usage: 0, Additional Required: 4, (Minimum) New Limit Required: 4.",
    "AuthorizationFailed": "The client '{client}' with object id '{client}' does not have authorization to "
    "perform action '{action}' over scope '{scope}' or the scope is invalid. If access was recently granted, "
    "please refresh your credentials.",
    "ReadOnlyDisabledSubscription": "The subscription '{subscription}' is disabled and therefore marked as read "
    "only. You cannot perform any write actions on this subscription until it is re-enabled.",
}
_KINDS = {"virtualmachines": "vm", "networkinterfaces": "nic", "publicipaddresses": "ip", "virtualnetworks": "vnet",
          "networksecuritygroups": "nsg", "disks": "disk", "images": "image", "galleries": "gallery",
          "roleassignments": "role", "userassignedidentities": "identity"}
_VERBS = {"PUT": "create", "GET": "get", "HEAD": "get", "DELETE": "delete", "PATCH": "update"}
_RG_NAME = re.compile(r"^[-\w.()]{1,90}$")
_VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,63}$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


class ArmError(Exception):
    def __init__(self, code: str, message: str, status: int | None = None, target: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.target = code, message, target
        self.status = status or _STATUS.get(code, 409 if code not in ASYNC_CODES else 200)

    def body(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error}


@dataclass(frozen=True)
class ArmRequest:
    method: str
    path: str
    action: str  # e.g. "vm.create", "group.delete", "vm.deallocate"
    region: str | None
    # Who called: the service principal's client id, or for a managed identity's token the
    # principal id of the VM identity whose role allowed the call ("" when none did: refused).
    caller: str = ""
    managed_identity: bool = False  # the bearer token was a managed identity's (from IMDS)
    bearer: str = ""  # the bearer token sent


@dataclass
class Fault:
    """Answer matching requests with error `code` (None in a filter means any)."""

    code: str
    action: str = "vm.create"
    regions: frozenset[str] | None = None
    message: str | None = None
    status: int | None = None
    times: int | None = None
    when: Callable[[ArmRequest], bool] | None = None
    hits: int = 0

    def matches(self, request: ArmRequest) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if not _action_matches(self.action, request):
            return False
        if self.regions is not None and request.region not in self.regions:
            return False
        return self.when is None or self.when(request)


def _action_matches(pattern: str, request: ArmRequest) -> bool:
    if pattern == "*":
        return True
    if pattern == "write":
        return request.method in ("PUT", "POST", "PATCH", "DELETE")
    return pattern.lower() == request.action.lower()


class Faults(RequestBook[ArmRequest, Fault]):
    def __init__(self) -> None:
        super().__init__(_action_matches)

    def add(self, code: str, *, action: str = "vm.create", regions: Iterable[str] | None = None,
            message: str | None = None, status: int | None = None, times: int | None = None,
            when: Callable[[ArmRequest], bool] | None = None) -> Fault:
        return self.add_fault(Fault(code, action, frozenset(regions) if regions is not None else None, message,
                                    status, times, when))

    def count(self, action: str, *, region: str | None = None) -> int:
        return len(self.matching(action, lambda r: region in (None, r.region)))


@dataclass
class _Op:
    id: str
    finish_at: float
    on_success: Callable[[], None] | None = None
    error: ArmError | None = None
    on_failure: Callable[[], None] | None = None
    status: str = "InProgress"


class FakeArm:
    """The state and the WSGI app. Bodies are ARM JSON (camelCase), keyed by lower-cased id."""

    def __init__(self, *, lro_seconds: float = 0.0, retry_after: str = "1",
                 allowed_admin_users: Iterable[str] = ()) -> None:
        self.subscription = SUBSCRIPTION
        self.subscription_state = "Enabled"
        self.principals = {CLIENT_ID: CLIENT_SECRET}
        # The launching service principal's built-in role on the subscription: "Contributor" may
        # do everything but grant access (roleAssignments/write), as in Azure.
        self.principal_role = "Owner"
        self.tokens: dict[str, str] = {}
        # Bearer tokens of the VMs' managed identities, as their IMDS hands them out (see
        # accept_identity_token): such a call may do what a role assignment gives a VM identity.
        self.identity_tokens: set[str] = set()
        self.resources: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, _Op] = {}
        self.faults = Faults()
        self.lro_seconds = lro_seconds
        self.retry_after = retry_after
        self.allowed_admin_users = frozenset(allowed_admin_users)
        self.public_ip_hooks: list[Callable[[str], None]] = []
        # (event, vm) with event "boot" (created and running), "power_on", "power_off" (deallocated,
        # stopped, deleted, evicted): what a hypervisor would do with the machine behind the VM.
        self.machine_hooks: list[Callable[[str, dict[str, Any]], None]] = []
        # Called after every write: what may have changed who can reach which VM.
        self.network_hooks: list[Callable[[], None]] = []
        self.lock = threading.RLock()
        self._base = ""
        # Launch-time deadlines from the VMs' custom data (templates/deadline_arm.sh), and the ARM
        # calls they made: (vm id, method, HTTP status).
        self.deadline_timers: list[threading.Timer] = []
        self.deadline_calls: list[tuple[str, str, int]] = []
        # Azure RBAC is eventually consistent: a role assignment gives its data access only some
        # time after its PUT succeeded (up to 10 minutes in Azure; 0 turns the delay off).
        self.rbac_propagation_s = 2.0
        self._assigned_at: dict[str, float] = {}

    # WSGI --------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        self._base = f"https://{request.host}"
        try:
            status, body, headers, gate = self._handle(request)
        except ArmError as exc:
            status, body, headers, gate = exc.status, exc.body(), {}, None
        if request.method != "GET":
            with self.lock:
                for hook in list(self.network_hooks):
                    hook()
        if gate is not None:
            gate.park()
        text = body if isinstance(body, str) else (json.dumps(body) if body is not None else "")
        mime = "text/plain" if isinstance(body, str) else "application/json"
        response = Response(text, status=status, headers=headers, mimetype=mime)
        return response(environ, start_response)

    def _handle(self, request: Any) -> tuple[int, Any, dict[str, str], Gate | None]:
        path = request.path.rstrip("/")
        parts = [p for p in path.split("/") if p]
        low = [p.lower() for p in parts]
        if path == "/_fake/authorized-keys":
            return 200, "".join(k + "\n" for k in self.running_keys()), {}, None
        if len(low) >= 3 and low[1:3] == ["v2.0", ".well-known"] or low[-3:] == ["oauth2", "v2.0", "token"]:
            return (*self._identity(request, parts, low), None)
        if not low or low[0] != "subscriptions":
            raise ArmError("NotFound", f"no route for {request.method} {path}", 404)
        bearer, client = self._authenticate(request)
        denied = None
        with self.lock:
            self._tick()
            if "operations" in low or "operationresults" in low:
                return (*self._poll(low), None)
            if "api-version" not in request.args:
                raise ArmError("MissingApiVersionParameter", "The api-version query parameter (?api-version=) is "
                               "required for all requests.", 400)
            if len(low) < 2 or low[1] != self.subscription:
                raise ArmError("SubscriptionNotFound", f"The subscription '{parts[1] if len(parts) > 1 else ''}' "
                               "could not be found.", 404)
            body = request.get_json(silent=True) if request.data else None
            arm_request = ArmRequest(request.method, path, self._action(request.method, low), self._region(low, body),
                                     caller=client or "", managed_identity=client is None, bearer=bearer)
            if client is None:
                principal, denied = self._authorize_identity(arm_request)
                arm_request = dataclasses.replace(arm_request, caller=principal or "")
        fault, gate = self.faults.record_and_match(arm_request)
        if client is not None and not _role_allows(self.principal_role, _rbac_action(arm_request)):
            denied = self._fault_error(Fault("AuthorizationFailed"), arm_request, body)
        if denied is not None:
            raise denied
        if gate is not None and not gate.after:
            gate.park()
            gate = None
        with self.lock:
            if fault is not None and fault.code not in ASYNC_CODES:
                raise self._fault_error(fault, arm_request, body)
            if self.subscription_state != "Enabled" and not _is_read(request.method):
                raise self._fault_error(Fault("ReadOnlyDisabledSubscription"), arm_request, body)
            status, out, headers = self._route(request.method, parts, low, body or {}, request.args, fault)
        return status, out, headers, gate

    def _fault_error(self, fault: Fault, request: ArmRequest, body: Any) -> ArmError:
        size = ((body or {}).get("properties") or {}).get("hardwareProfile", {}).get("vmSize", "")
        message = (fault.message or _MESSAGES.get(fault.code, fault.code)).format(
            size=size, region=request.region or "", client=CLIENT_ID, action=_rbac_action(request),
            scope=request.path, subscription=self.subscription)
        return ArmError(fault.code, message, fault.status)

    # identity ----------------------------------------------------------------------------------

    def _identity(self, request: Any, parts: list[str], low: list[str]) -> tuple[int, Any, dict[str, str]]:
        tenant = parts[0]
        if low[1:3] == ["v2.0", ".well-known"]:
            base = f"{self._base}/{tenant}"
            return 200, {"token_endpoint": f"{base}/oauth2/v2.0/token", "issuer": f"{base}/v2.0",
                         "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                         "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                         "tenant_region_scope": "NA",
                         "token_endpoint_auth_methods_supported": ["client_secret_post"]}, {}
        form = request.form
        client, secret = form.get("client_id", ""), form.get("client_secret", "")
        if tenant != TENANT:
            return 400, {"error": "invalid_request", "error_description": f"AADSTS90002: Tenant '{tenant}' not found.",
                         "error_codes": [90002]}, {}
        if self.principals.get(client) is None or self.principals[client] != secret:
            return 401, {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret "
                         f"provided. Ensure the secret being sent in the request is the client secret value, not the "
                         f"client secret ID, for a secret added to app '{client}'.", "error_codes": [7000215]}, {}
        token = uuid.uuid4().hex
        self.tokens[token] = client
        return 200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}, {}

    def _authenticate(self, request: Any) -> tuple[str, str | None]:
        """(bearer token, service principal's client id); client None: a managed identity's token."""
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip()
        if header.startswith("Bearer ") and token in self.identity_tokens:
            return token, None
        if not header.startswith("Bearer ") or self.tokens.get(token) not in self.principals:
            raise ArmError("InvalidAuthenticationToken", "The access token is invalid.", 401)
        return token, self.tokens[token]

    def accept_identity_token(self, token: str) -> None:
        """Take `token` (e.g. `MetadataServer.token_for("imds")`) as a managed identity's token.

        One fake IMDS serves every VM of a test, so the token cannot say which VM asked: it stands
        for the system-assigned identity of each VM the fake holds, and a call is allowed when one
        of them has a role assignment that covers the call's scope and action (Owner, Contributor,
        Virtual Machine Contributor or Reader, on the group or the subscription). Otherwise ARM's
        403 AuthorizationFailed. The service principal stays allowed everything."""
        with self.lock:
            self.identity_tokens.add(token)

    def forget_identity_token(self, token: str) -> None:
        with self.lock:
            self.identity_tokens.discard(token)

    def _authorize_identity(self, request: ArmRequest) -> tuple[str | None, ArmError | None]:
        """(the VM identity whose role allows `request`, None) or (None, AuthorizationFailed)."""
        action = _rbac_action(request)
        scope = request.path.lower()
        principals = sorted(self._vm_principals())
        for assignment in self._all("microsoft.authorization/roleassignments"):
            props = assignment["properties"]
            where = props["scope"].lower().rstrip("/")
            role = ROLES.get(props["roleDefinitionId"].rsplit("/", 1)[-1].lower(), "")
            if props["principalId"] in principals and (scope == where or scope.startswith(where + "/")) \
                    and _role_allows(role, action):
                return props["principalId"], None
        client = principals[0] if principals else "00000000-0000-0000-0000-000000000000"
        return None, ArmError("AuthorizationFailed", _MESSAGES["AuthorizationFailed"].format(
            client=client, action=action, scope=request.path))

    # operations --------------------------------------------------------------------------------

    def _start_op(self, on_success: Callable[[], None] | None = None, error: ArmError | None = None,
                  on_failure: Callable[[], None] | None = None, region: str = "eastus") -> dict[str, str]:
        op = _Op(uuid.uuid4().hex, time.monotonic() + self.lro_seconds, on_success, error, on_failure)
        self.ops[op.id] = op
        where = f"{self._base}/subscriptions/{self.subscription}/providers/Microsoft.Fake/locations/{region}"
        return {"Azure-AsyncOperation": f"{where}/operations/{op.id}?api-version=2024-01-01",
                "Location": f"{where}/operationresults/{op.id}?api-version=2024-01-01",
                "Retry-After": self.retry_after}

    def _tick(self) -> None:
        now = time.monotonic()
        for op in list(self.ops.values()):
            if op.status != "InProgress" or op.finish_at > now:
                continue
            if op.error is not None:
                op.status = "Failed"
                if op.on_failure:
                    op.on_failure()
            else:
                op.status = "Succeeded"
                if op.on_success:
                    op.on_success()

    def _poll(self, low: list[str]) -> tuple[int, Any, dict[str, str]]:
        op = self.ops.get(low[-1])
        if op is None:
            raise ArmError("NotFound", f"operation {low[-1]} not found", 404)
        retry = {"Retry-After": self.retry_after}
        if "operationresults" in low:  # Location polling: 202 while running, then the outcome
            if op.status == "InProgress":
                return 202, None, {**retry, "Location": f"{self._base}/{'/'.join(low)}"}
            if op.status == "Failed":
                assert op.error is not None
                return (op.error.status if op.error.status >= 400 else 409), op.error.body(), {}
            return 200, None, {}
        body: dict[str, Any] = {"id": low[-1], "name": low[-1], "status": op.status}
        if op.status == "Failed" and op.error is not None:
            body["error"] = op.error.body()["error"]
        return 200, body, retry if op.status == "InProgress" else {}

    def settle(self) -> None:
        """Finish every operation now (whatever lro_seconds says)."""
        with self.lock:
            for op in self.ops.values():
                op.finish_at = 0.0
            self._tick()

    # routing -----------------------------------------------------------------------------------

    def _action(self, method: str, low: list[str]) -> str:
        if len(low) == 2:
            return "subscription.get"
        if len(low) <= 4 and (len(low) < 3 or low[2] == "resourcegroups"):
            return f"group.{_VERBS.get(method, method.lower()) if len(low) == 4 else 'list'}"
        kinds = [_KINDS[p] for p in low if p in _KINDS]
        kind = kinds[-1] if kinds else low[-1]
        if method == "POST":
            return f"{kind}.{low[-1]}"
        if method == "GET" and low[-1] in _KINDS:
            return f"{kind}.list"
        if low[-1] == "instanceview":
            return f"{kind}.get"
        return f"{kind}.{_VERBS.get(method, method.lower())}"

    def _region(self, low: list[str], body: Any) -> str | None:
        if isinstance(body, dict) and body.get("location"):
            return str(body["location"]).lower()
        for cut in range(len(low), 3, -1):
            found = self.resources.get("/" + "/".join(low[:cut]))
            if found is not None and found.get("location"):
                return str(found["location"]).lower()
        return None

    def _route(self, method: str, parts: list[str], low: list[str], body: dict[str, Any], args: Any,
               fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
        sub = f"/subscriptions/{self.subscription}"
        if len(low) == 2:
            return 200, {"id": sub, "subscriptionId": self.subscription, "tenantId": TENANT,
                         "displayName": "cloudtrain fake subscription", "state": self.subscription_state}, {}
        deep = _deep_assignment(low)
        if deep is not None:
            return self._scoped_assignment(method, parts, deep, body)
        if low[2] == "resourcegroups":
            if len(low) == 3:
                return 200, {"value": self._filter_tags(self._groups(), args.get("$filter"))}, {}
            if len(low) == 4:
                return self._group(method, parts[3], body)
            rg = self._get_group(parts[3])
            if low[4] == "resources" and len(low) == 5 and method == "GET":
                inside = [r for k, r in self.resources.items() if k.startswith(rg["id"].lower() + "/")
                          and r["type"] != "Microsoft.Authorization/roleAssignments"]
                return 200, {"value": self._filter_tags(inside, args.get("$filter"))}, {}
            if low[4] == "providers" and len(low) >= 7:
                return self._provider(method, parts, low, rg, body, args, fault)
        if low[2] == "providers" and len(low) == 5:  # subscription-wide list of a type
            return 200, {"value": [r for r in self._all(low[3] + "/" + low[4])]}, {}
        if low[2] == "resources" and len(low) == 3:
            tracked = [r for r in self.resources.values() if r["type"] not in (
                "Microsoft.Resources/resourceGroups", "Microsoft.Authorization/roleAssignments")]
            return 200, {"value": self._filter_tags(tracked, args.get("$filter"))}, {}
        raise ArmError("NotFound", f"no route for {method} /{'/'.join(parts)}", 404)

    # resource groups ---------------------------------------------------------------------------

    def _groups(self) -> list[dict[str, Any]]:
        return [r for r in self.resources.values() if r["type"] == "Microsoft.Resources/resourceGroups"]

    def _get_group(self, name: str) -> dict[str, Any]:
        group = self.resources.get(f"/subscriptions/{self.subscription}/resourcegroups/{name.lower()}")
        if group is None:
            raise ArmError("ResourceGroupNotFound", f"Resource group '{name}' could not be found.", 404)
        return group

    def _group(self, method: str, name: str, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        key = f"/subscriptions/{self.subscription}/resourcegroups/{name.lower()}"
        existing = self.resources.get(key)
        if method in ("GET", "HEAD"):
            if existing is None:
                self._get_group(name)
            return (200 if method == "GET" else 204), (existing if method == "GET" else None), {}
        if method == "DELETE":
            if existing is None:
                self._get_group(name)
            existing["properties"]["provisioningState"] = "Deleting"
            return 202, None, self._start_op(lambda: self._delete_tree(key), region=existing["location"])
        if method in ("PUT", "PATCH"):
            if not _RG_NAME.match(name) or name.endswith("."):
                raise ArmError("InvalidResourceGroup", f"The provided resource group name '{name}' has these invalid "
                               "characters. The name can only be a letter, digit, '-', '.', '(', ')' or '_'.", 400)
            if existing is not None and existing["properties"]["provisioningState"] == "Deleting":
                raise ArmError("ResourceGroupBeingDeleted", f"The resource group '{name}' is in deprovisioning "
                               "state and cannot perform this operation.", 409)
            location = _location(body.get("location") or (existing or {}).get("location"), "resourceGroups")
            if existing is not None and location != existing["location"]:
                raise ArmError("InvalidResourceGroupLocation", f"Invalid resource group location '{location}'. The "
                               f"Resource group already exists in location '{existing['location']}'.", 409)
            group = {"id": f"/subscriptions/{self.subscription}/resourceGroups/{name}", "name": name,
                     "type": "Microsoft.Resources/resourceGroups", "location": location,
                     "tags": dict(body.get("tags") or (existing or {}).get("tags") or {}),
                     "properties": {"provisioningState": "Succeeded"}}
            self.resources[key] = group
            return (200 if existing else 201), group, {}
        raise ArmError("MethodNotAllowed", f"{method} on a resource group", 405)

    def _delete_tree(self, prefix: str) -> None:
        for key in [k for k in self.resources if k == prefix or k.startswith(prefix + "/")]:
            gone = self.resources.pop(key, None)
            if gone is not None and gone["type"] == "Microsoft.Compute/virtualMachines":
                self._machine("power_off", gone)

    # providers ---------------------------------------------------------------------------------

    def _provider(self, method: str, parts: list[str], low: list[str], rg: dict[str, Any], body: dict[str, Any],
                  args: Any, fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
        rg_key = rg["id"].lower()
        rtype = f"{parts[5]}/{parts[6]}"
        ltype = rtype.lower()
        if len(low) == 7:
            if method != "GET":
                raise ArmError("MethodNotAllowed", f"{method} on a collection", 405)
            if ltype == "microsoft.authorization/roleassignments":
                return 200, {"value": [r for r in self._all(ltype) if r["properties"]["scope"].lower() == rg_key]}, {}
            if ltype == "microsoft.authorization/permissions":
                # The caller's effective permissions at this scope (Permissions - List For Resource Group).
                return 200, {"value": [ROLE_PERMISSIONS[self.principal_role]]}, {}
            return 200, {"value": [r for r in self._all(ltype) if r["id"].lower().startswith(rg_key + "/")]}, {}
        key = "/".join([rg_key, *low[4:8]])
        existing = self.resources.get(key)
        if len(low) == 8:
            if method == "PUT":
                return self._create(ltype, parts[7], key, rg, body, existing, fault)
            if existing is None:
                if method == "DELETE":
                    return 204, None, {}
                raise ArmError("ResourceNotFound", f"The Resource '{rtype}/{parts[7]}' under resource group "
                               f"'{rg['name']}' was not found.", 404)
            if method == "GET":
                if ltype == "microsoft.compute/virtualmachines" and args.get("$expand", "").lower() == "instanceview":
                    return 200, {**existing, "properties": {**existing["properties"],
                                                            "instanceView": self._instance_view(existing)}}, {}
                return 200, existing, {}
            if method == "PATCH":
                existing["tags"] = dict(body.get("tags", existing.get("tags") or {}))
                # A tag update is an operation on the VM: its ProvisioningState time moves too.
                stamp = (lambda: existing["properties"].update(_provisioned_at=time.time())) \
                    if ltype == "microsoft.compute/virtualmachines" else None
                return 200, existing, self._start_op(stamp, region=existing["location"])
            if method == "DELETE":
                return self._delete(ltype, key, existing)
        if existing is None:
            raise ArmError("ResourceNotFound", f"The Resource '{rtype}/{parts[7]}' under resource group "
                           f"'{rg['name']}' was not found.", 404)
        if ltype == "microsoft.compute/virtualmachines" and len(low) == 9:
            if method == "GET" and low[8] == "instanceview":
                return 200, self._instance_view(existing), {}
            if method == "POST":
                return self._vm_action(existing, low[8], fault)
        if method == "GET" and len(low) == 10:  # a child: subnets, gallery images
            child = self._child(existing, low[8], low[9])
            if child is not None:
                return 200, child, {}
            raise ArmError("NotFound", f"{parts[8]} '{parts[9]}' not found under '{existing['name']}'.", 404)
        raise ArmError("NotFound", f"no route for {method} /{'/'.join(parts)}", 404)

    def _all(self, ltype: str) -> list[dict[str, Any]]:
        return [r for r in self.resources.values() if r["type"].lower() == ltype]

    def _child(self, parent: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
        if kind == "subnets":
            return next((s for s in parent["properties"].get("subnets", []) if s["name"].lower() == name), None)
        return self.resources.get(f"{parent['id'].lower()}/{kind}/{name}")

    def _create(self, ltype: str, name: str, key: str, rg: dict[str, Any], body: dict[str, Any],
                existing: dict[str, Any] | None, fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
        kind = ltype.split("/")[1]
        if kind == "roleassignments":
            return self._role_assignment(name, key, rg["id"], body)
        pattern = _VM_NAME if kind == "virtualmachines" else _RESOURCE_NAME
        if not pattern.match(name) or name.endswith((".", "-")):
            raise ArmError("InvalidResourceName", f"Resource name {name} is invalid. The name can be up to 80 "
                           "characters long. It must begin with a word character, and it must end with a word "
                           "character or with '_'.", 400)
        location = _location(body.get("location"), kind)
        resource = {"id": f"{rg['id']}/providers/{_type_name(ltype)}/{name}", "name": name, "type": _type_name(ltype),
                    "location": location, "tags": dict(body.get("tags") or {}),
                    "properties": dict(body.get("properties") or {})}
        for extra in ("sku", "zones", "identity", "plan"):
            if extra in body:
                resource[extra] = body[extra]
        checker = getattr(self, f"_check_{kind}", None)
        if checker is not None:
            checker(resource, existing)
        resource["properties"]["provisioningState"] = "Updating" if existing else "Creating"
        self.resources[key] = resource
        on_success = lambda: resource["properties"].update(provisioningState="Succeeded")
        if kind == "virtualmachines" and existing is None:
            return self._create_vm(resource, fault)
        if kind in ("images", "galleries", "userassignedidentities"):
            # A user-assigned identity is made within the PUT: 201 (200 on update) with its ids.
            on_success()
            return (200 if existing else 201), resource, {}
        # Managed disks answer a create with 202 Accepted (200 or 202 are the only codes the API
        # and its SDK know for disks.createOrUpdate); the other kinds here with 201 Created.
        created = 202 if kind == "disks" else 201
        return (200 if existing else created), resource, self._start_op(on_success, region=location)

    def _delete(self, ltype: str, key: str, existing: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if ltype == "microsoft.authorization/roleassignments":
            self.resources.pop(key, None)
            return 200, existing, {}
        if ltype == "microsoft.network/networkinterfaces" and existing["properties"].get("virtualMachine"):
            raise ArmError("NicInUse", f"Network Interface {existing['id']} is used by existing resource "
                           f"{existing['properties']['virtualMachine']['id']}. In order to delete the network "
                           "interface, it must be dissociated from the resource.", 400)
        existing["properties"]["provisioningState"] = "Deleting"

        def gone() -> None:
            self.resources.pop(key, None)
            if ltype == "microsoft.compute/virtualmachines":
                self._vm_deleted(existing)
                self._machine("power_off", existing)

        return 202, None, self._start_op(gone, region=existing["location"])

    # network -----------------------------------------------------------------------------------

    def _check_networksecuritygroups(self, nsg: dict[str, Any], existing: Any) -> None:
        for rule in nsg["properties"].get("securityRules", []):
            props = rule.get("properties") or {}
            name = rule.get("name", "")
            missing = [f for f in ("protocol", "access", "direction", "priority") if props.get(f) in (None, "")]
            if not (props.get("sourceAddressPrefix") or props.get("sourceAddressPrefixes")):
                missing.append("sourceAddressPrefix")
            if not (props.get("destinationPortRange") or props.get("destinationPortRanges")):
                missing.append("destinationPortRange")
            if missing:
                raise ArmError("InvalidRequestFormat", f"Security rule {name} is missing {', '.join(missing)}.", 400)
            if not 100 <= int(props["priority"]) <= 4096:
                raise ArmError("SecurityRuleInvalidPriority", f"Security rule {name} has invalid priority "
                               f"{props['priority']}. Value provided: {props['priority']} Allowed range 100-4096.", 400)
            rule["id"] = f"{nsg['id']}/securityRules/{name}"
            props["provisioningState"] = "Succeeded"

    def _check_virtualnetworks(self, vnet: dict[str, Any], existing: Any) -> None:
        space = [ipaddress.ip_network(p) for p in vnet["properties"].get("addressSpace", {}).get("addressPrefixes", [])]
        if not space:
            raise ArmError("InvalidAddressSpace", "The virtual network needs at least one address prefix.", 400)
        for subnet in vnet["properties"].get("subnets", []):
            props = subnet.setdefault("properties", {})
            prefix = ipaddress.ip_network(props.get("addressPrefix", ""))
            if not any(prefix.subnet_of(s) for s in space):  # type: ignore[arg-type]
                raise ArmError("NetcfgSubnetRangeOutsideVnet", f"Subnet '{subnet.get('name')}' is not valid because "
                               "its IP address range is outside the IP address range of virtual network.", 400)
            nsg = props.get("networkSecurityGroup")
            if nsg:
                self._ref(nsg["id"], vnet["location"], "networkSecurityGroup")
            subnet["id"] = f"{vnet['id']}/subnets/{subnet['name']}"
            props["provisioningState"] = "Succeeded"

    def _check_publicipaddresses(self, pip: dict[str, Any], existing: Any) -> None:
        props = pip["properties"]
        if (pip.get("sku") or {}).get("name") == "Standard" and props.get("publicIPAllocationMethod") != "Static":
            raise ArmError("StandardSkuPublicIPAddressesMustBeStatic", "Standard sku publicIp /subscriptions/... "
                           "must have AllocationMethod set to Static.", 400)
        if existing and existing["properties"].get("ipAddress"):
            props["ipAddress"] = existing["properties"]["ipAddress"]
            return
        taken = {r["properties"].get("ipAddress") for r in self._all("microsoft.network/publicipaddresses")}
        while (address := f"20.{random.randint(1, 254)}.{random.randint(0, 254)}.{random.randint(1, 254)}") in taken:
            continue
        props["ipAddress"] = address
        for hook in self.public_ip_hooks:
            hook(address)

    def _check_networkinterfaces(self, nic: dict[str, Any], existing: Any) -> None:
        configs = nic["properties"].get("ipConfigurations") or []
        if not configs:
            raise ArmError("InvalidRequestFormat", "A network interface needs at least one IP configuration.", 400)
        for config in configs:
            props = config.setdefault("properties", {})
            subnet_id = (props.get("subnet") or {}).get("id", "")
            vnet = self._ref(subnet_id.rsplit("/subnets/", 1)[0], nic["location"], "subnet")
            if self._child(vnet, "subnets", subnet_id.rsplit("/", 1)[-1].lower()) is None:
                raise ArmError("InvalidResourceReference", f"Resource {subnet_id} referenced by resource "
                               f"{nic['id']} was not found.", 400)
            if props.get("publicIPAddress"):
                pip = self._ref(props["publicIPAddress"]["id"], nic["location"], "publicIPAddress")
                owner = pip["properties"].get("ipConfiguration", {}).get("id", "")
                if owner and not owner.lower().startswith(nic["id"].lower()):
                    raise ArmError("PublicIPAddressInUse", f"Public IP address {pip['id']} is already in use.", 400)
                pip["properties"]["ipConfiguration"] = {"id": f"{nic['id']}/ipConfigurations/{config['name']}"}
            if existing is None or not props.get("privateIPAddress"):
                used = {c.get("properties", {}).get("privateIPAddress") for n in self._all(
                    "microsoft.network/networkinterfaces") for c in n["properties"].get("ipConfigurations", [])}
                props["privateIPAddress"] = next(f"10.0.0.{i}" for i in range(4, 255) if f"10.0.0.{i}" not in used)
            config["id"] = f"{nic['id']}/ipConfigurations/{config['name']}"
        if existing is not None and existing["properties"].get("virtualMachine"):
            nic["properties"]["virtualMachine"] = existing["properties"]["virtualMachine"]

    def _ref(self, resource_id: str, location: str, what: str) -> dict[str, Any]:
        found = self.resources.get(resource_id.lower())
        if found is None:
            raise ArmError("InvalidResourceReference", f"Resource {resource_id} referenced as {what} was not found.",
                           400)
        if found.get("location") and found["location"] != location:
            raise ArmError("InvalidResourceReference", f"Resource {resource_id} referenced as {what} is in location "
                           f"'{found['location']}', not '{location}'. Resources must be in the same region.", 400)
        return found

    # role assignments --------------------------------------------------------------------------

    def _scoped_assignment(self, method: str, parts: list[str], at: int, body: dict[str, Any]
                           ) -> tuple[int, Any, dict[str, str]]:
        """Role assignments on a resource inside a group (a storage account, one of its blob
        containers): `<resource id>/providers/Microsoft.Authorization/roleAssignments[/<name>]`.
        The storage account must exist (ARM answers 404 for a scope it cannot find)."""
        scope = "/" + "/".join(parts[:at])
        low_scope = scope.lower()
        account = re.match(r"(/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.storage/"
                           r"storageaccounts/[^/]+)", low_scope)
        if account is None or account.group(1) not in self.resources:
            raise ArmError("ResourceNotFound", f"The Resource '{scope}' was not found.", 404)
        if len(parts) == at + 3:
            if method != "GET":
                raise ArmError("MethodNotAllowed", f"{method} on a collection", 405)
            return 200, {"value": [r for r in self._all("microsoft.authorization/roleassignments")
                                   if r["properties"]["scope"].lower() == low_scope]}, {}
        name = parts[at + 3]
        key = f"{low_scope}/providers/microsoft.authorization/roleassignments/{name.lower()}"
        existing = self.resources.get(key)
        if method == "PUT":
            return self._role_assignment(name, key, scope, body)
        if existing is None:
            if method == "DELETE":
                return 204, None, {}
            raise ArmError("RoleAssignmentNotFound", f"The role assignment '{name}' is not found.", 404)
        if method == "DELETE":
            self.resources.pop(key, None)
        return 200, existing, {}

    def blob_access(self, account: str, container: str, operation: str) -> str | None:
        """The principal id of a VM identity allowed `operation` ("read" | "write" | "delete") on
        blobs of `account`/`container` by a Storage Blob Data role assigned at the account's or the
        container's scope (or wider: group, subscription); None when none is. Only VMs that exist
        have an identity (a deleted VM's assignments stay behind in Azure, unusable)."""
        with self.lock:
            accounts = [r["id"].lower() for r in self._all("microsoft.storage/storageaccounts")
                        if r["name"].lower() == account.lower()]
            if not accounts:
                return None
            target = f"{accounts[0]}/blobservices/default/containers/{container.lower()}"
            principals = self._vm_principals()
            now = time.monotonic()
            for assignment in self._all("microsoft.authorization/roleassignments"):
                props = assignment["properties"]
                if now - self._assigned_at.get(assignment["id"].lower(), 0.0) < self.rbac_propagation_s:
                    continue  # not yet in effect at the data plane
                where = props["scope"].lower().rstrip("/")
                role = ROLES.get(props["roleDefinitionId"].rsplit("/", 1)[-1].lower(), "")
                if props["principalId"] in principals and (target == where or target.startswith(where + "/")) \
                        and operation in BLOB_DATA_ROLES.get(role, ()):
                    return str(props["principalId"])
            return None

    def create_storage_account(self, group: str, name: str, *, region: str = "eastus") -> str:
        """A storage account `name` in resource group `group` (made if missing), the ARM side of a
        Blob store (testing/blob.py holds its data); returns its resource id."""
        with self.lock:
            rg_id = f"/subscriptions/{self.subscription}/resourceGroups/{group}"
            self.resources.setdefault(rg_id.lower(), {"id": rg_id, "name": group, "location": region, "tags": {},
                                                      "type": "Microsoft.Resources/resourceGroups",
                                                      "properties": {"provisioningState": "Succeeded"}})
            account_id = f"{rg_id}/providers/Microsoft.Storage/storageAccounts/{name}"
            self.resources[account_id.lower()] = {
                "id": account_id, "name": name, "type": "Microsoft.Storage/storageAccounts", "location": region,
                "kind": "StorageV2", "sku": {"name": "Standard_LRS"}, "tags": {},
                "properties": {"provisioningState": "Succeeded",
                               "primaryEndpoints": {"blob": f"https://{name}.blob.core.windows.net/"}}}
            return account_id

    def _role_assignment(self, name: str, key: str, scope: str, body: dict[str, Any]
                         ) -> tuple[int, Any, dict[str, str]]:
        props = body.get("properties") or {}
        try:
            uuid.UUID(name)
        except ValueError:
            raise ArmError("InvalidRoleAssignmentId", f"The role assignment ID '{name}' is not valid. The role "
                           "assignment ID must be a GUID.", 400) from None
        role = str(props.get("roleDefinitionId", ""))
        prefix = f"/subscriptions/{self.subscription}/providers/microsoft.authorization/roledefinitions/"
        if not role.lower().startswith(prefix) or role.rsplit("/", 1)[-1].lower() not in ROLES:
            raise ArmError("RoleDefinitionDoesNotExist", f"The specified role definition with ID '{role}' does not "
                           "exist.", 400)
        principal = str(props.get("principalId", ""))
        known = self._vm_principals() | {r["properties"]["principalId"]
                                         for r in self._all("microsoft.managedidentity/userassignedidentities")}
        if principal not in known:
            raise ArmError("PrincipalNotFound", f"Principal {principal} does not exist in the directory {TENANT}.", 400)
        for other in self._all("microsoft.authorization/roleassignments"):
            p = other["properties"]
            if (p["principalId"], p["roleDefinitionId"].lower(), p["scope"].lower()) == (principal, role.lower(),
                                                                                          scope.lower()):
                raise ArmError("RoleAssignmentExists", "The role assignment already exists.", 409)
        assignment = {"id": f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}", "name": name,
                      "type": "Microsoft.Authorization/roleAssignments",
                      "properties": {"roleDefinitionId": role, "principalId": principal, "scope": scope,
                                     "principalType": props.get("principalType", "ServicePrincipal"),
                                     "description": props.get("description"),
                                     "createdOn": time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())}}
        self.resources[key] = assignment
        self._assigned_at[assignment["id"].lower()] = time.monotonic()
        return 201, assignment, {}

    # virtual machines --------------------------------------------------------------------------

    def _check_virtualmachines(self, vm: dict[str, Any], existing: Any) -> None:
        if existing is not None:
            vm["properties"] = {**existing["properties"], **vm["properties"]}
            for extra in ("identity", "zones"):
                if extra in existing:
                    vm.setdefault(extra, existing[extra])
            return
        props = vm["properties"]
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if size not in VM_SIZES:
            raise ArmError("InvalidParameter", f"The value {size} provided for the VM size is not valid. The valid "
                           "sizes in the current region are: " + ", ".join(VM_SIZES) + ".", 400, "vmSize")
        self._check_os_profile(props.get("osProfile") or {}, vm["name"])
        image_size = self._check_storage(vm)
        disk = props["storageProfile"].setdefault("osDisk", {})
        if disk.get("diskSizeGB") is not None and int(disk["diskSizeGB"]) < image_size:
            raise ArmError("InvalidParameter", f"The specified disk size {disk['diskSizeGB']} GB is smaller than the "
                           f"size of the corresponding disk in the VM image: {image_size} GB.", 400,
                           "osDisk.diskSizeGB")
        disk.setdefault("diskSizeGB", image_size)
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            raise ArmError("InvalidParameter", "Required parameter 'networkProfile' is missing (null).", 400,
                           "networkProfile")
        for ref in nics:
            nic = self._ref(ref.get("id", ""), vm["location"], "networkInterface")
            user = nic["properties"].get("virtualMachine")
            if user:
                raise ArmError("NicInUse", f"Network Interface {nic['id']} is used by existing resource "
                               f"{user['id']}.", 400)
        priority = props.get("priority", "Regular")
        if priority == "Spot":
            if props.setdefault("evictionPolicy", "Deallocate") not in ("Deallocate", "Delete"):
                raise ArmError("InvalidParameter", f"Eviction policy {props['evictionPolicy']} is not valid.", 400,
                               "evictionPolicy")
            price = float((props.get("billingProfile") or {}).get("maxPrice", -1))
            if price != -1 and price <= 0:
                raise ArmError("InvalidParameter", "The maxPrice must be -1 or greater than zero.", 400, "maxPrice")
        elif props.get("evictionPolicy") or props.get("billingProfile"):
            raise ArmError("InvalidParameter", "Eviction policy and max price can only be set on Spot VMs.", 400,
                           "evictionPolicy")
        identity = vm.get("identity")
        if identity and "SystemAssigned" in identity.get("type", ""):
            identity.update(principalId=str(uuid.uuid4()), tenantId=TENANT)
        if identity and "UserAssigned" in identity.get("type", ""):
            attached = identity.get("userAssignedIdentities") or {}
            if not attached:
                raise ArmError("InvalidParameter", "The identity type UserAssigned needs at least one "
                               "userAssignedIdentities entry.", 400, "identity")
            for ref in list(attached):
                found = self.resources.get(ref.lower())
                if found is None or found["type"] != "Microsoft.ManagedIdentity/userAssignedIdentities":
                    raise ArmError("FailedIdentityOperation", f"Identity operation for resource '{vm['id']}' failed "
                                   f"with error 'Failed to perform resource identity operation. Status: 'NotFound'. "
                                   f"Response: 'Resource '{ref}' was not found.''.", 400)
                attached[ref] = {"principalId": found["properties"]["principalId"],
                                 "clientId": found["properties"]["clientId"]}
        props["vmId"] = str(uuid.uuid4())
        props["timeCreated"] = datetime.datetime.now(datetime.UTC).isoformat()

    def _check_userassignedidentities(self, identity: dict[str, Any], existing: Any) -> None:
        # Its ids are the service's, fixed at creation; an update keeps them.
        kept = (existing or {}).get("properties") or {}
        identity["properties"].update(tenantId=TENANT, principalId=kept.get("principalId") or str(uuid.uuid4()),
                                      clientId=kept.get("clientId") or str(uuid.uuid4()))

    def _vm_principals(self) -> set[str]:
        """The principal ids the VMs that exist act as: system-assigned identities and the
        user-assigned ones attached to them (an identity attached to no VM acts for nobody here)."""
        found = set()
        for vm in self._all("microsoft.compute/virtualmachines"):
            identity = vm.get("identity") or {}
            if identity.get("principalId"):
                found.add(identity["principalId"])
            found.update(v.get("principalId") for v in (identity.get("userAssignedIdentities") or {}).values()
                         if v.get("principalId"))
        return found

    def _check_os_profile(self, profile: dict[str, Any], vm_name: str) -> None:
        user = profile.get("adminUsername")
        if not user:
            raise ArmError("InvalidParameter", "Required parameter 'adminUsername' is missing (null).", 400,
                           "adminUsername")
        if user.lower() in RESERVED_ADMIN_USERS and user not in self.allowed_admin_users:
            raise ArmError("InvalidParameter", "The Admin Username specified is not allowed.", 400, "adminUsername")
        computer = profile.get("computerName") or vm_name
        if len(computer) > 64 or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", computer):
            raise ArmError("InvalidParameter", "Linux host name cannot exceed 64 characters in length or contain "
                           "the following characters: ` ~ ! @ # $ % ^ & * ( ) = + _ [ ] { } \\ | ; : ' \" , < > / ?.",
                           400, "computerName")
        custom = profile.get("customData")
        if custom is not None and (len(custom) > CUSTOM_DATA_MAX_CHARS or not _is_base64(custom)):
            raise ArmError("InvalidParameter", "Custom data in OSProfile must be in Base64 encoding and with a "
                           f"maximum length of {CUSTOM_DATA_MAX_CHARS} characters.", 400, "customData")
        linux = profile.get("linuxConfiguration") or {}
        keys = (linux.get("ssh") or {}).get("publicKeys") or []
        if linux.get("disablePasswordAuthentication") and not keys:
            raise ArmError("InvalidParameter", "Authentication using either SSH or by user name and password must be "
                           "enabled in Linux profile.", 400, "linuxConfiguration")
        if not keys and not profile.get("adminPassword"):
            raise ArmError("InvalidParameter", "Required parameter 'adminPassword' is missing (null).", 400,
                           "adminPassword")
        for key in keys:
            if key.get("path") != f"/home/{user}/.ssh/authorized_keys":
                raise ArmError("InvalidParameter", "Destination path for SSH public keys is currently limited to its "
                               f"default value /home/{user}/.ssh/authorized_keys due to a known issue in Linux "
                               "provisioning agent.", 400, "linuxConfiguration.ssh.publicKeys.path")
            if str(key.get("keyData", "")).split(" ")[0] not in ("ssh-rsa", "ssh-ed25519"):
                raise ArmError("InvalidParameter", "The value of parameter linuxConfiguration.ssh.publicKeys.keyData "
                               "is invalid.", 400, "linuxConfiguration.ssh.publicKeys.keyData")

    def _check_storage(self, vm: dict[str, Any]) -> int:
        image = (vm["properties"].get("storageProfile") or {}).get("imageReference") or {}
        if image.get("id"):
            found = self.resources.get(re.sub(r"/versions/[^/]+$", "", image["id"].lower()))
            if found is None:
                raise ArmError("InvalidParameter", f"The Image '{image['id']}' cannot be found in "
                               f"'{vm['location']}' region.", 400, "imageReference")
            if found["type"] == "Microsoft.Compute/images" and found["location"] != vm["location"]:
                raise ArmError("InvalidParameter", f"The Image '{image['id']}' cannot be found in "
                               f"'{vm['location']}' region.", 400, "imageReference")
            return int(found["properties"].get("osDiskSizeGB", 30))
        urn = tuple(str(image.get(k, "")).lower() for k in ("publisher", "offer", "sku"))
        if urn not in PLATFORM_IMAGES:
            raise ArmError("PlatformImageNotFound", f"The platform image '{':'.join(urn)}:"
                           f"{image.get('version', '')}' is not available. Verify that all fields in the storage "
                           "profile are correct.", 404, "imageReference")
        return PLATFORM_IMAGES[urn]

    def _create_vm(self, vm: dict[str, Any], fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
        props = vm["properties"]
        props["_power"] = "starting"
        self._honour_deadline(vm)
        for ref in props["networkProfile"]["networkInterfaces"]:
            self.resources[ref["id"].lower()]["properties"]["virtualMachine"] = {"id": vm["id"]}
        disk_name = f"{vm['name']}_OsDisk_1_{uuid.uuid4().hex}"
        disk = props["storageProfile"]["osDisk"]
        disk.update(name=disk_name, createOption=disk.get("createOption", "FromImage"))
        disk_id = vm["id"].split("/providers/")[0] + f"/providers/Microsoft.Compute/disks/{disk_name}"
        disk["managedDisk"] = {**(disk.get("managedDisk") or {}), "id": disk_id}
        self.resources[disk["managedDisk"]["id"].lower()] = {
            "id": disk["managedDisk"]["id"], "name": disk_name, "type": "Microsoft.Compute/disks",
            "location": vm["location"], "tags": {}, "managedBy": vm["id"],
            "properties": {"diskSizeGB": disk["diskSizeGB"], "provisioningState": "Succeeded", "diskState": "Attached"}}

        def running() -> None:
            if self.resources.get(vm["id"].lower()) is not vm:
                return  # deleted while it was being created
            props.update(provisioningState="Succeeded", _power="running", _provisioned_at=time.time())
            self._machine("boot", vm)

        def failed() -> None:
            props.update(provisioningState="Failed", _power="deallocated", _provisioned_at=time.time())

        error = None
        if fault is not None and fault.code in ASYNC_CODES:
            error = ArmError(fault.code, fault.message or _MESSAGES.get(fault.code, fault.code), 200)
        return 201, vm, self._start_op(running, error, failed, region=vm["location"])

    def _honour_deadline(self, vm: dict[str, Any]) -> None:
        """What cloud-init does with the deadline in the custom data (templates/deadline_arm.sh): at
        the deadline the machine makes its watchdog's ARM call with its managed identity's token.
        Here a timer sends that call through this fake (so the identity's role decides, as in Azure);
        refused, the script shuts the OS down: the VM stops, still allocated and billed."""
        import base64

        custom = ((vm["properties"].get("osProfile") or {}).get("customData"))
        if not custom:
            return
        text = base64.b64decode(custom).decode("utf-8", "replace")
        seconds = re.search(r"^CLOUDTRAIN_DEADLINE_S=(\d+)$", text, re.M)
        action = re.search(r"^CLOUDTRAIN_DEADLINE_ACTION='(.*)'$", text, re.M)
        if seconds is None or action is None:
            return
        # From the create on: the machine boots as soon as ARM's operation ends (lro_seconds),
        # whether or not anyone polls it.
        timer = threading.Timer(int(seconds.group(1)) + self.lro_seconds, self._deadline_fires, args=(vm["id"], json.loads(action.group(1))))
        timer.daemon = True
        self.deadline_timers.append(timer)
        timer.start()

    def _deadline_fires(self, vm_id: str, action: dict[str, Any]) -> None:
        from urllib.parse import urlsplit

        from werkzeug.test import Client

        with self.lock:
            self._tick()  # operations that ended meanwhile (the VM's create) take effect first
            vm = self.resources.get(vm_id.lower())
            if vm is None or vm["properties"].get("_power") != "running":
                return
        token = uuid.uuid4().hex
        self.accept_identity_token(token)
        try:
            url = urlsplit(action["url"])
            answer = Client(self).open(f"{url.path}?{url.query}", method=action["method"],
                                       base_url=self._base or "https://127.0.0.1",
                                       headers={"Authorization": f"Bearer {token}"})
            done = answer.status_code in action["ok"] or (answer.status_code == 404 and action.get("gone_ok"))
        finally:
            self.forget_identity_token(token)
        self.deadline_calls.append((vm_id, action["method"], answer.status_code))
        if not done:
            with self.lock:
                vm = self.resources.get(vm_id.lower())
                if vm is not None and vm["properties"].get("_power") == "running":
                    vm["properties"]["_power"] = "stopped"
                    self._machine("power_off", vm)

    def _vm_action(self, vm: dict[str, Any], action: str, fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
        props = vm["properties"]
        transitions = {"deallocate": ("deallocating", "deallocated"), "poweroff": ("stopping", "stopped"),
                       "start": ("starting", "running"), "restart": ("starting", "running")}
        if action not in transitions:
            raise ArmError("NotFound", f"unknown virtual machine action {action}", 404)
        if props.get("provisioningState") == "Deleting":
            raise ArmError("OperationNotAllowed", f"Operation '{action}' is not allowed since the Virtual Machine is "
                           "marked for deletion.", 409)
        before = props["_power"]
        during, after = transitions[action]
        props.update(_power=during, provisioningState="Updating")
        error = None
        if fault is not None and fault.code in ASYNC_CODES:
            error = ArmError(fault.code, fault.message or _MESSAGES.get(fault.code, fault.code), 200)

        def done() -> None:
            props.update(_power=after, provisioningState="Succeeded", _provisioned_at=time.time())
            self._machine("power_on" if after == "running" else "power_off", vm)

        def failed() -> None:
            props.update(_power=before, provisioningState="Failed", _provisioned_at=time.time())

        return 202, None, self._start_op(done, error, failed, region=vm["location"])

    def _machine(self, event: str, vm: dict[str, Any]) -> None:
        for hook in self.machine_hooks:
            hook(event, vm)

    def public_ip_of(self, vm: dict[str, Any]) -> str | None:
        """The address of the VM's primary NIC's public IP, as ARM would report it."""
        for ref in vm["properties"]["networkProfile"]["networkInterfaces"]:
            nic = self.resources.get(ref["id"].lower())
            for config in (nic or {}).get("properties", {}).get("ipConfigurations", []):
                pip = self.resources.get(((config["properties"].get("publicIPAddress") or {}).get("id") or "").lower())
                if pip is not None:
                    return pip["properties"].get("ipAddress")
        return None

    def ingress_rules(self, vm: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """The inbound NSG rules in front of the VM's primary NIC, one layer per NSG (the subnet's,
        then the NIC's; traffic must pass both), each ending with Azure's default rules
        (AllowVnetInBound, AllowAzureLoadBalancerInBound, DenyAllInBound), in the route map's rule
        format (cloudtrain.testing.route). No NSG at all: no layer, everything admitted, as in Azure."""
        layers = []
        for ref in vm["properties"]["networkProfile"]["networkInterfaces"][:1]:
            nic = self.resources.get(ref["id"].lower()) or {}
            nsg_refs = []
            for config in nic.get("properties", {}).get("ipConfigurations", []):
                subnet_id = ((config.get("properties") or {}).get("subnet") or {}).get("id", "")
                vnet = self.resources.get(subnet_id.rsplit("/subnets/", 1)[0].lower()) if subnet_id else None
                subnet = self._child(vnet, "subnets", subnet_id.rsplit("/", 1)[-1].lower()) if vnet else None
                nsg_refs.append(((subnet or {}).get("properties") or {}).get("networkSecurityGroup"))
            nsg_refs.append(nic.get("properties", {}).get("networkSecurityGroup"))
            for nsg_ref in nsg_refs:
                nsg = self.resources.get((nsg_ref or {}).get("id", "").lower()) if nsg_ref else None
                if nsg is not None:
                    layers.append([*_nsg_rules(nsg), *NSG_DEFAULT_INBOUND])
        return layers

    def _vm_deleted(self, vm: dict[str, Any]) -> None:
        props = vm["properties"]
        disk = props["storageProfile"]["osDisk"]
        if disk.get("deleteOption") == "Delete":
            self.resources.pop(disk["managedDisk"]["id"].lower(), None)
        elif disk["managedDisk"]["id"].lower() in self.resources:
            self.resources[disk["managedDisk"]["id"].lower()].update(managedBy=None)
        for ref in props["networkProfile"]["networkInterfaces"]:
            nic = self.resources.get(ref["id"].lower())
            if nic is None:
                continue
            nic["properties"].pop("virtualMachine", None)
            if (ref.get("properties") or {}).get("deleteOption") != "Delete":
                continue
            self.resources.pop(ref["id"].lower(), None)
            for config in nic["properties"].get("ipConfigurations", []):
                pip_ref = config["properties"].get("publicIPAddress") or {}
                pip = self.resources.get(pip_ref.get("id", "").lower())
                if pip is None:
                    continue
                pip["properties"].pop("ipConfiguration", None)
                if (pip_ref.get("properties") or {}).get("deleteOption") == "Delete":
                    self.resources.pop(pip_ref["id"].lower(), None)
        # Role assignments of the VM's identity stay, orphaned, as in Azure: they go with their scope.

    def _instance_view(self, vm: dict[str, Any]) -> dict[str, Any]:
        props = vm["properties"]
        state = props["provisioningState"].lower()
        # As Azure's: the time is on the ProvisioningState status (when the VM's last operation
        # ended: create, start, deallocate, an update), never on the PowerState one.
        provisioning = {"code": f"ProvisioningState/{state}", "level": "Info" if state != "failed" else "Error",
                        "displayStatus": f"Provisioning {state}"}
        if props.get("_provisioned_at") and state in ("succeeded", "failed"):
            provisioning["time"] = _arm_time(props["_provisioned_at"])
        statuses = [provisioning,
                    {"code": f"PowerState/{props['_power']}", "level": "Info",
                     "displayStatus": {"running": "VM running", "deallocated": "VM deallocated",
                                       "stopped": "VM stopped"}.get(props["_power"], f"VM {props['_power']}")}]
        return {"computerName": props.get("osProfile", {}).get("computerName", vm["name"]), "statuses": statuses}

    # helpers for tests -------------------------------------------------------------------------

    def _filter_tags(self, items: list[dict[str, Any]], expression: str | None) -> list[dict[str, Any]]:
        if not expression:
            return items
        by_type = re.fullmatch(r"\s*resourceType eq '([^']*)'(?:\s+and\s+name eq '([^']*)')?\s*", expression)
        if by_type is not None:  # Resources - List's other documented filter
            kind, name = by_type.group(1).lower(), (by_type.group(2) or "").lower()
            return [r for r in items if r["type"].lower() == kind and (not name or r["name"].lower() == name)]
        match = re.fullmatch(r"\s*tagName eq '([^']*)'(?:\s+and\s+tagValue eq '([^']*)')?\s*", expression)
        if match is None:
            raise ArmError("InvalidFilterInQueryString", f"Invalid $filter '{expression}' specified in the query "
                           "string.", 400)
        name, value = match.group(1).lower(), match.group(2)
        found = []
        for item in items:
            tags = {k.lower(): v for k, v in (item.get("tags") or {}).items()}
            if name in tags and (value is None or tags[name] == value):
                found.append(item)
        return found

    def running_keys(self) -> list[str]:
        """Public keys of VMs that are running now (what their sshd would accept)."""
        with self.lock:
            self._tick()
            return [key["keyData"].strip() for vm in self._all("microsoft.compute/virtualmachines")
                    if vm["properties"].get("_power") == "running"
                    for key in vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]]

    def find(self, type_name: str, name: str | None = None, group: str | None = None) -> list[dict[str, Any]]:
        """Resources of one type (e.g. "Microsoft.Compute/virtualMachines"), optionally by name / group."""
        with self.lock:
            self._tick()
            ltype = type_name.lower()
            found = self._groups() if ltype == "microsoft.resources/resourcegroups" else self._all(ltype)
            return [r for r in found if (name is None or r["name"].lower() == name.lower()) and (
                group is None or f"/resourcegroups/{group.lower()}/" in r["id"].lower() + "/")]

    def power_state(self, vm_name: str) -> str:
        (vm,) = self.find("Microsoft.Compute/virtualMachines", vm_name)
        return f"PowerState/{vm['properties']['_power']}"

    def evict(self, vm_name: str) -> None:
        """A spot eviction: deallocated or deleted, as the VM's evictionPolicy says."""
        with self.lock:
            (vm,) = self.find("Microsoft.Compute/virtualMachines", vm_name)
            if vm["properties"].get("evictionPolicy") == "Delete":
                self.resources.pop(vm["id"].lower(), None)
                self._vm_deleted(vm)
            else:
                # The platform's deallocation is an operation on the VM (its ProvisioningState time).
                vm["properties"].update(_power="deallocated", _provisioned_at=time.time())
            self._machine("power_off", vm)


def _arm_time(at: float) -> str:
    """An instance view status time as ARM writes it: seven fractional digits, an offset."""
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0+00:00"


# ARM's limit on osProfile.customData, in base64 characters (64 KiB decoded).
CUSTOM_DATA_MAX_CHARS = 87380


def _is_base64(text: str) -> bool:
    import base64
    import binascii

    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _deep_assignment(low: list[str]) -> int | None:
    """Where `.../providers/microsoft.authorization/roleassignments[/name]` starts in a path whose
    scope is a resource inside a resource group (index of that `providers`), else None."""
    for at in range(8, len(low) - 2):
        if low[at:at + 3] == ["providers", "microsoft.authorization", "roleassignments"] and len(low) <= at + 4 \
                and low[2] == "resourcegroups":
            return at
    return None


def _rbac_action(request: ArmRequest) -> str:
    """The Azure RBAC action a request needs, e.g. Microsoft.Compute/virtualMachines/write."""
    parts = [p for p in request.path.split("/") if p]
    action = parts.pop() if request.method == "POST" else None
    low = [p.lower() for p in parts]
    if "providers" in low[2:]:
        at = len(low) - 1 - low[::-1].index("providers")
        base = "/".join([parts[at + 1], *parts[at + 2::2]])
    else:
        base = "Microsoft.Resources/subscriptions/resourceGroups"
    if action:
        return f"{base}/{action}/action"
    return f"{base}/" + {"PUT": "write", "PATCH": "write", "DELETE": "delete"}.get(request.method, "read")


# What `permissions` lists for the built-in roles (their role definitions' permissions, abridged).
ROLE_PERMISSIONS = {
    "Owner": {"actions": ["*"], "notActions": []},
    "Contributor": {"actions": ["*"], "notActions": [
        "Microsoft.Authorization/*/Delete", "Microsoft.Authorization/*/Write",
        "Microsoft.Authorization/elevateAccess/Action", "Microsoft.Blueprint/blueprintAssignments/write",
        "Microsoft.Blueprint/blueprintAssignments/delete", "Microsoft.Compute/galleries/share/action"]},
    "Virtual Machine Contributor": {"actions": ["Microsoft.Compute/virtualMachines/*", "*/read"], "notActions": []},
    "Reader": {"actions": ["*/read"], "notActions": []},
}


def _role_allows(role: str, action: str) -> bool:
    """Whether a built-in role (by name) grants an RBAC action, as far as the fake needs."""
    read = action.endswith("/read")
    if role == "Owner":
        return True
    if role == "Contributor":  # everything but granting access
        return read or not action.startswith("Microsoft.Authorization/")
    if role == "Virtual Machine Contributor":  # VMs (incl. deallocate, delete), not the group
        return read or action.lower().startswith("microsoft.compute/virtualmachines/")
    return role == "Reader" and read


def _is_read(method: str) -> bool:
    return method in ("GET", "HEAD")


def acting_principal(vm: dict[str, Any]) -> str:
    """The principal id a VM (as ARM returns it) acts as: its one user-assigned identity's, else
    its system-assigned one's."""
    identity = vm.get("identity") or {}
    attached = [v["principalId"] for v in (identity.get("userAssignedIdentities") or {}).values()]
    return attached[0] if len(attached) == 1 else str(identity.get("principalId") or "")


def _type_name(ltype: str) -> str:
    names = {"microsoft.compute/virtualmachines": "Microsoft.Compute/virtualMachines",
             "microsoft.compute/disks": "Microsoft.Compute/disks",
             "microsoft.compute/images": "Microsoft.Compute/images",
             "microsoft.compute/galleries": "Microsoft.Compute/galleries",
             "microsoft.network/virtualnetworks": "Microsoft.Network/virtualNetworks",
             "microsoft.network/networksecuritygroups": "Microsoft.Network/networkSecurityGroups",
             "microsoft.network/publicipaddresses": "Microsoft.Network/publicIPAddresses",
             "microsoft.network/networkinterfaces": "Microsoft.Network/networkInterfaces",
             "microsoft.managedidentity/userassignedidentities": "Microsoft.ManagedIdentity/userAssignedIdentities"}
    if ltype not in names:
        raise ArmError("NoRegisteredProviderFound", f"No registered resource provider found for type '{ltype}'.", 400)
    return names[ltype]


def _location(value: Any, what: str) -> str:
    if not value:
        raise ArmError("LocationRequired", "The location property is required for this definition.", 400)
    location = str(value).lower().replace(" ", "")
    if location not in REGIONS:
        raise ArmError("LocationNotAvailableForResourceType", f"The provided location '{value}' is not available for "
                       f"resource type '{what}'. List of available regions: '{','.join(REGIONS)}'.", 400)
    return location


# the server --------------------------------------------------------------------------------------


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """An EC P-256 certificate for 127.0.0.1 and localhost, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cloudtrain fake ARM")])
    now = datetime.datetime.now(datetime.UTC)
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "arm-cert.pem", directory / "arm-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


class ArmServer(FakeArm):
    """FakeArm served over HTTPS on 127.0.0.1 by werkzeug, in a thread."""

    def __init__(self, directory: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.directory = directory
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.ca_bundle = directory / "ca-bundle.pem"

    def start(self) -> ArmServer:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None

        self.directory.mkdir(parents=True, exist_ok=True)
        cert, key = _self_signed(self.directory)
        # Our certificate only: loading a full CA bundle costs ~60 ms per connection, and the dev
        # server closes every connection. In-test HTTPS goes to the fake anyway.
        self.ca_bundle.write_text(cert.read_text())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server = make_server("127.0.0.1", 0, self, threaded=True, ssl_context=context, request_handler=Quiet)
        self._base = self.url
        self._thread = serve(self._server, "fake-arm")
        # ARM finishes an operation whether or not anyone polls it (a CLI killed after its PUT still
        # leaves a VM that boots): end due operations in the background too, not only on requests.
        self._ticking = threading.Event()
        self._ticker = threading.Thread(target=self._tick_until_stopped, name="fake-arm-ops", daemon=True)
        self._ticker.start()
        return self

    def _tick_until_stopped(self) -> None:
        while not self._ticking.wait(0.2):
            with self.lock:
                self._tick()

    def stop(self) -> None:
        self.faults.clear()
        for timer in self.deadline_timers:
            timer.cancel()
        if getattr(self, "_ticker", None) is not None:
            self._ticking.set()
            self._ticker.join(timeout=10)
        stop_serving(self._server, self._thread)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_port}"

    def env(self) -> dict[str, str]:
        """A service principal for azure-identity's EnvironmentCredential, and trust in our certificate."""
        return {"AZURE_TENANT_ID": TENANT, "AZURE_CLIENT_ID": CLIENT_ID, "AZURE_CLIENT_SECRET": CLIENT_SECRET,
                "AZURE_SUBSCRIPTION_ID": self.subscription, "REQUESTS_CA_BUNDLE": str(self.ca_bundle)}

    def config(self, region: str | None = None) -> dict[str, str]:
        """The `azure:` section of cloudtrain's config.yaml that points at this server."""
        section = {"subscription_id": self.subscription, "arm_endpoint": self.url, "authority": self.url}
        if region:
            section["region"] = region
        return section

    def credential(self) -> Any:
        from azure.identity import ClientSecretCredential

        return ClientSecretCredential(TENANT, CLIENT_ID, CLIENT_SECRET, authority=self.url,
                                      disable_instance_discovery=True, connection_verify=str(self.ca_bundle))

    def client(self, kind: str) -> Any:
        """A real SDK client ("compute", "network", "resource", "authorization") talking to this server."""
        kwargs = {"base_url": self.url, "credential_scopes": [f"{self.url}/.default"], "polling_interval": 0,
                  "connection_verify": str(self.ca_bundle)}
        if kind == "compute":
            from azure.mgmt.compute import ComputeManagementClient as Client
        elif kind == "network":
            from azure.mgmt.network import NetworkManagementClient as Client  # type: ignore[assignment]
        elif kind == "resource":
            from azure.mgmt.resource.resources import ResourceManagementClient as Client  # type: ignore[assignment]
        elif kind == "authorization":
            from azure.mgmt.authorization import AuthorizationManagementClient as Client  # type: ignore[assignment]
        else:
            raise ValueError(f"unknown client kind {kind!r}")
        return Client(self.credential(), self.subscription, **kwargs)

    def route_public_ips(self, factory: Any, vm: Any) -> None:
        """Route every public IP allocated from now on to the sshd VM `vm` (SshdFactory.route)."""
        self.public_ip_hooks.append(lambda address: factory.route(address, vm))

    def authorized_keys_command(self) -> str:
        """An sshd AuthorizedKeysCommand printing the SSH keys of the fake's running VMs."""
        return " ".join([sys.executable, "-m", "cloudtrain.testing.azure", "authorized-keys", self.url,
                         str(self.ca_bundle)])

    def create_image(self, group: str, name: str, *, ssh_user: str | None = None, region: str = "eastus",
                     disk_gb: int = 30, gallery: str | None = None) -> str:
        """A managed image, or with `gallery` a gallery image definition (usable in every region),
        tagged `cloudtrain-ssh-user` when given, in resource group `group`; returns its id."""
        with self.lock:
            rg_id = f"/subscriptions/{self.subscription}/resourceGroups/{group}"
            self.resources.setdefault(rg_id.lower(), {"id": rg_id, "name": group, "location": region, "tags": {},
                                                      "type": "Microsoft.Resources/resourceGroups",
                                                      "properties": {"provisioningState": "Succeeded"}})
            parent, kind = f"{rg_id}/providers/Microsoft.Compute", "Microsoft.Compute/images"
            if gallery:
                parent += f"/galleries/{gallery}"
                self.resources.setdefault(parent.lower(), {"id": parent, "name": gallery, "location": region,
                                                           "type": "Microsoft.Compute/galleries", "tags": {},
                                                           "properties": {"provisioningState": "Succeeded"}})
                kind = "Microsoft.Compute/galleries/images"
            image_id = f"{parent}/images/{name}"
            self.resources[image_id.lower()] = {
                "id": image_id, "name": name, "type": kind, "location": region,
                "tags": {"cloudtrain-ssh-user": ssh_user} if ssh_user else {},
                "properties": {"provisioningState": "Succeeded", "osDiskSizeGB": disk_gb, "osType": "Linux",
                               "osState": "Generalized"}}
            return image_id


_AZURE_VARS_TO_CLEAR = (
    "AZURE_AUTHORITY_HOST", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_CLIENT_CERTIFICATE_PASSWORD", "AZURE_USERNAME",
    "AZURE_PASSWORD", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT",
    "MSI_SECRET", "AZURE_CONFIG_DIR",
)


@pytest.fixture
def arm_server(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArmServer]:
    """A fresh fake ARM per test; the environment holds its service principal and CA bundle."""
    server = ArmServer(tmp_path_factory.mktemp("arm")).start()
    for name in _AZURE_VARS_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.stop()


FAULT_KINDS = {  # AzureCloud.fail(kind): (code, action)
    "capacity": ("AllocationFailed", "vm.create"),  # accepted, then the allocation fails: next placement
    "sku": ("SkuNotAvailable", "vm.create"),  # refused at once: next placement
    "quota": ("OperationNotAllowed", "vm.create"),  # the region's quota: next region
    "auth": ("AuthorizationFailed", "*"),  # every ARM call refused
}


# Azure's default inbound rules of every NSG (docs: "Network security groups", default security
# rules), in the route map's format: the virtual network and the load balancer, then deny all.
_VNET_SOURCES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
NSG_DEFAULT_INBOUND = (
    {"name": "AllowVnetInBound", "priority": 65000, "action": "allow", "sources": _VNET_SOURCES, "ports": []},
    {"name": "AllowAzureLoadBalancerInBound", "priority": 65001, "action": "allow",
     "sources": ["168.63.129.16/32"], "ports": []},
    {"name": "DenyAllInBound", "priority": 65500, "action": "deny", "sources": ["0.0.0.0/0"], "ports": []},
)
_SERVICE_TAGS = {"*": ["0.0.0.0/0"], "internet": ["0.0.0.0/0"], "any": ["0.0.0.0/0"],
                 "virtualnetwork": _VNET_SOURCES, "azureloadbalancer": ["168.63.129.16/32"]}


def _nsg_rules(nsg: dict[str, Any]) -> list[dict[str, Any]]:
    """An NSG's own inbound TCP rules, as the route map's rules."""
    found = []
    for rule in nsg["properties"].get("securityRules", []):
        props = rule.get("properties") or {}
        if str(props.get("direction", "")).lower() != "inbound" or str(props.get("protocol")).lower() not in (
                "tcp", "*"):
            continue
        prefixes = props.get("sourceAddressPrefixes") or [props.get("sourceAddressPrefix")]
        sources = [c for p in prefixes if p for c in _SERVICE_TAGS.get(str(p).lower(), [str(p)])]
        ports = props.get("destinationPortRanges") or [props.get("destinationPortRange")]
        found.append({"name": rule.get("name", ""), "priority": int(props["priority"]),
                      "action": "allow" if str(props["access"]).lower() == "allow" else "deny", "sources": sources,
                      "ports": [] if "*" in ports else [str(p) for p in ports if p]})
    return found


class AzureCloud(FakeCloud):
    """`cloud: azure` against the fake ARM, for one test (see the `azure_cloud` fixture).

    server      this test's ArmServer; `faults` is its injector (add, count, hold)
    machines    CloudMachines: `machines.vm(vm_arm_id)` is the sshd VM behind a fake VM
    image       a gallery image (every region) whose VMs log in as the sshd VMs' user
    metadata    the VMs' IMDS (a MetadataServer, given or started here): ARM takes its token as
                the VMs' managed identities' (FakeArm.accept_identity_token), allowed what their
                role assignments give. `watchdog_env()` points a watchdog at it and trusts ARM's
                certificate, so autostop and budget deallocate or delete VMs through the fake.
    """

    name = "azure"
    machine_fields = ("region", "zone", "instance_type", "accelerators", "cpus", "memory", "spot", "disk_gb")
    region = "eastus"
    allowed_cidr = "203.0.113.7/32"  # TEST-NET-3: the "caller's address" the NSG admits
    instance_type = "Standard_D2s_v5"

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, server: ArmServer, machines: CloudMachines,
                 *, hint: str = "t", metadata: MetadataServer | None = None) -> None:
        self.server = server
        self.faults = server.faults
        self.machines = machines
        self._own_metadata = metadata is None
        self.metadata = metadata if metadata is not None else MetadataServer().start()
        server.accept_identity_token(self.metadata.token_for("imds"))
        # The sshd VMs accept the user running the tests (root in CI), which Azure itself refuses
        # as an admin user: the fake is told to allow it, and the image asks for it.
        server.allowed_admin_users = server.allowed_admin_users | {machines.user}
        self.image = server.create_image("cloudtrain-test-images", "vm", ssh_user=machines.user, gallery="kit",
                                         region=self.region)
        for name in _AZURE_VARS_TO_CLEAR:
            monkeypatch.delenv(name, raising=False)
        # Every watchdog action goes to the fake (the VMs are sshd processes on the test machine).
        super().__init__(root, monkeypatch, env={**server.env(), **self.watchdog_env()}, hint=hint,
                         config={"ssh": {"proxy_command": machines.proxy_command, "allowed_cidr": self.allowed_cidr},
                                 "azure": server.config(self.region)})
        self.move_caller(self.allowed_cidr.split("/")[0], reconfigure=False)
        # What Azure would bill, from the fake ARM's own machine events (cloudtrain/testing/bill.py).
        self.bill = FakeBill("azure")
        server.machine_hooks.append(self._observe)
        server.network_hooks.append(self._follow_rules)

    def move_caller(self, address: str, *, reconfigure: bool = True) -> None:
        """The test's connections now come from `address` (the NSG sees this source); with
        `reconfigure`, cloudtrain's config says so too (`ssh.allowed_cidr`)."""
        self.machines.factory.set_source(address)
        if reconfigure:
            self.allowed_cidr = f"{address}/32"
            self.configure(ssh={"allowed_cidr": self.allowed_cidr})

    def _follow_rules(self) -> None:
        """Every VM's public address gets the NSG layers in front of it, evaluated for every SSH
        connection the kit routes there (cloudtrain.testing.route)."""
        with self.server.lock:  # no _tick here: this runs from inside the fake's own requests and hooks
            found = [(self.server.public_ip_of(vm), self.server.ingress_rules(vm))
                     for vm in self.server._all("microsoft.compute/virtualmachines")]
        for address, layers in found:
            if address:
                self.machines.factory.set_ingress(address, layers)

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        """`{cloud: azure, instance_type: Standard_D2s_v5, image: <the kit's gallery image>}`: no
        region, so the plan starts in the cheapest (ties: the config's eastus) and fails over."""
        resources: dict[str, Any] = {"cloud": "azure", "image": self.image}
        if not {"instance_type", "accelerators", "cpus", "memory"} & overrides.keys():
            resources["instance_type"] = self.instance_type
        resources.update(overrides)
        return resources

    def fail(self, kind: str, *, regions: Iterable[str] | None = None, times: int | None = None,
             message: str | None = None, action: str | None = None) -> Fault:
        """Make ARM refuse: "capacity" (AllocationFailed after the VM is accepted), "sku"
        (SkuNotAvailable), "quota" (OperationNotAllowed: quota), "auth" (AuthorizationFailed on
        every call), or any ARM error code (on VM creation unless `action=`)."""
        code, default_action = FAULT_KINDS.get(kind, (kind, "vm.create"))
        return self.faults.add(code, action=action or default_action, regions=regions, times=times, message=message)

    def groups(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """Resource groups of this test's clusters (or of `cluster`), as ARM JSON."""
        names = {cluster} if cluster else set(self.clusters)
        return [g for g in self.server.find("Microsoft.Resources/resourceGroups")
                if (g.get("tags") or {}).get("cloudtrain-cluster") in names]

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        found += [f"azure resource group {g['name']} in {g['location']}" for g in self.groups()]
        billed = ("Microsoft.Compute/virtualMachines", "Microsoft.Compute/disks", "Microsoft.Network/publicIPAddresses")
        for kind in billed:
            for item in self.server.find(kind):
                ours = (item.get("tags") or {}).get("cloudtrain-cluster") in self.clusters
                if ours or "/resourcegroups/cloudtrain-" in item["id"].lower():
                    found.append(f"azure {kind.split('/')[1]} {item['name']} ({item['id'].split('/')[4]})")
        return sorted(set(found))

    def watchdog_env(self) -> dict[str, str]:
        """The test-only watchdog knobs (docs/watchdog.md) that send a VM's watchdog to this fake:
        its token from `metadata` (the fake IMDS), its ARM call trusting the fake's certificate."""
        return {"CLOUDTRAIN_WATCHDOG_METADATA_URL": self.metadata.url,
                "CLOUDTRAIN_WATCHDOG_CA_FILE": str(self.server.ca_bundle)}

    def close(self) -> None:
        if self._observe in self.server.machine_hooks:
            self.server.machine_hooks.remove(self._observe)
        if self._follow_rules in self.server.network_hooks:
            self.server.network_hooks.remove(self._follow_rules)
        with self.server.lock:
            for group in self.groups():
                self.server._delete_tree(group["id"].lower())
        for _, vm in self.machines:
            vm.stop()
        self.server.forget_identity_token(self.metadata.token_for("imds"))
        if self._own_metadata:
            self.metadata.stop()

    def client(self, kind: str) -> Any:
        """A real SDK client of the fake: "compute", "network", "resource" or "authorization"."""
        return self.server.client(kind)

    def _bill(self, event: str, vm: dict[str, Any]) -> None:
        """Azure bills compute while a VM is allocated (running, or stopped from inside: only a
        deallocate ends it), each start at least 300 s, and its managed disk from creation to
        deletion: priced from the catalog (size, region, priority) and the storage table."""
        from cloudtrain.catalog import default_catalog
        from cloudtrain.cost import HOURS_PER_MONTH, disk_price

        key, props = vm["id"].lower(), vm["properties"]
        if event == "boot":
            spot = (props.get("priority") or "").lower() == "spot"
            hourly = default_catalog().price("azure", vm["location"], props["hardwareProfile"]["vmSize"], spot=spot)
            size = float(props["storageProfile"]["osDisk"].get("diskSizeGB") or 0)
            self.bill.created(key, (vm.get("tags") or {}).get("cloudtrain-cluster", ""), hourly or 0.0,
                              (disk_price("azure") or 0.0) * size / HOURS_PER_MONTH)
        elif event == "power_on":
            self.bill.started(key)
        elif self.server.resources.get(key) is None:
            self.bill.deleted(key)
        elif props.get("_power") == "deallocated":
            self.bill.stopped(key)
        # Stopped from inside ("stopped", allocated): still billed, nothing changes.

    def _observe(self, event: str, vm: dict[str, Any]) -> None:
        self._bill(event, vm)
        vm_id = vm["id"].lower()
        if event in ("boot", "power_on"):
            self._follow_rules()  # the address's rules first: no moment without them
        if event == "boot":
            keys = [k["keyData"] for k in vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]]
            self.machines.boot(vm_id, keys)
            self.machines.address(vm_id, self.server.public_ip_of(vm))
        elif vm_id in self.machines:
            (self.machines.power_on if event == "power_on" else self.machines.power_off)(vm_id)


@pytest.fixture
def azure_cloud(arm_server: ArmServer, sshd_vm_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[AzureCloud]:
    """`cloud: azure` for this test, offline, with no settings of yours (an `AzureCloud`).

    ARM and the token endpoint are this test's `arm_server`; the CLI gets a service principal from
    the environment and the fake's endpoints from its config. Each VM the fake creates boots its
    own sshd VM trusting the VM's osProfile SSH keys, reached at the VM's public IP; deallocate,
    power-off, delete and eviction power it off, start powers it on. Recipes get the kit's gallery
    image (login user: the VMs' user). `fail("capacity" | "sku" | "quota" | "auth", regions=...)`.
    `metadata` is the VMs' fake IMDS, whose token ARM takes as their managed identities';
    `watchdog_env()` the knobs that point a watchdog at it. At teardown the test's resource groups
    are deleted and its VMs stopped.
    """
    cloud = AzureCloud(tmp_path_factory.mktemp("azure-cloud"), monkeypatch, arm_server, CloudMachines(sshd_vm_factory),
                       hint=cluster_hint(request))
    try:
        yield cloud
    finally:
        cloud.close()


def _print_authorized_keys(url: str, ca_bundle: str) -> int:
    import urllib.request

    context = ssl.create_default_context(cafile=ca_bundle)
    with urllib.request.urlopen(f"{url}/_fake/authorized-keys", context=context, timeout=10) as response:
        sys.stdout.write(response.read().decode())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "authorized-keys":
        print("usage: python -m cloudtrain.testing.azure authorized-keys ARM_URL CA_BUNDLE", file=sys.stderr)
        sys.exit(2)
    sys.exit(_print_authorized_keys(sys.argv[2], sys.argv[3]))
