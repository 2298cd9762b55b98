"""The GCS fake's identity side (testing/gcs.py): who a bearer token is, what the Cloud Storage
IAM roles allow, the subset of IAM conditions cloudtrain writes, and the JSON API's bucket IAM
(`buckets.getIamPolicy` / `setIamPolicy` at `/storage/v1/b/<bucket>/iam`, policy version 3 with
conditions and etags) and `buckets.list`, as the JSON API reference describes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from cloudtrain.testing.gcp import PROJECT_NUMBER, SERVICE_ACCOUNT, GceServer

OWNER = "owner"  # principal(): a project owner (the kit's own credentials)
ROLES = {
    "roles/storage.objectViewer": {"storage.objects.list", "storage.objects.get"},
    "roles/storage.objectCreator": {"storage.objects.create"},
    "roles/storage.objectAdmin": {"storage.objects.list", "storage.objects.get", "storage.objects.create",
                                  "storage.objects.delete"},
    "roles/storage.legacyBucketReader": {"storage.objects.list"},
    "roles/storage.legacyBucketOwner": {"storage.objects.list", "storage.objects.create", "storage.objects.delete"},
}
STORAGE_SCOPES = frozenset("https://www.googleapis.com/auth/" + s for s in (
    "devstorage.read_only", "devstorage.read_write", "devstorage.full_control", "cloud-platform",
    "cloud-platform.read-only"))
READ_ONLY_SCOPES = frozenset("https://www.googleapis.com/auth/" + s for s in (
    "devstorage.read_only", "cloud-platform.read-only"))
_TERM = re.compile(r'^resource\.name(?:\.startsWith\("(?P<prefix>[^"]*)"\)| == "(?P<exact>[^"]*)")$')


class GcsError(Exception):
    def __init__(self, status: int, code: str, message: str, details: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def condition_allows(expression: str, resource: str) -> bool:
    """The subset of CEL that cloudtrain writes; anything else is refused when the policy is set."""
    for term in (t.strip() for t in expression.split("||")):
        found = _TERM.match(term)
        if found is None:
            raise ValueError(f"unsupported condition term {term!r}")
        if found.group("prefix") is not None and resource.startswith(found.group("prefix")):
            return True
        if found.group("exact") is not None and resource == found.group("exact"):
            return True
    return False


class IamApi:
    """The JSON API routes of FakeGcs (a mixin: it uses the fake's `buckets`, `lock` and `_who`)."""

    buckets: dict[str, Any]
    lock: Any

    def _who(self, request: Any) -> tuple[str, frozenset[str]]:
        raise NotImplementedError

    def _json(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        member, _ = self._who(request)
        parts = [unquote(p) for p in request.path.split("/") if p][2:]  # after storage/v1
        ctype = {"Content-Type": "application/json; charset=UTF-8"}
        with self.lock:
            if parts == ["b"] and request.method == "GET":
                self._owner_only(member, "storage.buckets.list", f"projects/{request.args.get('project', '')}")
                items = [{"kind": "storage#bucket", "name": b.name, "id": b.name, "projectNumber": PROJECT_NUMBER,
                          "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": b.uniform}}}
                         for b in sorted(self.buckets.values(), key=lambda b: b.name)]
                return 200, ctype, json.dumps({"kind": "storage#buckets", "items": items}).encode()
            if len(parts) != 3 or parts[0] != "b" or parts[2] != "iam":
                raise GcsError(404, "notFound", f"no route for {request.method} {request.path}")
            bucket = self.buckets.get(parts[1])
            if bucket is None:
                raise GcsError(404, "notFound", "The specified bucket does not exist.")
            if request.method == "GET":
                self._owner_only(member, "storage.buckets.getIamPolicy", f"projects/_/buckets/{bucket.name}")
                wanted = int(request.args.get("optionsRequestedPolicyVersion", "1"))
                if bucket.policy_version == 3 and wanted < 3:
                    raise GcsError(400, "invalid", "Policy has conditions: request policy version 3.")
                return 200, ctype, json.dumps(bucket.policy()).encode()
            if request.method == "PUT":
                self._owner_only(member, "storage.buckets.setIamPolicy", f"projects/_/buckets/{bucket.name}")
                return 200, ctype, json.dumps(self._set_policy(bucket, json.loads(request.get_data() or b"{}"))).encode()
        raise GcsError(405, "methodNotAllowed", f"{request.method} is not allowed here")

    def _owner_only(self, member: str, permission: str, resource: str) -> None:
        if member != OWNER:
            raise GcsError(403, "forbidden", f"{member.partition(':')[2] or 'Anonymous caller'} does not have "
                                             f"{permission} access to the Google Cloud Storage resource {resource}.")

    def _set_policy(self, bucket: Bucket, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("etag") and body["etag"] != bucket.etag():
            raise GcsError(412, "conditionNotMet", "The etag does not match: the policy changed since it was read.")
        bindings = body.get("bindings") or []
        conditional = any("condition" in b for b in bindings)
        if conditional and not bucket.uniform:
            raise GcsError(400, "invalid", "IAM Conditions can only be set on a bucket with uniform bucket-level "
                                           "access enabled.")
        if conditional and int(body.get("version", 1)) < 3:
            raise GcsError(400, "invalid", "IAM Policy with conditions requires policy version 3.")
        for binding in bindings:
            if binding.get("role") not in ROLES and not str(binding.get("role", "")).startswith("roles/"):
                raise GcsError(400, "invalid", f"Role {binding.get('role')!r} is not a role.")
            if "condition" in binding:
                try:
                    condition_allows(binding["condition"].get("expression", ""), "")
                except ValueError as exc:
                    raise GcsError(400, "invalid", f"Invalid condition expression: {exc}") from None
        bucket.bindings = json.loads(json.dumps(bindings))
        bucket.policy_version = 3 if conditional else int(body.get("version", 1))
        bucket.version += 1
        return bucket.policy()


def gce_principal(gce: GceServer) -> Callable[[str], tuple[str, frozenset[str]] | None]:
    """Whose a token is, as the fake GCE knows it: the kit's own key (a project owner), or the
    metadata fake's token, standing for the service account of the running VM that holds one."""
    from google.auth import jwt

    def principal(token: str) -> tuple[str, frozenset[str]] | None:
        with gce.lock:
            if token in gce.metadata_tokens:
                for (_, _), inst in sorted(gce.instances.items()):
                    accounts = inst.get("serviceAccounts") or []
                    if inst.get("status") == "RUNNING" and accounts:
                        return f"serviceAccount:{accounts[0]['email']}", frozenset(accounts[0].get("scopes", []))
                return None
            try:
                key_id = jwt.decode_header(token).get("kid", "")
                account = gce.accounts[key_id]
                claims = jwt.decode(token, certs={key_id: account.public_pem}, verify=True)
            except Exception:  # noqa: BLE001 - an unreadable, unknown, expired or forged token: not ours
                return None
        if claims.get("iss") != account.email:
            return None
        return (OWNER, STORAGE_SCOPES) if account.email == SERVICE_ACCOUNT else (
            f"serviceAccount:{account.email}", STORAGE_SCOPES)
    return principal
