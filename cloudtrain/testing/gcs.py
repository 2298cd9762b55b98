"""Google Cloud Storage for tests: a wire fake of the XML API (what obstore speaks) and of the
JSON API's bucket IAM methods (what the gcp provider calls), with identities enforced.

Why our own: obstore's GCSStore (Rust `object_store`) lists with GCS's XML API, S3-style
`GET /<bucket>?list-type=2`; gcp-storage-emulator implements only the JSON API (501) and
fake-gcs-server answers that listing 404 (docs/data.md). Modelled on Google's references:
XML API "List objects" (GET Bucket), "GET Object", "HEAD Object", "PUT Object", "DELETE Object"
and "XML API error codes"; JSON API `buckets.getIamPolicy` / `buckets.setIamPolicy`
(`/storage/v1/b/<bucket>/iam`, policy version 3 with conditions) and `buckets.list`.

- Multipart uploads (XML API "multipart uploads": POST ?uploads, PUT ?partNumber&uploadId, POST
  ?uploadId with CompleteMultipartUpload, DELETE ?uploadId); the object's ETag is then
  `"<md5 of the parts' MD5s>-<parts>"`, not an MD5, as GCS answers.
- Objects: path-style URLs `<url>/<bucket>/<object>`; ETag is the quoted MD5 of a simple upload,
  `x-goog-hash: crc32c=...,md5=<base64>`, `x-goog-generation`, `Last-Modified`; GET honours `Range`.
  A listing is `ListBucketResult` (Name, Prefix, KeyCount, MaxKeys, IsTruncated,
  NextContinuationToken, Contents{Key, Generation, MetaGeneration, LastModified, ETag, Size,
  StorageClass}, CommonPrefixes with `delimiter`), at most `max-keys` (1000) per page.
- Errors: `<Error><Code>..</Code><Message>..</Message><Details>..</Details></Error>` with GCS's
  status codes: 403 AccessDenied (details name the caller and the permission, as GCS words them),
  404 NoSuchBucket / NoSuchKey, 401 AuthenticationRequired for a token nobody issued; JSON errors
  as `{"error": {"code", "message", "errors": [{"reason", ...}]}}`.
- Who asks: a bearer token. `principal(token)` (set by the fixture) says whose it is: the kit's
  service-account key (the test's own, user credentials) is a project owner, allowed everything;
  the metadata fake's GCE token is the service account of the running VM (the fake GCE's record,
  `serviceAccounts[0]`), allowed what the bucket's IAM policy grants it and what its access
  scopes cover (devstorage.* or cloud-platform), nothing else.
- `deny(bucket)`: an IAM deny policy refusing the bucket's objects to all but the owner (it wins
  over any allow binding, as IAM evaluates deny before allow).
- Roles (Cloud Storage IAM roles reference): objectViewer (objects.list, objects.get),
  objectCreator (objects.create), objectAdmin (all object permissions). Writing over an existing
  object needs storage.objects.delete too, as in GCS. Conditions: `resource.name == "..."` and
  `resource.name.startsWith("...")` joined by `||`, on buckets with uniform bucket-level access
  (setIamPolicy refuses conditions elsewhere, 400, as GCS does).

Fixture `gcs_buckets`: a server for the test (`GcsBuckets`), answering the fake GCE's accounts;
`cli_env()` points the CLI (and through it the nodes) at it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote
from xml.sax.saxutils import escape

import pytest

from cloudtrain.testing.gcp import PROJECT, GceServer
from cloudtrain.testing.gcs_iam import (  # noqa: F401 - condition_allows and OWNER: the kit's API
    OWNER,
    READ_ONLY_SCOPES,
    ROLES,
    STORAGE_SCOPES,
    GcsError,
    IamApi,
    condition_allows,
    gce_principal,
)
from cloudtrain.testing.objects import put_dataset
from cloudtrain.testing.serving import serve, stop_serving

PAGE = 1000


@dataclass
class Blob:
    data: bytes
    generation: int
    updated: float
    multipart_etag: str = ""  # a multipart upload's: "<md5 of the parts' MD5s>-<parts>", not an MD5

    @property
    def etag(self) -> str:
        return self.multipart_etag or f'"{self.md5}"'

    @property
    def md5(self) -> str:
        return hashlib.md5(self.data, usedforsecurity=False).hexdigest()

    def goog_hash(self) -> str:
        crc = zlib.crc32(self.data).to_bytes(4, "big")  # not crc32c: no client here checks it
        return (f"crc32c={base64.b64encode(crc).decode()},"
                f"md5={base64.b64encode(bytes.fromhex(self.md5)).decode()}")


@dataclass
class Bucket:
    name: str
    uniform: bool = True  # uniform bucket-level access (IAM only, conditions allowed)
    objects: dict[str, Blob] = field(default_factory=dict)
    version: int = 1
    policy_version: int = 1
    bindings: list[dict[str, Any]] = field(default_factory=lambda: [
        # What GCS gives a new bucket: the project's basic roles as convenience members.
        {"role": "roles/storage.legacyBucketOwner", "members": [f"projectEditor:{PROJECT}", f"projectOwner:{PROJECT}"]},
        {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{PROJECT}"]},
    ])

    def etag(self) -> str:
        return base64.b64encode(self.version.to_bytes(2, "big")).decode()

    def policy(self) -> dict[str, Any]:
        return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{self.name}",
                "version": self.policy_version, "etag": self.etag(), "bindings": json.loads(json.dumps(self.bindings))}


@dataclass(frozen=True)
class Decision:
    principal: str
    permission: str
    resource: str
    allowed: bool


@dataclass
class FakeGcs(IamApi):
    """The state and the WSGI app; `principal(token)` -> (member, scopes) or None (unknown token)."""

    principal: Callable[[str], tuple[str, frozenset[str]] | None]
    buckets: dict[str, Bucket] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    # Buckets under an IAM deny policy refusing every object permission to every principal but
    # the project owner: a deny wins over any allow binding, as in IAM's evaluation.
    denying: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _generation: int = 1_700_000_000_000_000
    _uploads: dict[str, tuple[str, str, dict[int, bytes]]] = field(default_factory=dict)  # id -> bucket, key, parts

    def create(self, name: str, *, uniform: bool = True) -> Bucket:
        with self.lock:
            return self.buckets.setdefault(name, Bucket(name, uniform))

    def put(self, bucket: str, name: str, data: bytes, etag: str = "") -> Blob:
        with self.lock:
            self._generation += 1
            blob = Blob(data, self._generation, time.time(), etag)
            self.buckets[bucket].objects[name] = blob
            return blob

    def uploads_in_progress(self) -> int:
        """Multipart uploads initiated and neither completed nor aborted."""
        with self.lock:
            return len(self._uploads)

    def denied(self) -> list[Decision]:
        with self.lock:
            return [d for d in self.decisions if not d.allowed]

    # WSGI ---------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        json_api = request.path.startswith("/storage/v1/")
        try:
            status, headers, body = (self._json(request) if json_api else self._xml(request))
        except GcsError as exc:
            status, headers = exc.status, {}
            if json_api:
                body = json.dumps({"error": {"code": exc.status, "message": exc.message, "errors": [
                    {"message": exc.message, "domain": "global", "reason": exc.code}]}}).encode()
                headers["Content-Type"] = "application/json; charset=UTF-8"
            else:
                body = ("<?xml version='1.0' encoding='UTF-8'?><Error><Code>" + escape(exc.code) + "</Code><Message>"
                        + escape(exc.message) + "</Message>" + (f"<Details>{escape(exc.details)}</Details>"
                                                                 if exc.details else "") + "</Error>").encode()
                headers["Content-Type"] = "application/xml; charset=UTF-8"
        if request.method == "HEAD":
            response = Response(b"", status=status, headers=headers)
            response.headers["Content-Length"] = headers.get("Content-Length", str(len(body)))
            response.automatically_set_content_length = False
            return response(environ, start_response)
        return Response(body, status=status, headers=headers)(environ, start_response)

    def _who(self, request: Any) -> tuple[str, frozenset[str]]:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return "allUsers", frozenset()
        found = self.principal(header.removeprefix("Bearer ").strip())
        if found is None:
            raise GcsError(401, "AuthenticationRequired", "Authentication required.",
                           "Invalid Credentials")
        return found

    def _check(self, who: tuple[str, frozenset[str]], bucket: Bucket, permission: str, resource: str) -> None:
        member, scopes = who
        allowed = member == OWNER
        denied_by_policy = not allowed and bucket.name in self.denying
        if not allowed and not denied_by_policy and scopes & STORAGE_SCOPES and not (
                permission not in ("storage.objects.list", "storage.objects.get") and scopes <= READ_ONLY_SCOPES):
            for binding in bucket.bindings:
                if member in binding.get("members", []) and permission in ROLES.get(binding["role"], ()):
                    condition = binding.get("condition")
                    if condition is None or condition_allows(condition.get("expression", ""), resource):
                        allowed = True
                        break
        with self.lock:
            self.decisions.append(Decision(member, permission, resource, allowed))
        if not allowed:
            caller = "Anonymous caller" if member == "allUsers" else member.partition(":")[2]
            if member != "allUsers" and not scopes & STORAGE_SCOPES:
                raise GcsError(403, "AccessDenied", "Access denied.", "Provided scope(s) are not authorized")
            what = ("bucket" if permission == "storage.objects.list" else "object")
            raise GcsError(403, "AccessDenied", "Access denied.",
                           f"{caller} does not have {permission} access to the Google Cloud Storage {what}. "
                           f"Permission '{permission}' denied on resource (or it may not exist).")

    def _bucket(self, name: str) -> Bucket:
        bucket = self.buckets.get(name)
        if bucket is None:
            raise GcsError(404, "NoSuchBucket", "The specified bucket does not exist.")
        return bucket

    # XML API ------------------------------------------------------------------------------------

    def _xml(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        who = self._who(request)
        raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or request.path
        name, _, key = unquote(raw.partition("?")[0]).lstrip("/").partition("/")
        with self.lock:
            bucket = self._bucket(name)
            if not key:
                if request.method != "GET":
                    raise GcsError(405, "MethodNotAllowed", "The specified method is not allowed against this resource.")
                self._check(who, bucket, "storage.objects.list", f"projects/_/buckets/{name}")
                return self._list(bucket, request.args)
            resource = f"projects/_/buckets/{name}/objects/{key}"
            if request.method in ("GET", "HEAD"):
                self._check(who, bucket, "storage.objects.get", resource)
                blob = bucket.objects.get(key)
                if blob is None:
                    raise GcsError(404, "NoSuchKey", "The specified key does not exist.")
                return self._object(blob, request)
            if "uploads" in request.args or "uploadId" in request.args:
                return self._multipart(who, bucket, key, resource, request)
            if request.method == "PUT":
                self._check(who, bucket, "storage.objects.create", resource)
                if key in bucket.objects:  # an overwrite deletes the old generation
                    self._check(who, bucket, "storage.objects.delete", resource)
                blob = self.put(name, key, request.get_data())
                return 200, {"ETag": blob.etag, "x-goog-generation": str(blob.generation),
                             "x-goog-hash": blob.goog_hash(), "Content-Length": "0"}, b""
            if request.method == "DELETE":
                self._check(who, bucket, "storage.objects.delete", resource)
                if bucket.objects.pop(key, None) is None:
                    raise GcsError(404, "NoSuchKey", "The specified key does not exist.")
                return 204, {}, b""
        raise GcsError(501, "NotImplemented", f"{request.method} is not served by this fake.")

    def _multipart(self, who: tuple[str, frozenset[str]], bucket: Bucket, key: str, resource: str,
                   request: Any) -> tuple[int, dict[str, str], bytes]:
        """XML API multipart uploads: initiate (POST ?uploads), upload part (PUT ?partNumber&uploadId),
        complete (POST ?uploadId, a CompleteMultipartUpload list of parts), abort (DELETE ?uploadId)."""
        xml = {"Content-Type": "application/xml; charset=UTF-8"}
        self._check(who, bucket, "storage.objects.create", resource)  # objectCreator has multipartUploads.*
        if request.method == "POST" and "uploads" in request.args:
            upload_id = f"ABPnzm{len(self._uploads):06d}{self._generation}"
            self._uploads[upload_id] = (bucket.name, key, {})
            body = (f"<?xml version='1.0' encoding='UTF-8'?><InitiateMultipartUploadResult "
                    f"xmlns='http://s3.amazonaws.com/doc/2006-03-01/'><Bucket>{escape(bucket.name)}</Bucket>"
                    f"<Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")
            return 200, xml, body.encode()
        upload = self._uploads.get(request.args.get("uploadId", ""))
        if upload is None or upload[:2] != (bucket.name, key):
            raise GcsError(404, "NoSuchUpload", "The requested upload was not found.")
        parts = upload[2]
        if request.method == "PUT":
            number = int(request.args.get("partNumber", "0"))
            if not 1 <= number <= 10000:
                raise GcsError(400, "InvalidArgument", "Invalid argument.", "partNumber must be 1 to 10000")
            parts[number] = request.get_data()
            return 200, {"ETag": f'"{hashlib.md5(parts[number], usedforsecurity=False).hexdigest()}"',
                         "Content-Length": "0"}, b""
        if request.method == "DELETE":
            self._uploads.pop(request.args["uploadId"])
            return 204, {}, b""
        if request.method == "POST":
            import xml.etree.ElementTree as ET

            listed = [int(el.text or "0") for el in ET.fromstring(request.get_data()).iter()
                      if el.tag.rsplit("}", 1)[-1] == "PartNumber"]
            if not listed or listed != sorted(listed) or any(n not in parts for n in listed):
                raise GcsError(400, "InvalidPart", "One or more of the specified parts could not be found.")
            if key in bucket.objects:
                self._check(who, bucket, "storage.objects.delete", resource)
            digests = b"".join(hashlib.md5(parts[n], usedforsecurity=False).digest() for n in listed)
            etag = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(listed)}"'
            blob = self.put(bucket.name, key, b"".join(parts[n] for n in listed), etag)
            self._uploads.pop(request.args["uploadId"])
            body = (f"<?xml version='1.0' encoding='UTF-8'?><CompleteMultipartUploadResult "
                    f"xmlns='http://s3.amazonaws.com/doc/2006-03-01/'><Location>/{escape(bucket.name)}/{escape(key)}"
                    f"</Location><Bucket>{escape(bucket.name)}</Bucket><Key>{escape(key)}</Key>"
                    f"<ETag>{escape(blob.etag)}</ETag></CompleteMultipartUploadResult>")
            return 200, {**xml, "x-goog-generation": str(blob.generation)}, body.encode()
        raise GcsError(405, "MethodNotAllowed", "The specified method is not allowed against this resource.")

    def _list(self, bucket: Bucket, args: Any) -> tuple[int, dict[str, str], bytes]:
        prefix, delimiter = args.get("prefix", ""), args.get("delimiter", "")
        try:
            limit = min(int(args.get("max-keys", PAGE)), PAGE)
        except ValueError:
            raise GcsError(400, "InvalidArgument", "Invalid argument.", "max-keys must be an integer") from None
        after = args.get("continuation-token", "")
        if after:
            try:
                after = base64.urlsafe_b64decode(after.encode()).decode()
            except ValueError:
                raise GcsError(400, "InvalidArgument", "Invalid argument.", "Invalid continuation token") from None
        after = max(after, args.get("start-after", ""))
        contents: list[tuple[str, Blob]] = []
        prefixes: list[str] = []
        last = ""
        truncated = False
        for key in sorted(k for k in bucket.objects if k.startswith(prefix) and k > after):
            if len(contents) + len(prefixes) >= limit:
                truncated = True
                break
            if delimiter and delimiter in key[len(prefix):]:
                common = key[:len(prefix) + key[len(prefix):].index(delimiter) + len(delimiter)]
                if common not in prefixes:
                    prefixes.append(common)
                last = key
                continue
            contents.append((key, bucket.objects[key]))
            last = key
        parts = [f"<Name>{escape(bucket.name)}</Name>", f"<Prefix>{escape(prefix)}</Prefix>",
                 f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>", f"<MaxKeys>{limit}</MaxKeys>",
                 f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if delimiter:
            parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
        if truncated:
            token = base64.urlsafe_b64encode(last.encode()).decode()
            parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
        for key, blob in contents:
            parts.append(f"<Contents><Key>{escape(key)}</Key><Generation>{blob.generation}</Generation>"
                         f"<MetaGeneration>1</MetaGeneration><LastModified>{_iso(blob.updated)}</LastModified>"
                         f"<ETag>{escape(blob.etag)}</ETag><Size>{len(blob.data)}</Size>"
                         f"<StorageClass>STANDARD</StorageClass></Contents>")
        parts.extend(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
        body = ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult "
                "xmlns='http://doc.s3.amazonaws.com/2006-03-01'>" + "".join(parts) + "</ListBucketResult>")
        return 200, {"Content-Type": "application/xml; charset=UTF-8"}, body.encode()

    def _object(self, blob: Blob, request: Any) -> tuple[int, dict[str, str], bytes]:
        headers = {"ETag": blob.etag, "x-goog-generation": str(blob.generation), "x-goog-metageneration": "1",
                   "x-goog-hash": blob.goog_hash(), "x-goog-stored-content-length": str(len(blob.data)),
                   "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(blob.updated)),
                   "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        data, status = blob.data, 200
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", request.headers.get("Range", ""))
        if ranged and (ranged.group(1) or ranged.group(2)):
            size = len(blob.data)
            if ranged.group(1):
                start = int(ranged.group(1))
                end = min(int(ranged.group(2)), size - 1) if ranged.group(2) else size - 1
            else:
                start, end = max(size - int(ranged.group(2)), 0), size - 1
            if start >= size:
                raise GcsError(416, "InvalidRange", "The requested range cannot be satisfied.")
            data, status = blob.data[start:end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers["Content-Length"] = str(len(data))
        return status, headers, data if request.method == "GET" else b""

def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


class GcsServer(FakeGcs):
    """FakeGcs served over HTTP on 127.0.0.1 by werkzeug, in a thread."""

    def __init__(self, principal: Callable[[str], tuple[str, frozenset[str]] | None]) -> None:
        super().__init__(principal)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> GcsServer:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: obstore reuses its connections

            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None

        self._server = make_server("127.0.0.1", 0, self, threaded=True, request_handler=Quiet)
        self._thread = serve(self._server, "fake-gcs")
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"


@dataclass
class GcsBuckets:
    """One test's GCS (see the module doc): `create`, `fill`, `read`, `cli_env`."""

    server: GcsServer
    gce: GceServer

    def create(self, name: str, *, uniform: bool = True) -> str:
        self.server.create(name, uniform=uniform)
        return name

    def fill(self, bucket: str, prefix: str, files: int, total_bytes: int, seed: int = 0) -> dict[str, int]:
        """`files` objects under `prefix` adding up to `total_bytes`, each different (a random
        head on a zero body), stored directly. Returns name -> size."""
        # Stored directly (one thread: the fake's own dict, no HTTP to overlap).
        return put_dataset(lambda k, body: self.server.put(bucket, k, body), prefix, files, total_bytes, seed,
                           workers=1)

    def deny(self, bucket: str) -> None:
        """An IAM deny policy on `bucket` for everyone but the project owner (FakeGcs.denying)."""
        with self.server.lock:
            self.server.denying.add(bucket)

    def names(self, bucket: str) -> list[str]:
        with self.server.lock:
            return sorted(self.server.buckets[bucket].objects)

    def bindings(self, bucket: str) -> list[dict[str, Any]]:
        with self.server.lock:
            return json.loads(json.dumps(self.server.buckets[bucket].bindings))

    def cli_env(self) -> dict[str, str]:
        """STORAGE_EMULATOR_HOST: where the provider sets bucket IAM and the nodes copy."""
        # This fake applies a bucket binding at once: a node need not wait out IAM's propagation.
        return {"STORAGE_EMULATOR_HOST": self.server.url, "CLOUDTRAIN_GRANT_PROPAGATION_S": "0"}


@pytest.fixture
def gcs_buckets(gce_server: GceServer) -> Iterator[GcsBuckets]:
    """GCS (XML objects, JSON bucket IAM) on loopback for this test, with the fake GCE's
    identities: the kit's key is the project owner, a VM's metadata token its service account."""
    server = GcsServer(gce_principal(gce_server)).start()
    try:
        yield GcsBuckets(server, gce_server)
    finally:
        server.stop()
