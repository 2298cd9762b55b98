"""cloudtrain's object-store copy, run on the node with the node's own identity (docs/data.md).

    python bucket_copy.py get URL DEST --state FILE   copy URL's objects into DEST; only what changed
    python bucket_copy.py put URL --base DIR PATH...  upload DIR/PATH (files or directories) under URL

URL: s3://bucket/prefix, gs://bucket/prefix or az://account/container/prefix. The copy is
obstore (the Rust `object_store` crate): one small wheel speaks all three stores and their
instance identities (EC2 instance metadata, the GCE metadata server, Azure managed identity).

`get` is incremental and resumable: FILE records each object copied (size, ETag); an object whose
size and ETag match the record and whose local file has that size is not fetched again. Every
file is written beside its target and renamed when complete, and the record is saved as files
land, so a copy cut short resumes where it stopped. Verified: every file's size, and its MD5 where
the store's ETag is one (a single-part S3 upload); other files by size.

Environment (the CLI sets it; docs/data.md):
  CLOUDTRAIN_BUCKET_IDENTITY   instance: the machine's own identity only (every credential in the
                               environment is dropped); configured: whatever the environment and
                               the store's own configuration give (ssh and local nodes)
  CLOUDTRAIN_BUCKET_WHO        the identity, in words, for error messages
  CLOUDTRAIN_METADATA_URL      the instance metadata endpoint (default: the cloud's own)
  CLOUDTRAIN_S3_ENDPOINT       an S3-compatible endpoint instead of AWS's (and CLOUDTRAIN_S3_REGION)
  CLOUDTRAIN_BLOB_ENDPOINT     a Blob endpoint taking path-style URLs (an emulator such as Azurite)
                               instead of https://<account>.blob.core.windows.net
  CLOUDTRAIN_GCS_ENDPOINT      another GCS endpoint (XML API) than storage.googleapis.com
  CLOUDTRAIN_BUCKET_CONCURRENCY  transfers at a time (default 16)
  CLOUDTRAIN_BUCKET_VERIFY     md5 (default): sizes, and MD5 where the ETag is one; size: sizes only
                               (MD5 costs CPU: about 20% of the throughput on a 2-core machine)
  CLOUDTRAIN_BUCKET_GRANT_WAIT_S  with the instance identity: how long this node's FIRST copy from
                               (get) or to (put) a bucket retries access denied, because a grant
                               just made takes the cloud's IAM propagation time to reach the store
                               (Azure RBAC up to 10 min, GCP IAM up to 7); a bucket this node has
                               copied before is denied at once

Progress goes to stdout, at most once a second: files, bytes, rate. Exit codes: 0 done, 2 usage,
3 access denied (one line naming the bucket and the permission), 4 missing bucket or prefix,
5 verification failed, 6 obstore missing, 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import time

_MD5_ETAG = re.compile(r"[0-9a-f]{32}")
_AWS_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                        "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_GCP_CREDENTIAL_VARS = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH",
                        "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BEARER_TOKEN", "GOOGLE_BASE_URL", "GCE_METADATA_HOST",
                        "GCE_METADATA_ROOT", "GCE_METADATA_IP")
# What each operation needs, by store, for the access-denied line.
_PERMISSIONS = {
    "s3": {"list": "s3:ListBucket", "get": "s3:GetObject", "put": "s3:PutObject"},
    "gs": {"list": "storage.objects.list", "get": "storage.objects.get", "put": "storage.objects.create"},
    "az": {"list": "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
           "get": "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
           "put": "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"},
}


class CopyError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def parse_url(text: str) -> tuple[str, str, str, str]:
    """(scheme, account, bucket, prefix); the CLI checked the URL already (cloudtrain/buckets/url.py)."""
    scheme, sep, rest = text.partition("://")
    parts = [p for p in rest.split("/") if p]
    if not sep or scheme not in _PERMISSIONS or len(parts) < (2 if scheme == "az" else 1):
        raise CopyError(f"not a bucket URL: {text!r}", 2)
    if scheme == "az":
        return scheme, parts[0], parts[1], "/".join(parts[2:])
    return scheme, "", parts[0], "/".join(parts[1:])


def make_store(scheme: str, account: str, bucket: str):  # noqa: ANN201 - an obstore store
    try:
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError:
        raise CopyError("obstore is not installed on this node (pip install obstore)", 6) from None
    instance = os.environ.get("CLOUDTRAIN_BUCKET_IDENTITY", "configured") == "instance"
    metadata = os.environ.get("CLOUDTRAIN_METADATA_URL")
    if scheme == "s3":
        if instance:
            # No user credentials on the VM: whatever the environment holds is not used.
            for name in _AWS_CREDENTIAL_VARS:
                os.environ.pop(name, None)
        config: dict[str, str] = {}
        endpoint = os.environ.get("CLOUDTRAIN_S3_ENDPOINT")
        if endpoint:
            config["endpoint"] = endpoint
        if metadata:
            config["metadata_endpoint"] = metadata
        options = {"allow_http": True} if endpoint and endpoint.startswith("http://") else None
        region = os.environ.get("CLOUDTRAIN_S3_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        return S3Store(bucket, region=region, config=config, client_options=options)
    if scheme == "gs":
        gcs: dict[str, str] = {}
        gcs_endpoint = os.environ.get("CLOUDTRAIN_GCS_ENDPOINT")
        if gcs_endpoint:
            gcs["base_url"] = gcs_endpoint.rstrip("/")
        if instance:
            # The VM's service account only: object_store asks the GCE metadata server for its token
            # when no credential is configured, and GCE_METADATA_HOST moves that server (tests).
            for name in _GCP_CREDENTIAL_VARS:
                os.environ.pop(name, None)
            if metadata:
                os.environ["GCE_METADATA_HOST"] = metadata.split("://", 1)[-1].rstrip("/")
        gcs_options = {"allow_http": True} if gcs_endpoint and gcs_endpoint.startswith("http://") else None
        return GCSStore(bucket, config=gcs, client_options=gcs_options)
    return _azure_store(AzureStore, instance, metadata, account, bucket)


def _azure_store(AzureStore, instance: bool, metadata: str | None, account: str,  # noqa: ANN001, ANN202, N803
                 container: str):
    """The VM's managed identity (IMDS) on an Azure node; else what the environment configures."""
    config: dict[str, str] = {}
    if instance:
        # No user credentials on the VM: only the managed identity's token from IMDS is used.
        for name in [n for n in os.environ if n.startswith(("AZURE_", "MSI_", "IDENTITY_"))]:
            os.environ.pop(name, None)
        config["credential_type"] = "managed_identity"
        if metadata:
            config["msi_endpoint"] = f"{metadata.rstrip('/')}/metadata/identity/oauth2/token"
    endpoint = os.environ.get("CLOUDTRAIN_BLOB_ENDPOINT")
    if endpoint:  # an emulator's path-style address (Azurite: http://host:port/<account>/<container>)
        config["endpoint"] = f"{endpoint.rstrip('/')}/{account}"
    options = {"allow_http": True} if endpoint and endpoint.startswith("http://") else None
    return AzureStore(container, account_name=account, config=config, client_options=options)


def _denied(exc: Exception, scheme: str, bucket_url: str, op: str, why: str | None = None) -> CopyError:
    who = os.environ.get("CLOUDTRAIN_BUCKET_WHO") or "this node's credentials"
    return CopyError(f"access denied: {bucket_url} refuses {_PERMISSIONS[scheme][op]} to {who} "
                     f"({why or type(exc).__name__})", 3)


def _translate(exc: Exception, scheme: str, bucket_url: str, op: str) -> CopyError:
    from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

    if scheme == "az" and "AuthorizationPermissionMismatch" in str(exc):  # Blob's 403 for a missing role
        # obstore reports it as a GenericError: the service's own code says more.
        return _denied(exc, scheme, bucket_url, op, "AuthorizationPermissionMismatch")
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or " 403 " in str(exc):
        return _denied(exc, scheme, bucket_url, op)
    if isinstance(exc, (NotFoundError, FileNotFoundError)) or "NoSuchBucket" in str(exc) \
            or (scheme == "az" and "ContainerNotFound" in str(exc)):
        return CopyError(f"{bucket_url}: not found ({str(exc).splitlines()[0][:200]})", 4)
    return CopyError(f"{bucket_url}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", 1)


class Progress:
    def __init__(self, label: str, files: int, total: int) -> None:
        self.label, self.files, self.total = label, files, total
        self.done_files = self.done_bytes = 0
        self.start = self._last = time.monotonic()

    def add(self, size: int) -> None:
        self.done_files += 1
        self.done_bytes += size
        now = time.monotonic()
        if now - self._last >= 1.0:
            self._last = now
            print(f"{self.label}: {self.line()}", flush=True)

    def rate(self) -> float:
        return self.done_bytes / max(time.monotonic() - self.start, 1e-6)

    def line(self) -> str:
        return (f"{self.done_files}/{self.files} files, {_mb(self.done_bytes)}/{_mb(self.total)} MB, "
                f"{_mb(self.rate())} MB/s")


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _verify_md5() -> bool:
    return os.environ.get("CLOUDTRAIN_BUCKET_VERIFY", "md5") != "size"


def _concurrency() -> int:
    return max(1, int(os.environ.get("CLOUDTRAIN_BUCKET_CONCURRENCY") or 16))


# ---------------------------------------------------------------------------------------------- get


def _load_state(path: str, url: str) -> dict[str, list]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data.get("files", {}) if isinstance(data, dict) and data.get("url") == url else {}


def _save_state(path: str, url: str, files: dict[str, list]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"url": url, "files": files}, f)
    os.replace(tmp, path)


async def _fetch(store, key: str, target: str, etag: str, size: int) -> bool:  # noqa: ANN001
    """Write object `key` to `target` through a temporary file; True when MD5-verified."""
    import obstore

    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.cloudtrain-part"
    digest = hashlib.md5(usedforsecurity=False) if _verify_md5() else None
    got = 0
    response = await obstore.get_async(store, key)
    with open(tmp, "wb") as f:
        async for chunk in response.stream(min_chunk_size=4 * 1024 * 1024):
            view = memoryview(chunk)  # obstore's Bytes, without a copy
            f.write(view)
            if digest is not None:
                digest.update(view)
            got += view.nbytes
    if got != size:
        os.unlink(tmp)
        raise CopyError(f"{key}: got {got} bytes, the store lists {size}", 5)
    clean = etag.strip('"')
    checked = digest is not None and bool(_MD5_ETAG.fullmatch(clean))
    if checked and digest.hexdigest() != clean:
        os.unlink(tmp)
        raise CopyError(f"{key}: MD5 {digest.hexdigest()} does not match the store's {clean}", 5)
    os.replace(tmp, target)
    return checked


async def get(url: str, dest: str, state_path: str) -> int:
    import obstore

    scheme, account, bucket, prefix = parse_url(url)
    bucket_url = f"{scheme}://{account + '/' if account else ''}{bucket}"
    store = make_store(scheme, account, bucket)
    listed: list[dict] = []
    try:
        async for batch in obstore.list(store, prefix=prefix or None, chunk_size=1000):
            listed.extend(batch)
    except Exception as exc:  # noqa: BLE001 - obstore's errors, translated to one line
        raise _translate(exc, scheme, bucket_url, "list") from None
    objects = [m for m in listed if not m["path"].endswith("/")]
    if not objects:
        raise CopyError(f"{url}: no objects under this prefix", 4)
    cut = len(prefix) + 1 if prefix else 0
    state = _load_state(state_path, url)
    todo = []
    for meta in objects:
        rel = meta["path"][cut:]
        target = os.path.join(dest, *rel.split("/"))
        known = state.get(rel)
        if (known == [meta["size"], meta.get("e_tag") or ""] and os.path.isfile(target)
                and os.path.getsize(target) == meta["size"]):
            continue
        todo.append((meta, rel, target))
    total = sum(m["size"] for m, _, _ in todo)
    label = f"data {url}"
    print(f"{label}: {len(objects)} objects, {len(objects) - len(todo)} unchanged; copying {len(todo)} "
          f"({_mb(total)} MB) with {_concurrency()} transfers", flush=True)
    progress = Progress(label, len(todo), total)
    md5_checked = 0
    limit = asyncio.Semaphore(_concurrency())
    last_save = time.monotonic()

    async def one(meta: dict, rel: str, target: str) -> None:
        nonlocal md5_checked, last_save
        async with limit:
            try:
                checked = await _fetch(store, meta["path"], target, meta.get("e_tag") or "", meta["size"])
            except CopyError:
                raise
            except Exception as exc:  # noqa: BLE001 - obstore's errors, translated to one line
                raise _translate(exc, scheme, bucket_url, "get") from None
        md5_checked += checked
        state[rel] = [meta["size"], meta.get("e_tag") or ""]
        progress.add(meta["size"])
        if time.monotonic() - last_save > 2.0:  # what landed survives an interruption
            last_save = time.monotonic()
            _save_state(state_path, url, state)

    try:
        await asyncio.gather(*(one(*item) for item in todo))
    finally:
        _save_state(state_path, url, state)
    elapsed = time.monotonic() - progress.start
    print(f"{label} -> {dest}: copied {len(todo)} files ({_mb(total)} MB) in {elapsed:.1f} s, "
          f"{_mb(progress.rate())} MB/s; {len(objects) - len(todo)} unchanged; verified: sizes {len(todo)}, "
          f"MD5 {md5_checked}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- put


async def put(url: str, base: str, paths: list[str], state_path: str | None = None) -> int:
    import obstore

    scheme, account, bucket, prefix = parse_url(url)
    bucket_url = f"{scheme}://{account + '/' if account else ''}{bucket}"
    store = make_store(scheme, account, bucket)
    files: list[tuple[str, str, int]] = []
    for path in paths:
        top = os.path.join(base, path)
        if os.path.isfile(top):
            files.append((top, path, os.path.getsize(top)))
            continue
        for root, _, names in os.walk(top):
            for name in sorted(names):
                full = os.path.join(root, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    files.append((full, os.path.relpath(full, base).replace(os.sep, "/"), os.path.getsize(full)))
    total = sum(s for _, _, s in files)
    label = f"upload {url}"
    print(f"{label}: {len(files)} files ({_mb(total)} MB)", flush=True)
    progress = Progress(label, len(files), total)
    limit = asyncio.Semaphore(_concurrency())

    async def one(full: str, rel: str, size: int) -> None:
        key = f"{prefix}/{rel}" if prefix else rel
        async with limit:
            try:
                with open(full, "rb") as f:
                    await obstore.put_async(store, key, f)
            except Exception as exc:  # noqa: BLE001 - obstore's errors, translated to one line
                raise _translate(exc, scheme, bucket_url, "put") from None
        progress.add(size)

    await asyncio.gather(*(one(*item) for item in files))
    if state_path is not None:  # this node's identity may write here: a later denial is no propagation
        _save_state(state_path, url, {})
    print(f"{label}: uploaded {len(files)} files ({_mb(total)} MB) in {time.monotonic() - progress.start:.1f} s, "
          f"{_mb(progress.rate())} MB/s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bucket_copy.py")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("get")
    g.add_argument("url")
    g.add_argument("dest")
    g.add_argument("--state", required=True)
    p = sub.add_parser("put")
    p.add_argument("url")
    p.add_argument("--base", required=True)
    p.add_argument("--state", help="a record that this node has written to the bucket")
    p.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    # A first copy: no record of this node ever reaching the bucket (get: the copy's own record).
    first = args.state is None or not os.path.exists(args.state)
    try:
        if args.command == "get":
            return _waiting_out_a_new_grant(lambda: asyncio.run(get(args.url, args.dest, args.state)), first,
                                            args.url)
        return _waiting_out_a_new_grant(lambda: asyncio.run(put(args.url, args.base, args.paths, args.state)),
                                        first, args.url)
    except CopyError as exc:
        print(f"bucket copy: {exc}", file=sys.stderr, flush=True)
        return exc.code


def _waiting_out_a_new_grant(attempt, first: bool, url: str) -> int:  # noqa: ANN001 - a callable
    """`attempt()`, again while the store denies access and a grant may still be propagating: the
    CLI grants the node's identity a bucket just before the copy, and the cloud says so only
    seconds to minutes later. Incremental copies lose nothing by starting over."""
    wait = 0.0
    if first and os.environ.get("CLOUDTRAIN_BUCKET_IDENTITY") == "instance":
        try:
            wait = max(0.0, float(os.environ.get("CLOUDTRAIN_BUCKET_GRANT_WAIT_S") or 0))
        except ValueError:
            wait = 0.0
    started = time.monotonic()
    delay = 2.0
    while True:
        try:
            return attempt()
        except CopyError as exc:
            waited = time.monotonic() - started
            if exc.code != 3 or waited + delay > wait:
                if exc.code == 3 and waited >= 1:
                    raise CopyError(f"{exc}; still denied after {waited:.0f} s, longer than a new grant takes "
                                    "to reach the store", 3) from None
                raise
            # Not the error line (that comes once, at the end, if the store never allows it).
            print(f"bucket copy: {url}: the store does not let this node in yet; a grant made for this run can "
                  f"take up to {wait:.0f} s to reach it: trying again in {delay:.0f} s ({waited:.0f} s so far)",
                  flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: obstore's native runtime sometimes aborts (SIGABRT,
    # no message) while Python finalizes, after everything was written, renamed and recorded (seen
    # 2 times in 40 runs on a loaded 2-core machine). Output is flushed first; nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
