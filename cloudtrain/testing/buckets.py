"""Wire-level object stores for tests: S3 on moto's server, with the node identity enforced.

- `S3Authorizer`: WSGI middleware in front of moto (the session's `MotoServer`). S3 requests
  signed with temporary credentials (access keys `ASIA...`, what STS and so the instance metadata
  hand out) are checked as S3 checks them: the SigV4 signature against the session's secret, then
  the action (`s3:ListBucket`, `s3:GetObject`, `s3:PutObject`, ... as the S3 API reference's
  "actions, resources and condition keys" maps them) on the bucket or object ARN against the
  role's policies, by moto's own IAM evaluator. A refusal is S3's 403 `AccessDenied` XML.
  Requests with the test's long-term keys (`AKIA...`, the "user") pass unchecked, as before.
- `S3Buckets` (fixture `s3_buckets`): the authorizer installed for one test, a boto3 S3 client
  with the user's keys, `fill()` to make a dataset of sparse/random files, and the EC2 instance
  metadata fake (`metadata_server`) answering each VM's role credentials: the instance profile
  moto recorded on the running instance -> its role -> STS AssumeRole on moto. So a node's copy
  gets credentials exactly as on EC2, and only the role's policy decides what it may read.
  `s3_buckets.cli_env()` is what the CLI needs to point nodes at the fakes.

GCS: cloudtrain/testing/gcs.py (`gcs_buckets`, a wire fake of our own: docs/data.md says why).
Azure Blob: cloudtrain/testing/blob.py (`azure_blobs`, Azurite behind an RBAC front of ours).
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import pytest

from cloudtrain.testing.aws import MotoServer
from cloudtrain.testing.metadata import MetadataServer
from cloudtrain.testing.objects import put_dataset

_CREDENTIAL = re.compile(r"Credential=(?P<key>[^/]+)/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request")
ACCOUNT_ID = "123456789012"  # moto's default account


def s3_action(method: str, key: str, query: dict[str, str]) -> str:
    """The IAM action an S3 REST request needs (S3's documented operation -> permission map)."""
    if not key:
        if method in ("GET", "HEAD") and not (query.keys() - {"list-type", "prefix", "delimiter", "max-keys",
                                                               "continuation-token", "start-after", "encoding-type",
                                                               "marker", "fetch-owner"}):
            return "ListBucket"
        if "location" in query:
            return "GetBucketLocation"
        if method == "GET" and "uploads" in query:
            return "ListBucketMultipartUploads"
        return {"PUT": "CreateBucket", "DELETE": "DeleteBucket"}.get(method, "ListBucket")
    if method in ("GET", "HEAD"):
        return "ListMultipartUploadParts" if "uploadId" in query else "GetObject"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return "PutObject"  # PUT (object, part, copy) and POST (initiate, complete multipart)


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").title()] = environ[name]
    # moto's signature check looks these up with AWS's own capitalisation.
    for wrong, right in (("X-Amz-Content-Sha256", "X-Amz-Content-SHA256"),):
        if wrong in headers:
            headers[right] = headers.pop(wrong)
    return headers


def _error(start_response: Callable[..., Any], status: int, code: str, message: str, resource: str) -> list[bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}</Message>'
            f"<Resource>{escape(resource)}</Resource><RequestId>cloudtrain-fake</RequestId></Error>").encode()
    start_response(f"{status} {'Forbidden' if status == 403 else 'Error'}",
                   [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


@dataclass
class S3Authorizer:
    """See the module doc. `decisions` records (access key, action, resource, allowed, error code)."""

    app: Callable[..., Iterable[bytes]]
    decisions: list[tuple[str, str, str, bool, str]] = field(default_factory=list)
    # Buckets whose bucket policy has an explicit Deny for every role session (a locked or another
    # account's bucket): an explicit deny wins over any identity policy, as in S3's evaluation.
    denying: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        found = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        if found is None or found.group("service") != "s3" or not found.group("key").startswith("ASIA"):
            return self.app(environ, start_response)
        from moto.core.exceptions import ServiceException
        from moto.s3.exceptions import S3AccessDeniedError as AccessDenied
        from moto.iam.access_control import S3IAMRequest

        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)  # moto reads it again
        raw_path = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
        path_only, _, query_text = raw_path.partition("?")
        query = {k: v[0] for k, v in parse_qs(query_text, keep_blank_values=True).items()}
        bucket, _, key = unquote(path_only).lstrip("/").partition("/")
        action = s3_action(environ["REQUEST_METHOD"], key, query)
        resource = f"arn:aws:s3:::{bucket}/{key}" if key else f"arn:aws:s3:::{bucket}"
        data = {"BucketName": bucket, **query} if bucket else dict(query)
        try:
            request = S3IAMRequest(account_id=ACCOUNT_ID, method=environ["REQUEST_METHOD"], path=raw_path,
                                   data=data, body=body, headers=_headers(environ), action=action)
            request.check_signature()
            if bucket in self.denying:
                raise AccessDenied()
            request.check_action_permitted(resource)
        except ServiceException as exc:
            # AccessDenied, SignatureDoesNotMatch, InvalidAccessKeyId, InvalidToken: S3 answers 403.
            self._record(found.group("key"), f"s3:{action}", resource, False, str(exc.code))
            return _error(start_response, 403, str(exc.code), str(exc.message), resource)
        self._record(found.group("key"), f"s3:{action}", resource, True, "")
        return self.app(environ, start_response)

    def _record(self, key: str, action: str, resource: str, allowed: bool, why: str) -> None:
        with self._lock:
            self.decisions.append((key, action, resource, allowed, why))

    def denied(self) -> list[tuple[str, str, str]]:
        """(action, resource, S3's error code) of every refused request."""
        with self._lock:
            return [(a, r, why) for _, a, r, ok, why in self.decisions if not ok]


@dataclass
class S3Buckets:
    """One test's S3: see the module doc."""

    server: MotoServer
    metadata: MetadataServer
    authorizer: S3Authorizer
    region: str = "us-east-1"
    _credentials: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)

    def client(self) -> Any:
        return self.server.client("s3", self.region)

    def create(self, bucket: str) -> str:
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def fill(self, bucket: str, prefix: str, files: int, total_bytes: int, seed: int = 0,
             workers: int = 8) -> dict[str, int]:
        """`files` objects under `prefix` adding up to `total_bytes`: random heads on sparse
        (zero) bodies, so every object differs and making them costs little. Returns key -> size."""
        client = self.client()
        return put_dataset(lambda k, body: client.put_object(Bucket=bucket, Key=k, Body=body), prefix, files,
                           total_bytes, seed, workers)

    def role_credentials(self) -> tuple[str, dict[str, str]] | None:
        """What EC2's instance metadata hands the VM: the credentials of the role in the instance
        profile of a running instance (moto's record), from STS AssumeRole; None without one."""
        ec2 = self.server.client("ec2", self.region, internal=True)
        arn = None
        for reservation in ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                                            "Values": ["running"]}])["Reservations"]:
            for instance in reservation["Instances"]:
                arn = (instance.get("IamInstanceProfile") or {}).get("Arn") or arn
        if arn is None:
            return None
        iam = self.server.client("iam", self.region, internal=True)
        profile = iam.get_instance_profile(InstanceProfileName=arn.rsplit("/", 1)[-1])["InstanceProfile"]
        if not profile.get("Roles"):
            return None
        role = profile["Roles"][0]
        cached = self._credentials.get(role["RoleName"])
        if cached is not None and cached[0] > time.time() + 300:
            return role["RoleName"], cached[1]
        answer = self.server.client("sts", self.region, internal=True).assume_role(
            RoleArn=role["Arn"], RoleSessionName="i-node")["Credentials"]
        creds = {"AccessKeyId": answer["AccessKeyId"], "SecretAccessKey": answer["SecretAccessKey"],
                 "Token": answer["SessionToken"], "Expiration": answer["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ")}
        self._credentials[role["RoleName"]] = (answer["Expiration"].timestamp(), creds)
        return role["RoleName"], creds

    def deny(self, bucket: str) -> None:
        """Give `bucket` a bucket policy that denies every role session (see S3Authorizer.denying)."""
        self.authorizer.denying.add(bucket)

    def cli_env(self) -> dict[str, str]:
        """For the CLI's environment: nodes find the instance metadata (and so their role) here."""
        # moto applies a role's policy at once: a node need not wait out IAM's propagation here.
        return {"CLOUDTRAIN_METADATA_URL": self.metadata.url, "CLOUDTRAIN_GRANT_PROPAGATION_S": "0"}


@pytest.fixture
def s3_buckets(moto_server: MotoServer, metadata_server: MetadataServer) -> Iterator[S3Buckets]:
    """S3 on the session's moto server with node identities enforced, and the EC2 instance
    metadata fake answering role credentials (see the module doc)."""
    assert moto_server.faults is not None
    injector = moto_server.faults
    inner = injector.app
    authorizer = S3Authorizer(inner)
    injector.app = authorizer
    buckets = S3Buckets(moto_server, metadata_server, authorizer)
    metadata_server.ec2_credentials = buckets.role_credentials
    try:
        yield buckets
    finally:
        injector.app = inner
        metadata_server.ec2_credentials = None

