"""The Compute Engine plumbing under the `gcp` provider: credentials, project, clients, errors.

Credentials come from google-auth's default chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
application-default login, the metadata server on GCE, workload identity federation). The project
comes from the config (`gcp.project`), then GOOGLE_CLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, then the
credentials' own project. Every call speaks REST to `gcp.api_endpoint` when the config names one.

What goes over REST, without the SDK: the calls of every verb but `launch`. google.cloud.compute_v1
imports in 2-4 s (its package __init__ imports every service), which `status --refresh`, `stop`,
`start`, `down`, `gc` and the liveness mark would pay for a handful of requests. So these are the
REST calls the SDK's transport makes (same method, path, query and camelCase JSON body), sent here
with google-auth's AuthorizedSession (`get_json`, `post_json`, `delete_json`, `list_json`,
`aggregated_json`):
  reads     instances.get, instances.aggregatedList, firewalls.get, firewalls.list,
            disks.aggregatedList
  writes    instances.stop / start (POST .../instances/N/stop|start, no body), instances.delete,
            instances.setLabels (the liveness mark), firewalls.delete, disks.delete
  waits     zoneOperations.wait / globalOperations.wait (POST .../operations/OP/wait, no body)
None of these writes carried a requestId on the SDK path, and none does here: a repeated delete
is answered 404 (gone: done), a repeated stop or start acts on a VM already so.

What keeps the SDK (`client`, `v1`): `launch` (instances.insert with its requestId, firewalls.insert
and patch, the lookups of images, machine and accelerator types, zones and the project) and
instances.setMetadata (`grant_buckets`): building an Instance or Firewall message checks our body
against the API's schema before anything is created, and launch pays for boot minutes anyway.
Those calls answer SDK Operations; `wait` reads them as their JSON, so every wait is the same REST
long poll.

Errors: an HTTP error of a REST call is turned into google-api-core's exception by google-api-core's
own `from_http_response` (what the SDK's transport does; imported on an error only), and both paths
go through `call`, so a REST call and an SDK call fail, retry and map alike.

Long-running calls use `*_unary` (SDK) or the REST answer, and `wait`: the SDK's
`insert(...).result()` polls the public endpoint whatever endpoint the client has. `wait` is a
server-side long poll (up to about two minutes per call), so waiting never sleeps here.

Retries: what Google documents as "try again" is retried with exponential backoff and jitter,
bounded in tries and in time (`Backoff`), on every call, creates included: an HTTP 429, a 5xx that
is not a capacity answer (`insufficientCapacity` is a 503 that means "another zone"), a 403
`rateLimitExceeded` / `userRateLimitExceeded` (the quota page: retry with backoff), and an
operation that ends with `RESOURCE_OPERATION_RATE_EXCEEDED` (or an internal error), which is
issued again. A repeated request is safe: instance and firewall inserts carry a `requestId`, and
Compute Engine answers a repeated one with the first operation; names are ours and unique.
The SDK's own default retry covers only reads (get, list) on a 503 or a deadline; writes and
every other answer above have no retry below this one.

Errors come two ways, an HTTP error (google-api-core's exceptions, `errors[].reason`) or an
operation that ends DONE with `error.errors[].code`; both become a `GcpApiError` carrying every
code and message, or a CredentialsError when the credentials are refused or lack a permission.
The provider decides what a GcpApiError means for failover (see `failover_error`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from cloudtrain.errors import (
    CapacityError,
    CloudtrainError,
    CredentialsError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.base import CredentialStatus
from cloudtrain.providers.gcp.build import api_base

log = logging.getLogger("cloudtrain.providers.gcp")

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
PUBLIC_ENDPOINT = "https://compute.googleapis.com"
DEFAULT_HOST = "compute.googleapis.com"  # a self-signed JWT's audience when it has no scopes (as the SDK)
CALL_TIMEOUT_S = 60.0
# An operation's `wait` answers when it is DONE or after "the default deadline of 2 minutes": a
# shorter read timeout would fail a slow delete or stop that is going well.
WAIT_TIMEOUT_S = 150.0
OPERATION_DEADLINE_S = 20 * 60.0  # one create, start, stop or delete; `wait` returns within ~2 min
NO_CREDENTIALS = ("no GCP credentials found (run `gcloud auth application-default login` or set "
                  "GOOGLE_APPLICATION_CREDENTIALS)")
# Launching a VM that runs as a service account needs iam.serviceAccounts.actAs on that account.
CREDENTIALS_HINT = ("grant these credentials roles/compute.instanceAdmin.v1, roles/compute.securityAdmin and "
                    "roles/iam.serviceAccountUser (on the VMs' service account, gcp.service_account); "
                    "see `cloudtrain check gcp`")

# "Not in this zone now": the next zone may have it.
ZONE_CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "UNSUPPORTED_OPERATION",
    "insufficientCapacity", "RESOURCE_NOT_READY", "RESOURCE_OPERATION_RATE_EXCEEDED",
})
# Quotas are per region (every zone would say the same), or per project for GPUS_ALL_REGIONS.
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
GLOBAL_QUOTA = "GPUS_ALL_REGIONS"
# The credentials may not do this: never a reason to try elsewhere.
CREDENTIAL_CODES = frozenset({
    "forbidden", "authError", "unauthorized", "insufficientPermissions", "accessNotConfigured",
    "IAM_PERMISSION_DENIED", "PERMISSION_DENIED", "UNAUTHENTICATED", "SERVICE_DISABLED",
})
NETWORK_CODES = frozenset({"VPC_NOT_FOUND", "NETWORK_NOT_FOUND"})
# Google's "retry with exponential backoff" answers (Compute Engine: "Handle API errors", rate
# quotas): rate limits by reason, overload and internal errors by status, and the operation-level
# code for a resource changed too often. A 5xx naming capacity or quota is an answer, not a hiccup.
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_OPERATION_CODES = frozenset({"RESOURCE_OPERATION_RATE_EXCEEDED", "rateLimitExceeded", "INTERNAL_ERROR",
                                   "backendError", "internalError"})


@dataclass
class Backoff:
    """How long to keep trying a retryable answer: exponential delays from `first_s` doubling up to
    `max_s`, each jittered to 50-100% (many clients hitting one limit must not retry in step), at most
    `tries` tries and `budget_s` seconds of waiting per call. The defaults cover the quota page's
    "retry after a minute" with room to spare; `sleep` is replaceable for in-process tests."""

    first_s: float = 1.0
    max_s: float = 32.0
    tries: int = 8
    budget_s: float = 180.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def delays(self) -> Iterator[float]:
        """The waits before each further try; ends when tries or the time budget run out."""
        waited, delay = 0.0, self.first_s
        for _ in range(self.tries - 1):
            pause = delay * random.uniform(0.5, 1.0)
            if waited + pause > self.budget_s:
                return
            waited += pause
            yield pause
            delay = min(delay * 2, self.max_s)


class GcpApiError(ProviderError):
    """A Compute Engine call failed with these codes (HTTP `reason`s or operation error codes)."""

    def __init__(self, what: str, codes: Iterable[str], gcp_message: str, status: int | None) -> None:
        self.codes = tuple(dict.fromkeys(c for c in codes if c))
        self.gcp_message = gcp_message
        self.status = status
        self.what = what
        code = self.codes[0] if self.codes else (str(status) if status else "error")
        hint = None
        if set(self.codes) & NETWORK_CODES or (status == 404 and "/networks/" in gcp_message):
            hint = "cloudtrain uses the project's VPC network `default`: create it (auto mode)"
        super().__init__(f"GCP {what} failed: {code}: {gcp_message}", hint=hint)

    @property
    def code(self) -> str:
        return self.codes[0] if self.codes else ""

    @property
    def not_found(self) -> bool:
        return self.status == 404 or "notFound" in self.codes

    @property
    def retryable(self) -> bool:
        """Google says: try the same request again later (see RETRY_STATUSES)."""
        codes = set(self.codes)
        if codes & (RATE_REASONS | RETRY_OPERATION_CODES):
            return True
        answer = ZONE_CAPACITY_CODES | QUOTA_CODES | CREDENTIAL_CODES | NETWORK_CODES
        return self.status in RETRY_STATUSES and not codes & answer


def failover_error(exc: GcpApiError, where: str) -> CloudtrainError:
    """What an error means for the launch: a CapacityError naming how far it reaches (this zone,
    the region, or all of GCP for the GPUS_ALL_REGIONS quota), else the error itself (stop)."""
    codes = set(exc.codes)
    if codes & QUOTA_CODES:
        if GLOBAL_QUOTA in exc.gcp_message:
            return CapacityError(f"GPU quota of the project exhausted ({where}): {exc.gcp_message}",
                                 hint="ask for more GPUS_ALL_REGIONS quota (console: IAM & Admin > Quotas)",
                                 scope="cloud")
        return CapacityError(f"quota exhausted for {where}: {exc.code}: {exc.gcp_message}",
                             hint="ask for more quota in this region (console: IAM & Admin > Quotas)", scope="region")
    if codes & ZONE_CAPACITY_CODES:
        return CapacityError(f"no capacity for {where}: {exc.code}: {exc.gcp_message}",
                             hint="another zone, region or machine type may have capacity", scope="zone")
    return exc


class ComputeApi:
    """Credentials, project and one REST client per kind, with errors mapped to ours."""

    def __init__(self, project: str | None, region: str | None, api_endpoint: str | None) -> None:
        # No SDK here: a provider is made for every verb on a GCP cluster, `exec` and `logs` too,
        # which never call Compute Engine on their warm path; compute_v1 alone imports in 2-4 s.
        self.configured_project = project
        self.configured_region = region
        self.endpoint = api_endpoint
        self._credentials: tuple[Any, str | None] | None = None
        self._clients: dict[str, Any] = {}
        self._session: Any = None  # the AuthorizedSession of the REST reads, made on first use
        self._clients_lock = threading.Lock()
        self.backoff = Backoff()

    # the SDK, imported on first use ------------------------------------------------------------

    @property
    def v1(self) -> Any:
        """google.cloud.compute_v1: the first client or message built imports it (all of it: its
        package __init__ imports every service, so importing one submodule costs the same)."""
        from google.cloud import compute_v1

        return compute_v1

    @property
    def _auth(self) -> Any:
        import google.auth

        return google.auth

    @property
    def _auth_errors(self) -> Any:
        import google.auth.exceptions

        return google.auth.exceptions

    @property
    def _api_errors(self) -> Any:
        import google.api_core.exceptions

        return google.api_core.exceptions

    # credentials and project --------------------------------------------------------------------

    def credentials(self) -> tuple[Any, str | None]:
        """(credentials, their project) from google-auth's default chain."""
        if self._credentials is None:
            try:
                self._credentials = self._auth.default(scopes=list(SCOPES))
            except self._auth_errors.DefaultCredentialsError as exc:
                text = str(exc)
                if "not found" in text.lower() and "default credentials" in text.lower():
                    raise CredentialsError(NO_CREDENTIALS) from None
                raise CredentialsError(f"GCP credentials could not be loaded: {_first_line(text)}") from None
        return self._credentials

    def project_and_source(self) -> tuple[str | None, str]:
        if self.configured_project:
            return self.configured_project, "config gcp.project"
        for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
            if os.environ.get(name):
                return os.environ[name], name
        _, project = self.credentials()
        return project, "the credentials"

    @property
    def project(self) -> str:
        project, _ = self.project_and_source()
        if not project:
            raise UsageError("no GCP project: set gcp.project in the config or GOOGLE_CLOUD_PROJECT")
        return project

    @property
    def default_region(self) -> str | None:
        return self.configured_region or os.environ.get("CLOUDSDK_COMPUTE_REGION") or None

    def credential_source(self) -> str:
        credentials, _ = self.credentials()
        email = getattr(credentials, "service_account_email", None)
        kind = type(credentials).__module__
        if kind.endswith("service_account") and email:
            where = " (GOOGLE_APPLICATION_CREDENTIALS)" if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") else ""
            return f"service account {email}{where}"
        if kind.startswith("google.auth.compute_engine"):
            return "the VM's service account (metadata server)"
        if kind.endswith("external_account") or "identity_pool" in kind:
            return "workload identity federation"
        return "user credentials (gcloud auth application-default login)"

    # clients and calls --------------------------------------------------------------------------

    def client(self, kind: str) -> Any:
        """The SDK's client of `kind` (launch's writes and lookups): instances, firewalls, images,
        machine_types, accelerator_types, zones, projects."""
        with self._clients_lock:  # one provider serves the run's threads (the watcher's too)
            return self._client_locked(kind)

    def _client_locked(self, kind: str) -> Any:
        if kind not in self._clients:
            name = "".join(part.title() for part in kind.split("_")) + "Client"
            credentials, _ = self.credentials()
            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            self._clients[kind] = getattr(self.v1, name)(credentials=credentials, transport="rest",
                                                         client_options=options)
        return self._clients[kind]

    def session(self) -> Any:
        """The AuthorizedSession of the REST reads, with the credentials the SDK's clients get: a
        service account signs its own JWTs (no token exchange), as the SDK's transports have it."""
        with self._clients_lock:
            if self._session is None:
                from google.auth.transport.requests import AuthorizedSession
                from google.oauth2 import service_account

                credentials, _ = self.credentials()
                if isinstance(credentials, service_account.Credentials):
                    credentials = credentials.with_always_use_jwt_access(True)
                self._session = AuthorizedSession(credentials, default_host=DEFAULT_HOST)
            return self._session

    def get_json(self, what: str, path: str, /, **params: str) -> dict[str, Any]:
        """GET {endpoint}/compute/v1/projects/{project}/{path}: Compute Engine's JSON answer, with
        errors and retries as `call` has them for the SDK."""
        return self._rest(what, "GET", path, None, params)

    def post_json(self, what: str, path: str, body: dict[str, Any] | None = None, /,
                  **params: str) -> dict[str, Any]:
        """POST to `path` (e.g. zones/Z/instances/N/stop) with `body` as JSON (camelCase, as the
        SDK's transport sends it; none for stop, start and operations' wait): its answer, an
        operation for every write."""
        return self._rest(what, "POST", path, body, params)

    def delete_json(self, what: str, path: str, /, **params: str) -> dict[str, Any]:
        """DELETE `path` (an instance, a firewall rule, a disk): the operation's JSON."""
        return self._rest(what, "DELETE", path, None, params)

    def _rest(self, what: str, method: str, path: str, body: dict[str, Any] | None,
              params: dict[str, str], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """One REST call as the SDK's REST transport makes it (the JSON content type on every
        method, the body serialized, the query flat), through `call`: a retryable answer repeats
        the same request, an error becomes ours. google-api-core is imported on an error only."""
        url = f"{api_base(self.endpoint or PUBLIC_ENDPOINT)}/compute/v1/projects/{self.project}/{path}"
        session = self.session()
        data = json.dumps(body) if body is not None else None

        def send(timeout: float) -> dict[str, Any]:
            response = session.request(method, url, params=params or None, data=data, timeout=timeout,
                                       headers={"Content-Type": "application/json"})
            if response.status_code >= 400:
                # The SDK's transport does exactly this.
                raise self._api_errors.from_http_response(response)
            found: dict[str, Any] = response.json()
            return found

        return self.call(what, send, timeout=timeout)

    def list_json(self, what: str, path: str, /, **params: str) -> list[dict[str, Any]]:
        """Every item of a list call (e.g. global/firewalls), every page read (each page its own
        call, as in `aggregated_json`)."""
        found: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self.get_json(what, path, **params, **({"pageToken": token} if token else {}))
            found += page.get("items") or []
            token = page.get("nextPageToken") or ""
            if not token:
                return found

    def aggregated_json(self, what: str, kind: str, /, **params: str) -> list[tuple[str, dict[str, Any]]]:
        """(zone, item) for every item of `aggregated/{kind}` (e.g. instances) across zones, every
        page read (each page its own call: a retry repeats one page, not the listing)."""
        found: list[tuple[str, dict[str, Any]]] = []
        token = ""
        while True:
            page = self.get_json(what, f"aggregated/{kind}", **params, **({"pageToken": token} if token else {}))
            for scope, scoped in (page.get("items") or {}).items():
                if scope.startswith("zones/"):
                    found += [(scope.split("/", 1)[1], item) for item in scoped.get(kind) or ()]
            token = page.get("nextPageToken") or ""
            if not token:
                return found

    def call(self, what: str, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """One API call (or a pager read to the end by `fn`), errors turned into ours; a retryable
        answer is retried with backoff (the same request: a create's requestId makes that safe)."""
        kwargs.setdefault("timeout", CALL_TIMEOUT_S)
        delays = self.backoff.delays()
        tries = 1
        while True:
            try:
                return self._call_once(what, fn, kwargs)
            except GcpApiError as exc:
                delay = next(delays, None) if exc.retryable else None
                if delay is None:
                    if exc.retryable and tries > 1:
                        exc.message += f" (after {tries} tries)"
                        exc.args = (exc.message,)
                    raise
                log.info("gcp: %s: %s (HTTP %s); trying again in %.1f s", what, exc.code or "error", exc.status, delay)
                self.backoff.sleep(delay)
                tries += 1

    def _call_once(self, what: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        try:
            return fn(**kwargs)
        except self._api_errors.GoogleAPICallError as exc:
            raise self._api_error(what, exc) from None
        except self._auth_errors.RefreshError as exc:
            raise CredentialsError(f"GCP refused the credentials ({what}): {_first_line(str(exc))}",
                                   hint="log in again (`gcloud auth application-default login`)") from None
        except self._auth_errors.GoogleAuthError as exc:
            raise CredentialsError(f"GCP credentials failed ({what}): {_first_line(str(exc))}") from None
        except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
            raise ProviderError(f"GCP {what}: could not reach {self.endpoint or PUBLIC_ENDPOINT}: "
                                f"{_network_reason(exc)}") from None

    def aggregated(self, what: str, fn: Callable[..., Any], field: str, /, **request: Any) -> list[tuple[str, Any]]:
        """(zone, item) for every item of an aggregatedList, across zones."""
        def read(timeout: float) -> list[tuple[str, Any]]:
            found = []
            for scope, scoped in fn(request=request, timeout=timeout):
                if scope.startswith("zones/"):
                    found += [(scope.split("/", 1)[1], item) for item in getattr(scoped, field)]
            return found

        return self.call(what, read)

    def wait(self, what: str, operation: Any, zone: str | None = None,
             again: Callable[[], Any] | None = None) -> dict[str, Any]:
        """Wait for a zonal (or global, zone None) operation to be DONE; its errors raised as ours.
        `operation`: its JSON (the REST writes' answer), or the SDK's Operation (launch's writes),
        read as its JSON; the waiting itself is REST either way. `again`: issues the request anew
        (a fresh requestId), for an operation that ended with a retryable code
        (RESOURCE_OPERATION_RATE_EXCEEDED): tried with backoff, as `call` does."""
        delays = self.backoff.delays()
        while True:
            try:
                return self._wait_once(what, _operation_json(operation), zone)
            except GcpApiError as exc:
                delay = next(delays, None) if exc.retryable and again is not None else None
                if delay is None or again is None:
                    raise
                log.info("gcp: %s: %s; issuing it again in %.1f s", what, exc.code, delay)
                self.backoff.sleep(delay)
                operation = again()

    def _wait_once(self, what: str, operation: dict[str, Any], zone: str | None) -> dict[str, Any]:
        deadline = time.monotonic() + OPERATION_DEADLINE_S
        while operation.get("status") != "DONE":
            name = str(operation.get("name", ""))
            if time.monotonic() > deadline:
                raise ProviderError(f"GCP {what}: operation {name} not done after "
                                    f"{OPERATION_DEADLINE_S / 60:.0f} min", hint="see the console's operations list")
            # zoneOperations.wait / globalOperations.wait: POST, no body; a long poll on the server.
            scope = f"zones/{quote(zone, safe='')}" if zone else "global"
            operation = self._rest(what, "POST", f"{scope}/operations/{quote(name, safe='')}/wait", None, {},
                                   timeout=WAIT_TIMEOUT_S)
        errors = [e for e in (operation.get("error") or {}).get("errors") or [] if isinstance(e, dict)]
        if errors:
            error = GcpApiError(what, [str(e.get("code", "")) for e in errors],
                                "; ".join(str(e["message"]) for e in errors if e.get("message")),
                                operation.get("httpErrorStatusCode") or None)
            if set(error.codes) & CREDENTIAL_CODES:
                raise CredentialsError(f"GCP denied {what}: {error.gcp_message}", hint=CREDENTIALS_HINT)
            raise error
        return operation

    def _api_error(self, what: str, exc: Any) -> CloudtrainError:
        reasons = [e.get("reason", "") for e in (exc.errors or []) if isinstance(e, dict)]
        if getattr(exc, "reason", None):
            reasons.append(exc.reason)
        message = _rest_message(exc)
        status = getattr(exc, "code", None)
        codes = set(reasons)
        if status == 401 or (codes & CREDENTIAL_CODES) or (status == 403 and not codes & (QUOTA_CODES | {
                "rateLimitExceeded", "userRateLimitExceeded"})):
            return CredentialsError(f"GCP denied {what}: {message}", hint=CREDENTIALS_HINT)
        return GcpApiError(what, reasons, message, status)

    def check_credentials(self) -> CredentialStatus:
        """One cheap authenticated call (a page of zones) says whether these credentials work here."""
        try:
            source = self.credential_source()
            project, where = self.project_and_source()
        except CredentialsError as exc:
            return CredentialStatus("gcp", False, exc.one_line(), set_up=exc.message != NO_CREDENTIALS)
        if not project:
            return CredentialStatus("gcp", False, f"{source}: no project (set gcp.project in the config or "
                                                  "GOOGLE_CLOUD_PROJECT)")
        try:
            # Over REST, as the SDK's client would send it: `gc` and `check` need no compute_v1
            # (2-4 s of import) to learn that the credentials work.
            self._rest("listing zones", "GET", "zones", None, {"maxResults": "1"}, timeout=15.0)
        except CloudtrainError as exc:
            return CredentialStatus("gcp", False, f"{source}, project {project}: {exc.one_line()}")
        region = self.default_region
        place = f"region {region}" if region else "no default region (set gcp.region or name one in recipes)"
        return CredentialStatus("gcp", True, f"{source}, project {project} (from {where}), {place}")


def _operation_json(operation: Any) -> dict[str, Any]:
    """An operation as Compute Engine's JSON: as it is, or an SDK Operation written out (enums by
    name, camelCase: what its REST transport read)."""
    if isinstance(operation, dict):
        return operation
    found: dict[str, Any] = json.loads(type(operation).to_json(operation, use_integers_for_enums=False))
    return found


def _rest_message(exc: Any) -> str:
    """The API's own message (google-api-core prefixes it with the method and URL)."""
    response = getattr(exc, "response", None)
    try:
        return str(response.json()["error"]["message"])
    except Exception:  # noqa: BLE001 - not JSON, or not that shape: fall back to the exception text
        text = str(getattr(exc, "message", "") or exc)
        return text.split(": ", 1)[1] if text.startswith(("GET ", "POST ", "DELETE ", "PATCH ", "PUT ")) else text


def _network_reason(exc: OSError) -> str:
    """'Connection refused' rather than urllib3's whole retry story."""
    text = str(exc)
    found = re.findall(r"\[Errno -?\d+\] ([^\"')\]]+)", text)
    return found[-1].strip() if found else (_first_line(text) or type(exc).__name__)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
