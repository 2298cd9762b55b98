"""Wire-level Azure Blob Storage for tests: Azurite, with Azure RBAC enforced by a front of ours.

- `Azurite`: Microsoft's Blob emulator (npm `azurite`, `azurite-blob`) as a subprocess on a free
  loopback port, its data under the test's tmp, one account of ours (`AZURITE_ACCOUNTS`). Found at
  `$CLOUDTRAIN_AZURITE`, else `.venv/azurite/node_modules/.bin/azurite-blob` (what
  `scripts/setup.sh --test` installs), else `azurite-blob` on PATH.
- `BlobFront`: an HTTP server in front of Azurite, which checks no Azure RBAC (its OAuth mode
  checks a token's claims, not who holds which role). Requests signed with the account's own
  credentials (SharedKey, a SAS: the user's) pass as they are. A bearer token is a managed
  identity's: allowed only when it is one the fake ARM takes as a VM identity's token (the fake
  IMDS's) and a VM identity holds a Storage Blob Data role (Reader: read and list; Contributor:
  also write and delete) at the container's, the account's, or a wider scope (`ArmServer.
  blob_access`). Allowed, it goes on to Azurite under the front's account SAS (Azurite then sees
  a request it can check); refused, it gets Blob Storage's own answers: 403
  `AuthorizationPermissionMismatch` ("This request is not authorized to perform this operation
  using this permission."), or 401 `InvalidAuthenticationInfo` for a token nobody issued, both with
  the `x-ms-error-code` header and the XML error body of the Blob service REST reference.
- `AzureBlobs` (fixture `azure_blobs`): both, for one test, with the storage account made in the
  test's fake ARM; `create()` a container, `fill()` a dataset, `keys()` to list, `cli_env()` for
  the CLI (nodes reach the front at `CLOUDTRAIN_BLOB_ENDPOINT`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit
from xml.sax.saxutils import escape

import pytest

from cloudtrain.testing.objects import put_dataset
from cloudtrain.testing.serving import serve, stop_serving
from cloudtrain.testing.wait import wait_until

ACCOUNT = "cloudtraindata"  # storage account names: 3-24 lowercase letters and digits
DENIED_MESSAGE = "This request is not authorized to perform this operation using this permission."
UNAUTHENTICATED_MESSAGE = ("Server failed to authenticate the request. Please refer to the information in the "
                           "www-authenticate header.")


@dataclass(frozen=True)
class BlobCall:
    """One Blob REST request as RBAC sees it: what it touches and the operation it needs."""

    account: str
    container: str  # "" for account-level requests (List Containers, service properties)
    blob: str
    operation: str  # read | write | delete


def blob_call(method: str, path: str, query: dict[str, str]) -> BlobCall:
    """The data operation a request needs (Blob service REST reference -> the Storage Blob Data
    roles' dataActions: blobs/read covers Get/Head Blob and List Blobs; blobs/write Put Blob,
    Put Block, Put Block List, Set Blob Metadata/Tags; blobs/delete Delete Blob)."""
    parts = path.lstrip("/").split("/", 2)
    account = parts[0]
    container = parts[1] if len(parts) > 1 else ""
    blob = parts[2] if len(parts) > 2 else ""
    if method in ("GET", "HEAD"):
        operation = "read"
    elif method == "DELETE":
        operation = "delete"
    else:  # PUT and POST: every blob and container write
        operation = "write"
    if query.get("comp") == "list" and method in ("GET", "HEAD"):
        operation = "read"
    return BlobCall(account, container, blob, operation)


def error_body(code: str, message: str) -> bytes:
    """Blob Storage's XML error body: the message ends with the request id and time."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())
    text = f"{message}\nRequestId:{uuid.uuid4()}\nTime:{stamp}"
    return (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
            f"<Message>{escape(text)}</Message></Error>").encode()


def account_sas(account: str, key: str, expiry: str = "2099-01-01T00:00:00Z") -> str:
    """An account SAS for every blob operation (Create an account SAS, version 2020-12-06 and
    later: the string-to-sign ends with the encryption scope), as a query string."""
    version, permissions, services, types, protocols = "2021-08-06", "rwdlacup", "b", "sco", "https,http"
    to_sign = "\n".join([account, permissions, services, types, "", expiry, "", protocols, version, "", ""])
    signature = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
    return urlencode({"sv": version, "ss": services, "srt": types, "sp": permissions, "se": expiry, "spr": protocols,
                      "sig": signature})


def find_azurite() -> str | None:
    candidates = [os.environ.get("CLOUDTRAIN_AZURITE"),
                  str(Path(__file__).resolve().parents[2] / ".venv" / "azurite" / "node_modules" / ".bin" /
                      "azurite-blob"),
                  shutil.which("azurite-blob")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@dataclass
class Azurite:
    """`azurite-blob` on a free loopback port (its own choice: port 0), data in `directory`."""

    directory: Path
    account: str = ACCOUNT
    key: str = field(default_factory=lambda: base64.b64encode(os.urandom(32)).decode())
    port: int = 0
    process: subprocess.Popen[str] | None = None
    _log: Any = None

    def start(self, executable: str) -> Azurite:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = log = open(self.directory / "azurite.log", "w+")  # noqa: SIM115 - closed by stop()
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        # --skipApiVersionCheck: obstore may send a newer x-ms-version than this Azurite knows.
        # --disableTelemetry: with telemetry on, Azurite does not exit on SIGTERM (stop() waited 15 s
        # for it, every test) and leaves a Microsoft-AzureMonitor-* folder in TMPDIR.
        self.process = subprocess.Popen(
            [executable, "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", str(self.directory / "data"),
             "--skipApiVersionCheck", "--disableProductStyleUrl", "--disableTelemetry"],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)

        def listening() -> int | None:
            assert self.process is not None
            if self.process.poll() is not None:
                log_text = (self.directory / "azurite.log").read_text()[-2000:]
                raise RuntimeError(f"azurite exited {self.process.returncode}: {log_text}")
            for line in (self.directory / "azurite.log").read_text().splitlines():
                if "successfully listens on http://" in line:
                    return int(line.rsplit(":", 1)[-1].strip().rstrip("/"))
            return None

        self.port = wait_until(listening, timeout=60, what="azurite listening")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                # Azurite's SIGTERM waits for its clients' keep-alive connections to close, which
                # took 15 s per fixture; its data is a temp directory nobody reads afterwards.
                self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()


class BlobFront(ThreadingHTTPServer):
    """See the module doc. `decisions`: (principal or token kind, BlobCall, allowed)."""

    daemon_threads = True

    def __init__(self, azurite: Azurite, arm: Any) -> None:
        self.azurite, self.arm = azurite, arm
        self.sas = account_sas(azurite.account, azurite.key)
        self.decisions: list[tuple[str, BlobCall, bool]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _FrontHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def authorize(self, authorization: str, call: BlobCall) -> tuple[int, str, str] | None:
        """None to forward under the front's SAS; else (status, error code, message)."""
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.arm.identity_tokens:
            self._record("unknown token", call, False)
            return 401, "InvalidAuthenticationInfo", UNAUTHENTICATED_MESSAGE
        principal = self.arm.blob_access(call.account, call.container, call.operation) if call.container else None
        self._record(principal or "managed identity", call, principal is not None)
        return None if principal else (403, "AuthorizationPermissionMismatch", DENIED_MESSAGE)

    def _record(self, who: str, call: BlobCall, allowed: bool) -> None:
        with self.lock:
            self.decisions.append((who, call, allowed))

    def denied(self) -> list[BlobCall]:
        with self.lock:
            return [c for _, c, ok in self.decisions if not ok]


class _FrontHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as obstore's connection pool expects
    server: BlobFront

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        return  # the test's output is for the test

    def _relay(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        authorization = self.headers.get("Authorization", "")
        target = self.path
        if authorization.startswith("Bearer "):
            refusal = self.server.authorize(authorization, blob_call(self.command, parts.path, query))
            if refusal is not None:
                self._refuse(*refusal)
                return
            headers.pop("Authorization", None)
            target = f"{self.path}{'&' if parts.query else '?'}{self.server.sas}"
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.azurite.port, timeout=120)
        try:
            upstream.request(self.command, target, body=body or None, headers=headers)
            answer = upstream.getresponse()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in ("connection", "transfer-encoding", "keep-alive"):
                    self.send_header(name, value)
            payload = answer.read()  # whole: the kit's blobs are small (a dataset of many files)
            if answer.getheader("Content-Length") is None:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
        finally:
            upstream.close()

    def _refuse(self, status: int, code: str, message: str) -> None:
        body = error_body(code, message)
        self.send_response(status, message.split(".")[0])
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-ms-error-code", code)
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer authorization_uri=https://login.microsoftonline.com/"
                                                 "common/oauth2/authorize resource_id=https://storage.azure.com")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay


@dataclass
class AzureBlobs:
    """One test's Blob store: see the module doc. `account_id`: the storage account in ARM."""

    azurite: Azurite
    front: BlobFront
    account_id: str
    _thread: threading.Thread | None = None

    @property
    def account(self) -> str:
        return self.azurite.account

    def _user(self, method: str, path: str, query: str = "") -> bytes:
        """A request with the account's own credentials (an account SAS): the user's."""
        sep = "&" if query else ""
        url = f"{self.front.url}/{self.account}/{path}?{query}{sep}{self.front.sas}"
        request = urllib.request.Request(url, method=method, headers={"x-ms-version": "2021-08-06",
                                                                      "Content-Length": "0"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.read()

    def create(self, container: str) -> str:
        self._user("PUT", container, "restype=container")
        return container

    def store(self) -> Any:
        """An obstore AzureStore factory with the account key (the user's credentials)."""
        from obstore.store import AzureStore

        def make(container: str) -> Any:
            return AzureStore(container, account_name=self.account,
                              config={"endpoint": f"{self.front.url}/{self.account}", "access_key": self.azurite.key},
                              client_options={"allow_http": True})
        return make

    def put(self, container: str, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store()(container), key, data)

    def fill(self, container: str, prefix: str, files: int, total_bytes: int, seed: int = 0,
             workers: int = 8) -> dict[str, int]:
        """`files` blobs under `prefix` adding up to `total_bytes`: random heads on zero bodies, so
        every blob differs and making them costs little. Returns key -> size."""
        import obstore

        store = self.store()(container)
        return put_dataset(lambda k, body: obstore.put(store, k, body), prefix, files, total_bytes, seed, workers)

    def keys(self, container: str, prefix: str | None = None) -> list[str]:
        import obstore

        return sorted(m["path"] for batch in obstore.list(self.store()(container), prefix=prefix) for m in batch)

    def cli_env(self) -> dict[str, str]:
        """For the CLI's environment: nodes (and `collect --from-bucket`) reach the store here."""
        # A node's first copy waits out this fake's RBAC delay (FakeArm.rbac_propagation_s), not
        # Azure's 10 minutes (buckets/steps.py).
        wait = max(15.0, 5 * self.front.arm.rbac_propagation_s)
        return {"CLOUDTRAIN_BLOB_ENDPOINT": self.front.url, "CLOUDTRAIN_GRANT_PROPAGATION_S": f"{wait:g}"}

    def user_env(self) -> dict[str, str]:
        """The user's own configured credentials for the store (obstore reads these)."""
        return {"AZURE_STORAGE_ACCOUNT_KEY": self.azurite.key}

    def start(self) -> AzureBlobs:
        self._thread = serve(self.front, "blob-front")
        return self

    def stop(self) -> None:
        stop_serving(self.front, self._thread)
        self.azurite.stop()


def start_blobs(directory: Path, arm: Any, *, group: str = "cloudtrain-test-data",
                region: str = "eastus") -> AzureBlobs:
    executable = find_azurite()
    if executable is None:
        message = "azurite is not installed (scripts/setup.sh --test: npm install into .venv/azurite)"
        if os.environ.get("CI"):
            raise RuntimeError(message)
        pytest.skip(message)
    azurite = Azurite(directory).start(executable)
    try:
        account_id = arm.create_storage_account(group, azurite.account, region=region)
        return AzureBlobs(azurite, BlobFront(azurite, arm), account_id).start()
    except BaseException:
        azurite.stop()
        raise


@pytest.fixture
def azure_blobs(arm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureBlobs]:
    """Azurite behind the RBAC front, its storage account in this test's fake ARM (module doc)."""
    blobs = start_blobs(tmp_path_factory.mktemp("azurite"), arm_server)
    try:
        yield blobs
    finally:
        blobs.stop()
