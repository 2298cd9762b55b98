"""The Azure plumbing under the `azure` provider: credentials, subscription, SDK clients, errors.

Credentials come from azure-identity's DefaultAzureCredential (service principal or workload
identity in the environment, managed identity, `az login`, ...), pointed at `azure.authority` when
the config names one (sovereign clouds, Azure Stack, tests). The subscription comes from the config,
then AZURE_SUBSCRIPTION_ID, then the Azure CLI's default subscription. ARM is `azure.arm_endpoint`
(default https://management.azure.com) and tokens are asked for that audience.

Every SDK call goes through `ArmApi.call` / `ArmApi.wait`, which turn azure-core exceptions into
ours: authentication, authorization and subscription problems become CredentialsError (the launch
stops at once), everything else an `AzureApiError` carrying ARM's error code for the provider to
classify (capacity, quota, not found). SDKs are imported on first use, never in the constructor.

Reads of VMs, NICs, public IPs and resource groups (`describe`, `list_tagged`, `status --refresh`,
the read before a stop, start or delete) are the REST calls the SDKs make, sent here through one
azure-core pipeline (`get_json`, `list_json`: the SDK clients' retry, bearer token and timeouts):
azure.mgmt.compute and azure.mgmt.network import in 1-2 s each, which a read has no use for, and
azure-identity has loaded azure-core already. An HTTP error is raised as the SDK raises it
(azure-core's `map_error`, then HttpResponseError) and goes through the same `call` and `translate`.
Everything that changes something keeps the SDKs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlparse

from cloudtrain.errors import CloudtrainError, CredentialsError, ProviderError
from cloudtrain.providers.base import CredentialStatus

log = logging.getLogger("cloudtrain.providers.azure")
# The SDKs log credential-chain failures at WARNING; with no handler configured Python's
# last-resort handler would print them next to our one-line error. The CLI's --debug still sees them.
for _name in ("azure", "msal"):
    logging.getLogger(_name).addHandler(logging.NullHandler())

PUBLIC_ARM = "https://management.azure.com"
KNOWN_AUTHORITY_HOSTS = ("login.microsoftonline.com", "login.microsoftonline.us", "login.chinacloudapi.cn")
DEFAULT_POLLING_S = 5.0  # between LRO polls when ARM sends no Retry-After (the SDK's own default is 30 s)
# The api-versions the installed SDKs send for the same reads (azure-mgmt-compute 39's virtualMachines
# get/list, azure-mgmt-network 33.1's networkInterfaces/publicIPAddresses list, azure-mgmt-resource
# 26's resourceGroups list/get): the JSON the read path gets is what the SDKs got.
# tests/providers/test_azure_rest.py holds them to the installed SDKs' defaults.
COMPUTE_API_VERSION = "2026-04-01"
NETWORK_API_VERSION = "2026-03-01"
RESOURCE_API_VERSION = "2025-04-01"
# The SDK clients' own settings (`_client_locked`), for the REST reads too.
RETRY_TOTAL = 4
CONNECTION_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
T = TypeVar("T")

# ARM answers that mean "these credentials may not do this here": never a reason to fail over.
CREDENTIAL_CODES = frozenset({
    "AuthorizationFailed", "LinkedAuthorizationFailed", "InvalidAuthenticationToken",
    "InvalidAuthenticationTokenTenant", "ExpiredAuthenticationToken", "AuthenticationFailed",
    "ReadOnlyDisabledSubscription", "SubscriptionNotFound", "DisallowedProvider", "RequestDisallowedByPolicy",
})
CREDENTIALS_HINT = "check `cloudtrain check azure`, the subscription and the role (Contributor) of these credentials"


class AzureApiError(ProviderError):
    """An ARM call answered with an error code (other than credentials)."""

    def __init__(self, what: str, code: str, arm_message: str, status: int | None) -> None:
        super().__init__(f"Azure {what} failed: {code}: {arm_message}")
        self.what = what
        self.code = code
        self.arm_message = arm_message
        self.status = status


def subscription_of(configured: str | None) -> tuple[str | None, str]:
    """(subscription id, where it came from): config, AZURE_SUBSCRIPTION_ID, the Azure CLI's default."""
    if configured:
        return configured, "config azure.subscription_id"
    if os.environ.get("AZURE_SUBSCRIPTION_ID"):
        return os.environ["AZURE_SUBSCRIPTION_ID"], "AZURE_SUBSCRIPTION_ID"
    profile = Path(os.environ.get("AZURE_CONFIG_DIR") or Path.home() / ".azure") / "azureProfile.json"
    try:
        # The CLI writes it with a byte-order mark.
        data = json.loads(profile.read_text(encoding="utf-8-sig"))
        default = next(s for s in data.get("subscriptions", []) if s.get("isDefault"))
        return str(default["id"]), f"Azure CLI default ({profile})"
    except (OSError, ValueError, StopIteration, KeyError, AttributeError):
        return None, ""


def credential_source() -> str:
    env = os.environ
    if env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"):
        if env.get("AZURE_CLIENT_SECRET") or env.get("AZURE_CLIENT_CERTIFICATE_PATH"):
            return f"service principal {env['AZURE_CLIENT_ID']} (environment)"
        if env.get("AZURE_FEDERATED_TOKEN_FILE"):
            return f"workload identity {env['AZURE_CLIENT_ID']}"
    return "DefaultAzureCredential (managed identity or `az login`)"


_FAILED = ("authentication failed", "aadsts", "invalid_client", "invalid_grant", "expired", "refused")


def identity_detail(message: str) -> str | None:
    """The line of DefaultAzureCredential's report that says why: the credential that was set up
    and failed (e.g. a wrong client secret), not the chain's headline nor the many credentials that
    simply are not configured here. None when none was configured at all."""
    lines = (message or "").splitlines()
    attempts = [line.strip() for line in lines if line.startswith(("\t", " ")) and ":" in line]
    if not attempts and not message.startswith("DefaultAzureCredential"):
        return first_line(message)  # a single credential's own error
    failed = [a for a in attempts if any(word in a.lower() for word in _FAILED)]
    if not failed:
        return None
    detail = failed[0]
    cut = detail.find(". ")
    return detail[: cut + 1] if cut > 0 else first_line(detail)


def first_line(text: str, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class ArmApi:
    """One credential and one client per SDK, with azure-core errors mapped to ours."""

    def __init__(
        self,
        subscription_id: str | None,
        arm_endpoint: str | None,
        authority: str | None,
        polling_interval: float | None = None,
        credential: Any = None,
    ) -> None:
        # No SDK here: a provider is made for every verb on an Azure cluster, `exec` and `logs`
        # too, which never call ARM on their warm path (see `exc`).
        self.subscription_id, self.subscription_source = subscription_of(subscription_id)
        self.arm_endpoint = (arm_endpoint or PUBLIC_ARM).rstrip("/")
        self.authority = authority.rstrip("/") if authority else None
        self.polling_interval = DEFAULT_POLLING_S if polling_interval is None else polling_interval
        self._credential = credential
        self._clients: dict[str, Any] = {}
        self._pipeline: Any = None  # the azure-core PipelineClient of the REST reads, made on first use
        self._clients_lock = threading.Lock()

    @property
    def exc(self) -> Any:
        """azure.core.exceptions, imported when an error is first read (a call has loaded it by then)."""
        import azure.core.exceptions

        return azure.core.exceptions

    # credentials and clients -----------------------------------------------------------------

    def credential(self) -> Any:
        if self._credential is None:
            from azure.identity import DefaultAzureCredential

            kwargs: dict[str, Any] = {"exclude_interactive_browser_credential": True}
            if self.authority:
                kwargs["authority"] = self.authority
                # MSAL checks unknown authority hosts against Microsoft's instance list; an
                # authority the user configured on purpose (Azure Stack, a private cloud) is trusted.
                if urlparse(self.authority).hostname not in KNOWN_AUTHORITY_HOSTS:
                    kwargs["disable_instance_discovery"] = True
            self._credential = DefaultAzureCredential(**kwargs)
        return self._credential

    def require_subscription(self) -> str:
        if not self.subscription_id:
            raise CredentialsError(
                "no Azure subscription: set azure.subscription_id in the config or AZURE_SUBSCRIPTION_ID",
                hint="`az account show --query id` prints yours",
            )
        return self.subscription_id

    def client(self, kind: str) -> Any:
        with self._clients_lock:  # one provider serves the run's threads (the watcher's too)
            return self._client_locked(kind)

    def _client_locked(self, kind: str) -> Any:
        if kind not in self._clients:
            subscription = self.require_subscription()
            kwargs: dict[str, Any] = {
                "base_url": self.arm_endpoint,
                "credential_scopes": [f"{self.arm_endpoint}/.default"],
                "polling_interval": self.polling_interval,
                "retry_total": RETRY_TOTAL,
                "connection_timeout": CONNECTION_TIMEOUT_S,
                "read_timeout": READ_TIMEOUT_S,
                "user_agent": "cloudtrain",
            }
            if kind == "compute":
                from azure.mgmt.compute import ComputeManagementClient as Client
            elif kind == "network":
                from azure.mgmt.network import NetworkManagementClient as Client  # type: ignore[assignment]
            elif kind == "resource":
                from azure.mgmt.resource.resources import (
                    ResourceManagementClient as Client,  # type: ignore[assignment]
                )
            elif kind == "authorization":
                from azure.mgmt.authorization import (
                    AuthorizationManagementClient as Client,  # type: ignore[assignment]
                )
            else:
                raise ValueError(kind)
            self._clients[kind] = Client(self.credential(), subscription, **kwargs)
        return self._clients[kind]

    @property
    def compute(self) -> Any:
        return self.client("compute")

    @property
    def network(self) -> Any:
        return self.client("network")

    @property
    def resource(self) -> Any:
        return self.client("resource")

    @property
    def authorization(self) -> Any:
        return self.client("authorization")

    def pipeline(self) -> Any:
        """The azure-core client of the REST reads: the SDK clients' policies that matter to a GET
        (request id, user agent, redirects, retries, the bearer token for ARM's scope, HTTP logging)
        and their transport timeouts. Nothing it imports is new once azure-identity is loaded."""
        with self._clients_lock:
            if self._pipeline is None:
                from azure.core import PipelineClient
                from azure.core.pipeline import policies
                from azure.core.pipeline.transport import RequestsTransport

                self.require_subscription()
                self._pipeline = PipelineClient(self.arm_endpoint, policies=[
                    policies.RequestIdPolicy(),
                    policies.UserAgentPolicy(user_agent="cloudtrain"),
                    policies.RedirectPolicy(),
                    policies.RetryPolicy(retry_total=RETRY_TOTAL),
                    # azure-mgmt-core's ARMChallengeAuthenticationPolicy is this policy with CAE on.
                    policies.BearerTokenCredentialPolicy(self.credential(), f"{self.arm_endpoint}/.default",
                                                         enable_cae=True),
                    policies.HttpLoggingPolicy(),
                ], transport=RequestsTransport(connection_timeout=CONNECTION_TIMEOUT_S, read_timeout=READ_TIMEOUT_S))
            return self._pipeline

    def url(self, path: str) -> str:
        """{arm}/subscriptions/{subscription}/{path}."""
        return f"{self.arm_endpoint}/subscriptions/{quote(self.require_subscription(), safe='')}/{path}"

    def get_json(self, what: str, url: str, /, **params: str) -> dict[str, Any]:
        """GET `url` (with `params`, api-version among them; a nextLink carries its own): ARM's JSON
        answer, its errors raised and turned into ours as `call` does for the SDK."""
        return self.call(what, self._get, url, params)

    def _get(self, url: str, params: dict[str, str]) -> dict[str, Any]:
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceExistsError,
            ResourceNotFoundError,
            ResourceNotModifiedError,
            map_error,
        )
        from azure.core.rest import HttpRequest

        response = self.pipeline().send_request(HttpRequest("GET", url, params=params or None))
        if response.status_code != 200:
            # What the SDK's operations do with an answer other than 200 (its error map, then
            # HttpResponseError), so `translate` reads the same exception.
            map_error(status_code=response.status_code, response=response, error_map={
                401: ClientAuthenticationError, 404: ResourceNotFoundError, 409: ResourceExistsError,
                304: ResourceNotModifiedError})
            raise HttpResponseError(response=response)
        found: dict[str, Any] = response.json()
        return found

    def list_json(self, what: str, url: str, /, **params: str) -> list[dict[str, Any]]:
        """Every item (`value`) of an ARM list, following nextLink to the last page (each page its
        own call; a nextLink is requested as ARM wrote it, as the SDK's pagers do)."""
        found: list[dict[str, Any]] = []
        page = self.get_json(what, url, **params)
        while True:
            found += page.get("value") or []
            link = page.get("nextLink")
            if not link:
                return found
            page = self.get_json(what, link)

    # calls -------------------------------------------------------------------------------------

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One SDK call (or a begin_* that returns a poller) with errors turned into ours."""
        try:
            return fn(*args, **kwargs)
        except self.exc.AzureError as error:
            raise self.translate(what, error) from None

    def wait(self, what: str, poller: Any) -> Any:
        """The result of a long-running operation (ARM polls are paced by Retry-After / polling_interval)."""
        try:
            return poller.result()
        except self.exc.AzureError as error:
            raise self.translate(what, error) from None

    def translate(self, what: str, error: Exception) -> CloudtrainError:
        if isinstance(error, self.exc.ClientAuthenticationError) and getattr(error, "response", None) is None:
            # From azure-identity: no credential in the chain worked, or the authority said no.
            detail = identity_detail(error.message)
            hint = "`az login`, or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET"
            if detail is None:
                return CredentialsError("no Azure credentials found (environment, managed identity, Azure CLI)",
                                        hint=hint)
            return CredentialsError(f"Azure credentials ({credential_source()}) could not get a token: {detail}",
                                    hint=hint)
        if isinstance(error, self.exc.HttpResponseError):
            code, message = error_code(error)
            if code in CREDENTIAL_CODES or error.status_code == 401:
                return CredentialsError(f"Azure refused {what}: {code}: {first_line(message)}", hint=CREDENTIALS_HINT)
            return AzureApiError(what, code, first_line(message), error.status_code)
        if isinstance(error, (self.exc.ServiceRequestError, self.exc.ServiceResponseError)):
            return ProviderError(f"could not reach Azure ({self.arm_endpoint}) for {what}: {first_line(str(error))}")
        return ProviderError(f"Azure {what} failed: {first_line(str(error))}")

    def check_credentials(self, region: str | None) -> CredentialStatus:
        source = credential_source()
        if not self.subscription_id:
            return CredentialStatus(
                "azure", False, "no subscription: set azure.subscription_id in the config or AZURE_SUBSCRIPTION_ID",
                set_up=False)
        try:
            self.credential().get_token(f"{self.arm_endpoint}/.default")
            from azure.core.rest import HttpRequest

            request = HttpRequest("GET", f"{self.arm_endpoint}/subscriptions/{self.subscription_id}",
                                  params={"api-version": "2022-12-01"})
            response = self.call("reading the subscription", self.resource.send_request, request)
        except (CredentialsError, ProviderError) as error:
            return CredentialStatus("azure", False, error.one_line())
        except (self.exc.AzureError, ValueError) as error:
            # ValueError: azure-identity refusing a malformed authority or tenant.
            return CredentialStatus("azure", False, self.translate("getting a token", error).one_line())
        used = getattr(self._credential, "_successful_credential", None)
        if used is not None and "DefaultAzureCredential" in source:
            source = type(used).__name__
        where = f"subscription {self.subscription_id} (from {self.subscription_source})"
        if response.status_code != 200:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {}
            detail = f"{error.get('code', response.status_code)}: {first_line(error.get('message', ''))}"
            return CredentialStatus("azure", False, f"{source}: {where} refused: {detail}")
        body = response.json()
        state = body.get("state", "Enabled")
        name = body.get("displayName")
        if name:
            where = f"subscription {name!r} ({self.subscription_id}, from {self.subscription_source})"
        if state != "Enabled":
            return CredentialStatus("azure", False, f"{source}: {where} is {state} (read-only): re-enable it first")
        shown = f"region {region}" if region else "no default region (set azure.region or name one in recipes)"
        return CredentialStatus("azure", True, f"{source}, {where}, {shown}")


def error_code(error: Any) -> tuple[str, str]:
    """ARM's error code and message from an HttpResponseError (initial answer or failed operation)."""
    odata = getattr(error, "error", None)
    code = getattr(odata, "code", None)
    message = getattr(odata, "message", None)
    if not code:
        try:
            body = error.response.json().get("error", {})
            code, message = body.get("code"), body.get("message")
        except (AttributeError, ValueError, TypeError):
            pass
    return str(code or f"HTTP{getattr(error, 'status_code', '')}"), str(message or getattr(error, "message", ""))
