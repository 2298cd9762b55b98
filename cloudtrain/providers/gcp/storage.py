"""The identity a GCP node reads and writes its buckets with (docs/data.md): the VM's service
account, given bucket-level IAM bindings for exactly the recipe's buckets.

Per bucket in the recipe, one binding per role: `roles/storage.objectViewer` for a data source,
`roles/storage.objectCreator` for the upload, for `serviceAccount:<the VM's account>`, each with an
IAM condition that both confines it and marks it as this cluster's:

    title        cloudtrain-<cluster>
    description  cloudtrain-cluster=<cluster> cloudtrain-owner=<owner>: ...
    expression   resource.name == "projects/_/buckets/B" ||
                 resource.name.startsWith("projects/_/buckets/B/objects/PREFIX/")

(listing is checked on the bucket, reads and writes on the objects: so objects outside the prefix
can be listed but not read, and the upload writes only under its prefix). Bindings are not
resources with labels: the title is how `down` and `gc` find this cluster's, and the description
whose they are, like the firewall rules' descriptions. Conditions need policy version 3 and
uniform bucket-level access on the bucket (GCS refuses them otherwise: said in one line).

Calls: the JSON API's buckets.getIamPolicy / setIamPolicy (read-modify-write with the policy's
etag, again on a 412) and buckets.list (what `gc` scans: the project's buckets), through
google-auth's AuthorizedSession with the launching credentials. `STORAGE_EMULATOR_HOST` (the
variable Google's own clients read for an emulator) points them elsewhere, as it points the
nodes' copy (buckets/steps.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

from cloudtrain.buckets.grants import BucketGrant
from cloudtrain.buckets.url import Store
from cloudtrain.errors import CredentialsError, ProviderError
from cloudtrain.providers.base import ClusterResource
from cloudtrain.providers.gcp.api import ComputeApi, log

PUBLIC_STORAGE = "https://storage.googleapis.com"
READER = "roles/storage.objectViewer"
WRITER = "roles/storage.objectCreator"
POLICY_VERSION = 3  # conditions
ETAG_TRIES = 5
# Scopes a VM needs for the bucket copy; reading alone needs only read_only.
READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
HINT = ("the launching credentials need storage.buckets.getIamPolicy and setIamPolicy on the bucket "
        "(roles/storage.admin, or the bucket's owner); see docs/data.md")


def endpoint() -> str:
    return (os.environ.get("STORAGE_EMULATOR_HOST") or PUBLIC_STORAGE).rstrip("/")


def gcs_grants(grants: Iterable[BucketGrant]) -> list[BucketGrant]:
    return [g for g in grants if g.url.store is Store.GCS]


def scopes_for(grants: Sequence[BucketGrant]) -> list[str]:
    gs = gcs_grants(grants)
    if not gs:
        return []
    return [WRITE_SCOPE if any(g.write for g in gs) else READ_SCOPE]


def title(cluster: str) -> str:
    return f"cloudtrain-{cluster}"


def description(cluster: str, owner: str) -> str:
    return f"cloudtrain-cluster={cluster} cloudtrain-owner={owner}: the nodes' access to the recipe's buckets"


def _claimed(binding: dict[str, Any]) -> tuple[str, str] | None:
    """(cluster, owner) of one of our bindings, from its condition's description; None: not ours."""
    text = str((binding.get("condition") or {}).get("description", ""))
    fields = dict(part.split("=", 1) for part in text.partition(":")[0].split() if "=" in part)
    if "cloudtrain-cluster" not in fields or "cloudtrain-owner" not in fields:
        return None
    return fields["cloudtrain-cluster"], fields["cloudtrain-owner"]


def binding_for(grant: BucketGrant, cluster: str, owner: str, member: str) -> dict[str, Any]:
    bucket = f"projects/_/buckets/{grant.url.bucket}"
    objects = f"{bucket}/objects/" + (f"{grant.url.prefix}/" if grant.url.prefix else "")
    expression = f'resource.name.startsWith("{objects}")'
    if not grant.write:
        expression = f'resource.name == "{bucket}" || ' + expression
    return {"role": WRITER if grant.write else READER, "members": [member],
            "condition": {"title": title(cluster), "description": description(cluster, owner),
                          "expression": expression}}


class GcsApiError(ProviderError):
    def __init__(self, message: str, status: int, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


class BucketBindings:
    """This cluster's bindings on its buckets: `bind`, `unbind`, `list` (see the module doc)."""

    def __init__(self, api: ComputeApi, owner: str | None) -> None:
        self.api = api
        self.owner = owner
        self._session: Any = None

    def _http(self) -> Any:
        if self._session is None:
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = self.api.credentials()
            self._session = AuthorizedSession(credentials)
        return self._session

    def _request(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{endpoint()}/storage/v1/{path}"
        try:
            response = self._http().request(method, url, timeout=60, **kwargs)
        except OSError as exc:
            raise ProviderError(f"GCS {what}: could not reach {endpoint()}: {exc}") from None
        if response.status_code < 300:
            return response.json()
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        if response.status_code in (401, 403):
            raise CredentialsError(f"GCS denied {what}: {message}", hint=HINT)
        raise GcsApiError(f"GCS {what}: HTTP {response.status_code}: {message}", response.status_code,
                          hint="enable uniform bucket-level access on the bucket (IAM conditions need it)"
                          if "uniform" in message else None)

    def _policy(self, bucket: str) -> dict[str, Any]:
        return self._request(f"reading the IAM policy of gs://{bucket}", "GET", f"b/{quote(bucket, safe='')}/iam",
                             params={"optionsRequestedPolicyVersion": POLICY_VERSION})

    def _rewrite(self, bucket: str, cluster: str, add: list[dict[str, Any]]) -> bool:
        """Replace this cluster's bindings on `bucket` by `add`; True when the policy changed."""
        for _ in range(ETAG_TRIES):
            policy = self._policy(bucket)
            kept = [b for b in policy.get("bindings", []) if not (
                (b.get("condition") or {}).get("title") == title(cluster) and _claimed(b) is not None)]
            bindings = kept + add
            if bindings == policy.get("bindings", []):
                return False
            body = {"bindings": bindings, "etag": policy.get("etag"), "version": POLICY_VERSION}
            try:
                self._request(f"setting the IAM policy of gs://{bucket}", "PUT", f"b/{quote(bucket, safe='')}/iam",
                              json=body)
                return True
            except GcsApiError as exc:
                if exc.status != 412:  # 412: changed since read, read again
                    raise
        raise ProviderError(f"GCS: the IAM policy of gs://{bucket} kept changing while cloudtrain set it",
                            hint="try again")

    def bind(self, cluster: str, owner: str, member: str, grants: Sequence[BucketGrant],
             previous: Iterable[str] = (), scan: bool = False) -> None:
        """`member` may reach exactly `grants`' GCS buckets as this cluster: its bindings are added
        there and taken off `previous` buckets (and with `scan` the project's) the grants no
        longer name."""
        wanted: dict[str, list[dict[str, Any]]] = {}
        for grant in gcs_grants(grants):
            wanted.setdefault(grant.url.bucket, []).append(binding_for(grant, cluster, owner, member))
        for bucket, add in wanted.items():
            self._rewrite(bucket, cluster, add)
        for bucket in sorted(set(previous) | (self.scanned(cluster) if scan else set())):
            if bucket not in wanted:
                self._rewrite(bucket, cluster, [])

    def unbind(self, cluster: str, buckets: Iterable[str]) -> list[str]:
        """Remove this cluster's bindings from `buckets`; returns where there were some."""
        removed = []
        for bucket in sorted(set(buckets)):
            try:
                if self._rewrite(bucket, cluster, []):
                    removed.append(bucket)
            except GcsApiError as exc:
                if exc.status != 404:  # a bucket deleted meanwhile has no binding left
                    raise
        return removed

    def unbind_quietly(self, cluster: str, buckets: Iterable[str]) -> None:
        try:
            self.unbind(cluster, buckets)
        except (ProviderError, CredentialsError) as exc:
            log.warning("gcp: could not remove the bucket bindings of cluster %s: %s; `cloudtrain gc` finds them "
                        "on the project's buckets", cluster, exc.one_line())

    def scanned(self, cluster: str) -> set[str]:
        """The project's buckets holding this cluster's bindings; none when they cannot be listed
        (credentials that may not list buckets, an unreachable endpoint), said in a warning: the
        buckets the caller names are still handled, and `gc` lists what is left."""
        try:
            return {r.id for r in self.list(cluster)}
        except (CredentialsError, ProviderError) as exc:
            log.warning("gcp: cannot scan the project's buckets for bindings of cluster %s: %s", cluster,
                        exc.one_line())
            return set()

    def list(self, cluster: str | None = None) -> list[ClusterResource]:
        """Our bindings (of `cluster`, or every cluster; this owner's unless all owners) on the
        project's buckets, one `bucket-binding` per bucket, its id the bucket's name."""
        found: dict[tuple[str, str], ClusterResource] = {}
        listed = self._request("listing the project's buckets", "GET", "b", params={"project": self.api.project})
        for item in listed.get("items", []):
            try:
                policy = self._policy(item["name"])
            except (ProviderError, CredentialsError) as exc:
                log.info("gcp: cannot read the IAM policy of gs://%s: %s", item["name"], exc.one_line())
                continue
            for binding in policy.get("bindings", []):
                claimed = _claimed(binding)
                if claimed is None or (cluster is not None and claimed[0] != cluster):
                    continue
                if self.owner is not None and claimed[1] != self.owner:
                    continue
                # A binding costs nothing; listed so that no access outlives its cluster.
                found[(claimed[0], item["name"])] = ClusterResource("gcp", claimed[0], "bucket-binding", item["name"],
                                                                    hourly_usd=0.0)
        return list(found.values())
