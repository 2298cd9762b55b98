"""AWS test kit: moto's server on loopback with server-side fault injection, and `aws_cloud`.

Fixtures (exposed by the `cloudtrain` pytest plugin):

- `aws_cloud`: everything a `cloudtrain run` on `cloud: aws` needs, for one test (an `AwsCloud`,
  the shape every `<cloud>_cloud` fixture shares: see cloud.py). Each instance moto launches boots
  its own sshd VM that trusts the instance's key pair (as cloud-init would), and its public IP is
  routed to that VM; the default Ubuntu / Deep Learning AMI parameters answer, in every region,
  with an AMI whose login user is the VMs' user; caller CIDR, region, short SSH windows, its own
  HOME and CLOUDTRAIN_HOME, a unique cluster name. Faults: `aws_cloud.fail("capacity", ...)`.
- `moto_server_session`: one `MotoServer` for the whole test session (moto's first EC2 call costs
  about a second of backend setup; sharing the server pays it once). It is shared: tests keep
  apart by using their own cluster names, or call `server.reset()` for a blank account.
- `moto_server`: the same server, plus this test's environment: AWS_ENDPOINT_URL(_EC2/_SSM/_STS)
  pointing at it, fake keys, AWS_DEFAULT_REGION=us-east-1, the user's ~/.aws and AWS_PROFILE
  hidden, instance metadata lookups off. Subprocesses (`cloudtrain` CLI runs) inherit all of it.
  Faults added during the test are cleared afterwards.

Fault injection happens in the server, in front of moto's WSGI app, so it works for a CLI running
in a subprocess too:

    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1a"})
    moto_server.faults.add("VcpuLimitExceeded", regions={"us-east-1"}, times=1)
    moto_server.faults.count("RunInstances", zone="us-east-1b")   # requests seen
    gate = moto_server.faults.hold("RunInstances", after=True)     # moto launches, the answer waits
    gate.wait_held(timeout=60); ...; gate.release()                # ...until the test lets go

Status and retries: a fault answers with an HTTP status, and botocore decides from it whether to
try again. `faults.add(code)` sends the status EC2 itself sends for that code (`EC2_STATUS`: 500
for InsufficientInstanceCapacity, 503 for RequestLimitExceeded, 401/403 for auth codes, else 400)
unless `status=` says otherwise. botocore retries 5xx answers (and throttling codes at any status)
up to AWS_MAX_ATTEMPTS tries (cloudtrain's default: 5, with backoff), and every try is a request
the fault sees and counts against `times`. So `add("InsufficientInstanceCapacity", times=1)` is a
momentary shortage botocore rides out unseen; `aws_cloud.fail("capacity")` instead answers 400,
which is never retried: each API call fails exactly once (`retried=True` for EC2's real status).

A VM from the sshd kit can also trust the key pairs moto holds, as cloud-init would on EC2:
`SshdFactory.start(authorized_keys_command=moto_server.authorized_keys_command())`.

moto, boto3 and botocore are imported when a server starts, never when this module is imported.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import pytest

from cloudtrain.testing.bill import FakeBill
from cloudtrain.testing.cloud import CloudMachines, FakeCloud, cluster_hint
from cloudtrain.testing.faults import Gate, RequestBook
from cloudtrain.testing.serving import serve, stop_serving
from cloudtrain.testing.sshd import SshdFactory

_SCOPE_RE = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request")
FAKE_KEY_ID = "AKIACLOUDTRAINTEST00"
FAKE_SECRET = "cloudtrain-test-secret"
_DEFAULT_MESSAGES = {
    "InsufficientInstanceCapacity": (
        "We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested "
        "({zone}). Our system will be working on provisioning additional capacity."
    ),
    "Unsupported": "Your requested instance type ({instance_type}) is not supported in your requested "
    "Availability Zone ({zone}).",
    "InstanceLimitExceeded": "You have requested more instances than your current instance limit allows.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit allows.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "SpotMaxPriceTooLow": "Your Spot request price is lower than the minimum required Spot request fulfillment price.",
    "RequestLimitExceeded": "Request limit exceeded.",
    "AuthFailure": "AWS was not able to validate the provided access credentials",
    "UnauthorizedOperation": "You are not authorized to perform this operation.",
}
# The HTTP status EC2 sends with an error code; anything else is a 400. botocore retries 5xx.
EC2_STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientCapacity": 500,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
    "RequestLimitExceeded": 503,
    "AuthFailure": 401,
    "OptInRequired": 401,
    "UnauthorizedOperation": 403,
    "Blocked": 403,
}
# Services whose query-protocol requests the injector reads (and can fail).
_SERVICES = ("ec2", "sts")
_INTERNAL_HEADER = "X-Cloudtrain-Kit"


@dataclass(frozen=True)
class Ec2Request:
    """One API request the server saw (EC2, or STS): what faults and `count` filter on."""

    action: str
    region: str | None
    zone: str | None
    instance_type: str | None
    service: str = "ec2"
    params: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)


@dataclass
class Fault:
    """Answer matching requests with error `code`. None in a filter means "any".

    `status`: the HTTP status sent (None: what EC2 sends for `code`, see EC2_STATUS). botocore
    retries 5xx up to AWS_MAX_ATTEMPTS tries, and `times` counts every try: after `times` matching
    requests the fault steps aside. `hits`: matching requests answered so far.
    """

    code: str
    action: str | None = "RunInstances"  # None: every action of `service`
    regions: frozenset[str] | None = None
    zones: frozenset[str] | None = None
    message: str | None = None
    status: int | None = None
    times: int | None = None  # answer this many matching requests, then step aside
    when: Callable[[Ec2Request], bool] | None = None
    service: str | None = "ec2"  # "sts", or None for every service the injector reads
    hits: int = 0

    @property
    def http_status(self) -> int:
        return self.status if self.status is not None else EC2_STATUS.get(self.code, 400)

    def matches(self, request: Ec2Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.service is not None and request.service != self.service:
            return False
        if self.action is not None and request.action != self.action:
            return False
        if self.regions is not None and request.region not in self.regions:
            return False
        if self.zones is not None and request.zone not in self.zones:
            return False
        return self.when is None or self.when(request)


# (request, HTTP status, response body) after moto answered; see FaultInjector.observers
Observer = Callable[[Ec2Request, int, bytes], None]


@dataclass
class FaultInjector:
    """WSGI middleware in front of moto: records EC2/STS requests and fails the ones a Fault matches.

    Also: `observers` see every request moto answered (a fake cloud boots a VM per instance from
    them), and `parameters(region, name)` may answer SSM GetParameter itself (public parameters
    such as the default AMI ids, which moto's API refuses to create). Requests the kit itself makes
    (`MotoServer.client(..., internal=True)`) go straight to moto.
    """

    app: Callable[..., Iterable[bytes]]
    observers: list[Observer] = field(default_factory=list)
    parameters: Callable[[str, str], str | None] | None = None
    observer_errors: list[str] = field(default_factory=list)
    book: RequestBook[Ec2Request, Fault] = field(default_factory=lambda: RequestBook(_is_action))
    # Seconds before EC2 takes a new IAM instance profile (_profile_not_yet_in_ec2); real AWS: ~5-15.
    profile_propagation_s: float = 3.0
    # Held while moto answers a stop or a terminate and the observers power the machine off; what
    # describes instances to a test (AwsCloud.instances) takes it too. EC2 says "terminated" (or
    # "stopped") of a machine that is off; moto says it at once, and a test that saw it before the
    # VM's jobs were ended let one of them finish on a terminated machine (a CI failure).
    transitions: threading.RLock = field(default_factory=threading.RLock)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def faults(self) -> list[Fault]:
        return self.book.faults

    @property
    def requests(self) -> list[Ec2Request]:
        return self.book.requests

    @property
    def gates(self) -> list[Gate]:
        return self.book.gates

    def add(
        self,
        code: str,
        *,
        action: str | None = "RunInstances",
        regions: Iterable[str] | None = None,
        zones: Iterable[str] | None = None,
        message: str | None = None,
        status: int | None = None,
        times: int | None = None,
        when: Callable[[Ec2Request], bool] | None = None,
        service: str | None = "ec2",
    ) -> Fault:
        """Fail matching requests with `code` (see Fault; `status=None` sends EC2's own status for
        the code, which botocore retries when it is a 5xx)."""
        fault = Fault(
            code=code,
            action=action,
            regions=frozenset(regions) if regions is not None else None,
            zones=frozenset(zones) if zones is not None else None,
            message=message,
            status=status,
            times=times,
            when=when,
            service=service,
        )
        return self.book.add_fault(fault)

    def hold(self, action: str, *, after: bool = False, when: Callable[[Ec2Request], bool] | None = None) -> Gate:
        """Park matching requests until `gate.release()` (`after`: let moto act first)."""
        return self.book.hold(action, after=after, when=when)

    def clear(self) -> None:
        """Forget faults, gates (released), recorded requests, observers and parameter answers."""
        self.book.clear()
        with self._lock:
            self.observers.clear()
            self.observer_errors.clear()
            self.parameters = None

    def count(self, action: str, *, zone: str | None = None, region: str | None = None) -> int:
        """Requests seen for `action` (each botocore retry is one), optionally in one zone/region."""
        return len(self.book.matching(action, lambda r: zone in (None, r.zone) and region in (None, r.region)))

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("HTTP_" + _INTERNAL_HEADER.upper().replace("-", "_")):
            return self.app(environ, start_response)
        answered = self._parameter_answer(environ, start_response)
        if answered is not None:
            return answered
        request = _api_request(environ)
        if request is None:
            return self.app(environ, start_response)
        gate = self.book.record(request)
        if gate is not None and gate.after:
            return _answer_after(gate, self.app, environ, start_response, lambda s, b: self._notify(request, s, b))
        if gate is not None:
            gate.park()
        fault = self.book.take_fault(request)  # decided after the gate: a test may add one meanwhile
        if fault is None:
            fault = self._profile_not_yet_in_ec2(request)
        if fault is not None:
            return _error_answer(fault, request, start_response)
        if not self.observers:
            return self.app(environ, start_response)
        changing = request.action in ("StopInstances", "TerminateInstances")
        with self.transitions if changing else contextlib.nullcontext():
            status, headers, body = _capture(self.app, environ)
            self._notify(request, int(status.split()[0]), body)
        start_response(status, headers)
        return [body]

    def _profile_not_yet_in_ec2(self, request: Ec2Request) -> Fault | None:
        """IAM is eventually consistent: EC2 refuses an instance profile created moments ago with
        InvalidParameterValue ("Invalid IAM Instance Profile name") for several seconds, then takes
        it (what a first launch with a new per-cluster identity meets). Modelled from moto's own
        record of when the profile was created; `profile_propagation_s` = 0 turns it off."""
        if request.service != "ec2" or request.action not in ("RunInstances", "AssociateIamInstanceProfile"):
            return None
        name = request.params.get("IamInstanceProfile.Name")
        if not name or self.profile_propagation_s <= 0:
            return None
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.iam.models import iam_backends

        backend = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
        created = next((p.create_date for p in backend.instance_profiles.values() if p.name == name), None)
        if created is None:
            return None  # unknown to IAM too: moto answers that itself
        age = (datetime.now(timezone.utc) - created.replace(tzinfo=created.tzinfo or timezone.utc)).total_seconds()
        if age >= self.profile_propagation_s:
            return None
        return Fault("InvalidParameterValue", action=request.action, status=400,
                     message=f"Value ({name}) for parameter iamInstanceProfile.name is invalid. "
                             "Invalid IAM Instance Profile name")

    def _notify(self, request: Ec2Request, status: int, body: bytes) -> None:
        with self._lock:
            observers = list(self.observers)
        for observer in observers:
            try:
                observer(request, status, body)
            except Exception as exc:  # noqa: BLE001 - reported by the fixture, never to the client
                with self._lock:
                    self.observer_errors.append(f"{request.action}: {type(exc).__name__}: {exc}")

    def _parameter_answer(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes] | None:
        answer = self.parameters
        if answer is None or environ.get("HTTP_X_AMZ_TARGET") != "AmazonSSM.GetParameter":
            return None
        scope = _SCOPE_RE.search(environ.get("HTTP_AUTHORIZATION", ""))
        body = _read_body(environ)
        try:
            name = json.loads(body or b"{}").get("Name", "")
        except ValueError:
            return None
        region = scope.group("region") if scope else "us-east-1"
        value = answer(region, name)
        if value is None:
            return None
        payload = json.dumps({"Parameter": {
            "Name": name, "Type": "String", "Value": value, "Version": 1, "LastModifiedDate": time.time(),
            "ARN": f"arn:aws:ssm:{region}::parameter{name}", "DataType": "text",
        }}).encode()
        start_response("200 OK", [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(payload)))])
        return [payload]


def _is_action(action: str, request: Ec2Request) -> bool:
    return request.action == action


def _error_answer(fault: Fault, request: Ec2Request, start_response: Callable[..., Any]) -> list[bytes]:
    message = fault.message or _DEFAULT_MESSAGES.get(fault.code, fault.code)
    message = message.format(zone=request.zone or "", instance_type=request.instance_type or "")
    error = f"<Code>{escape(fault.code)}</Code><Message>{escape(message)}</Message>"
    if request.service == "ec2":
        xml = f"<Response><Errors><Error>{error}</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    else:
        xml = f"<ErrorResponse><Error><Type>Sender</Type>{error}</Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n' + xml).encode()
    start_response(
        f"{fault.http_status} Injected",
        [("Content-Type", "text/xml;charset=UTF-8"), ("Content-Length", str(len(body)))],
    )
    return [body]


def _capture(app: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run a request through moto and keep its whole answer."""
    captured: list[tuple[Any, ...]] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        captured.append((status, headers))
        return lambda data: None  # moto never uses the legacy write() callable

    body = b"".join(app(environ, capture))
    return captured[0][0], captured[0][1], body


def _answer_after(
    gate: Gate, app: Callable[..., Iterable[bytes]], environ: dict[str, Any], start_response: Callable[..., Any],
    notify: Callable[[int, bytes], None],
) -> Iterable[bytes]:
    """Run the request through moto, then park before answering."""
    status, headers, body = _capture(app, environ)
    notify(int(status.split()[0]), body)
    gate.park()
    start_response(status, headers)
    return [body]


def _read_body(environ: dict[str, Any]) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)  # moto reads the body again
    return body


def _api_request(environ: dict[str, Any]) -> Ec2Request | None:
    """An EC2 or STS query-protocol request (form-encoded POST), or None for anything else."""
    scope = _SCOPE_RE.search(environ.get("HTTP_AUTHORIZATION", ""))
    if environ.get("REQUEST_METHOD") != "POST" or scope is None or scope.group("service") not in _SERVICES:
        return None
    body = _read_body(environ)
    params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    return Ec2Request(
        action=params.get("Action", ""),
        region=scope.group("region"),
        zone=params.get("Placement.AvailabilityZone"),
        instance_type=params.get("InstanceType"),
        service=scope.group("service"),
        params=params,
    )


_ec2_request = _api_request  # the older name


class MotoServer:
    """moto's full AWS server on 127.0.0.1, served by werkzeug with a FaultInjector in front.

    `url`, `env()` (variables that send boto3 here), `client(service, region)`, `faults` (the
    injector), `reset()`, `register_image(ssh_user)`, `ami()`, `authorized_keys_command()`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.faults: FaultInjector | None = None
        self._images: dict[tuple[str, str], str] = {}
        self._images_lock = threading.Lock()

    def start(self) -> MotoServer:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class QuietHandler(MotoRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None  # one line per API call drowns the test output

        self.faults = FaultInjector(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self.host, self._port, self.faults, threaded=True, request_handler=QuietHandler)
        self._thread = serve(self._server, "moto-server")
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self, region: str = "us-east-1") -> dict[str, str]:
        """Variables that send boto3 (in this process or a subprocess) to this server."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ENDPOINT_URL_EC2": self.url,
            "AWS_ENDPOINT_URL_SSM": self.url,
            "AWS_ENDPOINT_URL_STS": self.url,
            "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
            "AWS_DEFAULT_REGION": region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str, region: str = "us-east-1", *, internal: bool = False) -> Any:
        """A boto3 client of this server. `internal`: its requests bypass fault injection,
        observers and request counts (the kit's own bookkeeping calls)."""
        import boto3

        client = boto3.client(
            service, region_name=region, endpoint_url=self.url,
            aws_access_key_id=FAKE_KEY_ID, aws_secret_access_key=FAKE_SECRET,
        )
        if internal:
            def mark(request: Any, **_: Any) -> None:
                request.headers[_INTERNAL_HEADER] = "1"

            client.meta.events.register("before-sign", mark)
        return client

    def reset(self) -> None:
        """Forget every resource (moto's reset API); the next call pays backend setup again."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=30).close()
        with self._images_lock:
            self._images.clear()

    def authorized_keys_command(self, region: str | Sequence[str] | None = "us-east-1") -> str:
        """An sshd AuthorizedKeysCommand printing the public keys of moto's key pairs in `region`
        (a name, several, or None for every AWS region in cloudtrain's catalog).

        sshd runs it with an empty environment, so everything it needs is on the command line.
        """
        if region is None:
            from cloudtrain.catalog import default_catalog

            regions: Sequence[str] = default_catalog().regions("aws")
        else:
            regions = [region] if isinstance(region, str) else list(region)
        return " ".join([sys.executable, "-m", "cloudtrain.testing.aws", "authorized-keys", self.url, ",".join(regions)])

    def image(self, region: str, ssh_user: str) -> str:
        """One AMI per region and login user, registered on first use (see register_image)."""
        with self._images_lock:
            key = (region, ssh_user)
            if key not in self._images:
                self._images[key] = self.register_image(ssh_user, region, internal=True)
            return self._images[key]

    def register_image(self, ssh_user: str, region: str = "us-east-1", name: str = "cloudtrain-test-vm",
                       *, internal: bool = False) -> str:
        """A private AMI whose login user is `ssh_user` (tag `cloudtrain-ssh-user`), e.g. the user
        the sshd kit's VMs accept. Returns its id."""
        ec2 = self.client("ec2", region, internal=internal)
        image_id = ec2.register_image(
            Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64",
            BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8}}],
        )["ImageId"]
        ec2.create_tags(Resources=[image_id], Tags=[{"Key": "cloudtrain-ssh-user", "Value": ssh_user}])
        return str(image_id)

    def ami(self, region: str = "us-east-1") -> str:
        """An Ubuntu AMI id that moto knows in `region` (moto ships no 22.04 SSM parameters)."""
        images = self.client("ec2", region).describe_images(
            Owners=["099720109477"], Filters=[{"Name": "name", "Values": ["ubuntu/images/*"]}]
        )["Images"]
        return sorted(images, key=lambda i: i["ImageId"])[0]["ImageId"]


# Variables that would send boto3 to a real account or change its credential chain.
_AWS_VARS_TO_CLEAR = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_REGION",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
)


def isolate_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path, env: dict[str, str]) -> None:
    """Hide the user's AWS setup (~/.aws, profiles, tokens) and apply `env`."""
    for name in _AWS_VARS_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    empty = tmp_dir / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def moto_server_session() -> Iterator[MotoServer]:
    """moto's EC2/SSM/STS server (`MotoServer`) on a free loopback port, started once per test
    session and shared by every test (moto's first EC2 call costs about a second). It does not
    touch the environment: use `moto_server` (or `aws_cloud`) in tests; this one is for
    session-scoped fixtures of your own. Resources live until the session ends or `reset()`."""
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_server(
    moto_server_session: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[MotoServer]:
    """The session's `MotoServer`, with boto3 in this test (and in every subprocess it starts)
    sent to it: AWS_ENDPOINT_URL(_EC2/_SSM/_STS), fake keys, AWS_DEFAULT_REGION=us-east-1, your
    ~/.aws, AWS_PROFILE and AWS_MAX_ATTEMPTS hidden. `moto_server.faults` injects errors
    (`faults.add(...)`, `hold(...)`, `count(...)`) and is cleared before and after the test.
    Resources other tests made are still there: filter by your own cluster names."""
    isolate_aws_env(monkeypatch, tmp_path, moto_server_session.env())
    assert moto_server_session.faults is not None
    moto_server_session.faults.clear()
    try:
        yield moto_server_session
    finally:
        moto_server_session.faults.clear()


# ---------------------------------------------------------------------- aws_cloud

LIVE_STATES = ("pending", "running", "stopping", "stopped")
# aws_cloud.fail(kind): the EC2 code, the action it answers (None: every action) and the service.
FAULT_KINDS: dict[str, tuple[str, str | None, str | None]] = {
    "capacity": ("InsufficientInstanceCapacity", "RunInstances", "ec2"),  # a zone has none: next zone
    "quota": ("VcpuLimitExceeded", "RunInstances", "ec2"),  # the region's vCPU quota: next region
    "auth": ("AuthFailure", None, None),  # every EC2 and STS call: credentials refused
}
_OPERATIONS: dict[str, Any] = {}
_OPERATIONS_LOCK = threading.Lock()


def _parse_ec2(action: str, status: int, body: bytes) -> dict[str, Any]:
    """A moto answer as boto3 would return it (botocore's own parser and service model)."""
    with _OPERATIONS_LOCK:
        if "model" not in _OPERATIONS:
            import botocore.parsers
            import botocore.session

            _OPERATIONS["model"] = botocore.session.get_session().get_service_model("ec2")
            _OPERATIONS["parser"] = botocore.parsers.create_parser("ec2")
        model, parser = _OPERATIONS["model"], _OPERATIONS["parser"]
    shape = model.operation_model(action).output_shape
    return parser.parse({"body": body, "headers": {}, "status_code": status}, shape)


class AwsCloud(FakeCloud):
    """`cloud: aws` against moto, for one test (see the `aws_cloud` fixture).

    server      the session's MotoServer; `faults` is its injector (count, hold, add)
    machines    CloudMachines: `machines.vm(instance_id)` is the sshd VM behind an instance
    region      the default region (us-east-1); every region works
    """

    name = "aws"
    machine_fields = ("region", "zone", "instance_type", "accelerators", "cpus", "memory", "spot", "disk_gb")
    region = "us-east-1"
    allowed_cidr = "203.0.113.7/32"  # TEST-NET-3: the "caller's address" the firewall admits
    instance_type = "t3.medium"  # recipe_resources()' default machine: cheap, moto knows it

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, server: MotoServer, machines: CloudMachines,
                 *, hint: str = "t") -> None:
        assert server.faults is not None
        self.server = server
        self.faults = server.faults
        self.machines = machines
        self._lock = threading.Lock()
        self._launched: dict[str, str] = {}  # instance id -> region, launched during this test
        self._keys: dict[tuple[str, str], str] = {}  # (region, key name) -> public key, imported
        self._groups: set[tuple[str, str]] = set()  # (region, group id), created
        self._clients: dict[str, Any] = {}
        # What EC2 would bill, from moto's own state changes (cloudtrain/testing/bill.py).
        self.bill = FakeBill("aws")
        self._deadlines: list[threading.Timer] = []  # cloud-init's deadline shutdowns (user data)
        super().__init__(
            root, monkeypatch, env={**server.env(self.region), **self.watchdog_env(server)}, hint=hint,
            config={"ssh": {"proxy_command": machines.proxy_command, "allowed_cidr": self.allowed_cidr},
                    "aws": {"region": self.region}},
        )
        self.faults.observers.append(self._observe)
        self.faults.parameters = self._parameter

    def watchdog_env(self, server: MotoServer | None = None) -> dict[str, str]:
        """Every watchdog action of this fixture's VMs goes to moto, never to the machine running
        the tests (the VMs are sshd processes on it): the OS shutdown is the stand-in that does
        what EC2 does when an instance's OS shuts down (cloudtrain.testing.metadata ec2-shutdown)."""
        server = server or self.server
        return {"CLOUDTRAIN_WATCHDOG_SHUTDOWN": f"{shlex.quote(sys.executable)} -m cloudtrain.testing.metadata "
                                                f"ec2-shutdown --endpoint {server.url} --region {self.region}"}

    # ------------------------------------------------------------------ the common shape

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        """`{cloud: aws, instance_type: t3.medium}`: no region, so the plan starts in the cheapest
        (ties: the config's us-east-1) and fails over to the next regions as for a user. With
        overrides naming the machine (instance_type, accelerators, cpus or memory) no default
        type is added."""
        resources: dict[str, Any] = {"cloud": "aws"}
        if not {"instance_type", "accelerators", "cpus", "memory"} & overrides.keys():
            resources["instance_type"] = self.instance_type
        resources.update(overrides)
        return resources

    def fail(self, kind: str, *, zones: Iterable[str] | None = None, regions: Iterable[str] | None = None,
             times: int | None = None, retried: bool = False, message: str | None = None,
             action: str | None = None) -> Fault:
        """Make EC2 refuse: "capacity" (InsufficientInstanceCapacity on RunInstances: cloudtrain
        tries the next zone), "quota" (VcpuLimitExceeded: the next region), "auth" (AuthFailure on
        every EC2 and STS call), or any EC2 error code (on RunInstances unless `action=`).

        `zones` / `regions` limit where; `times`: answer that many requests, then step aside.
        `retried=False` (default) sends HTTP 400, which botocore never retries, so each API call
        fails once and `times=1` fails exactly one call. `retried=True` sends EC2's real status
        (500 for capacity), which botocore retries up to AWS_MAX_ATTEMPTS (5) times with backoff;
        every retry is a request `times` counts. Returns the Fault (`fault.hits`: answered so far).
        """
        code, default_action, service = FAULT_KINDS.get(kind, (kind, "RunInstances", "ec2"))
        real = EC2_STATUS.get(code, 400)
        return self.faults.add(
            code, action=action if action is not None else default_action, service=service, zones=zones,
            regions=regions, times=times, message=message, status=real if retried or real < 500 else 400,
        )

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        for raw in self.instances(states=LIVE_STATES):
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            found.append(f"aws instance {raw['InstanceId']} ({raw['State']['Name']}) of cluster "
                         f"{tags.get('cloudtrain-cluster', '?')} in {self._launched.get(raw['InstanceId'])}")
        with self._lock:
            keys, groups = set(self._keys), set(self._groups)
        for region in sorted({r for r, _ in keys}):
            names = sorted(n for r, n in keys if r == region)
            pairs = self._ec2(region).describe_key_pairs(Filters=[{"Name": "key-name", "Values": names}])["KeyPairs"]
            found += [f"aws key pair {k['KeyName']} in {region}" for k in pairs]
        for region in sorted({r for r, _ in groups}):
            ids = sorted(g for r, g in groups if r == region)
            sgs = self._ec2(region).describe_security_groups(Filters=[{"Name": "group-id", "Values": ids}])
            found += [f"aws security group {g['GroupId']} ({g['GroupName']}) in {region}" for g in sgs["SecurityGroups"]]
        return found

    def close(self) -> None:
        """Stop watching moto, and terminate what this test launched and left running."""
        with self._lock:
            for timer in self._deadlines:
                timer.cancel()
        with self.faults._lock:
            if self._observe in self.faults.observers:
                self.faults.observers.remove(self._observe)
            if self.faults.parameters == self._parameter:
                self.faults.parameters = None
            errors = list(self.faults.observer_errors)
        live = self.instances(states=LIVE_STATES)
        for region in {self._launched[i["InstanceId"]] for i in live}:
            ids = [i["InstanceId"] for i in live if self._launched[i["InstanceId"]] == region]
            self._ec2(region).terminate_instances(InstanceIds=ids)
        if errors:
            raise RuntimeError("aws_cloud could not follow moto: " + "; ".join(errors))

    # ------------------------------------------------------------------ AWS helpers

    def ec2(self, region: str | None = None) -> Any:
        """A boto3 EC2 client of the fake (its calls are counted and can be failed like cloudtrain's)."""
        return self.server.client("ec2", region or self.region)

    def preempt(self, instance_id: str) -> None:
        """A spot interruption, as EC2 reports one: the instance is terminated (its VM powers off, the
        bill ends) with the state reason `Server.SpotInstanceTermination` instead of a user's."""
        from moto.backends import get_backend
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models.instances import StateReason

        with self._lock:
            region = self._launched[instance_id]
        self.ec2(region).terminate_instances(InstanceIds=[instance_id])
        # The server runs in this process: the reason is set on moto's own record (the API has no way).
        instance = get_backend("ec2")[DEFAULT_ACCOUNT_ID][region].get_instance_by_id(instance_id)
        instance._reason = f"Service initiated ({time.strftime('%Y-%m-%d %H:%M:%S GMT', time.gmtime())})"
        instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                            "Server.SpotInstanceTermination")

    def image(self, region: str | None = None) -> str:
        """The AMI the default image parameters name in `region` (login user: the VMs' user)."""
        return self.server.image(region or self.region, self.machines.user)

    def instances(self, cluster: str | None = None, states: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Instances launched during this test (boto3's dicts), optionally of one cluster / in some states."""
        with self._lock:
            launched = dict(self._launched)
        found = []
        with self.faults.transitions:  # a state moto has, the machine has too (FaultInjector.transitions)
            for region in sorted(set(launched.values())):
                ids = [i for i, r in launched.items() if r == region]
                for reservation in self._ec2(region).describe_instances(InstanceIds=ids)["Reservations"]:
                    found += reservation["Instances"]
        if cluster is not None:
            found = [i for i in found if {"Key": "cloudtrain-cluster", "Value": cluster} in i.get("Tags", [])]
        if states is not None:
            found = [i for i in found if i["State"]["Name"] in states]
        return sorted(found, key=lambda i: i["LaunchTime"])

    # ------------------------------------------------------------------ following moto

    def _ec2(self, region: str) -> Any:
        if region not in self._clients:
            self._clients[region] = self.server.client("ec2", region, internal=True)
        return self._clients[region]

    def _parameter(self, region: str, name: str) -> str | None:
        from cloudtrain.providers.aws.api import IMAGE_PARAMS

        return self.image(region) if name in IMAGE_PARAMS.values() else None

    def _observe(self, request: Ec2Request, status: int, body: bytes) -> None:
        if status >= 300 or request.service != "ec2":
            return
        region, action, params = request.region or self.region, request.action, request.params
        if action == "ImportKeyPair" and params.get("KeyName"):
            material = base64.b64decode(params.get("PublicKeyMaterial", "")).decode("utf-8", "replace")
            with self._lock:
                self._keys[(region, params["KeyName"])] = material.strip()
        elif action == "CreateSecurityGroup":
            group = _parse_ec2(action, status, body).get("GroupId")
            with self._lock:
                self._groups.add((region, group))
        elif action == "RunInstances":
            key = self._public_key(region, params.get("KeyName"))
            for raw in _parse_ec2(action, status, body).get("Instances", []):
                with self._lock:
                    self._launched[raw["InstanceId"]] = region
                self._bill_created(region, raw)
                self._honour_deadline(region, raw["InstanceId"], params)
                self.machines.boot(raw["InstanceId"], [key] if key else [])
                self.machines.address(raw["InstanceId"], raw.get("PublicIpAddress"))
        elif action == "DescribeInstances":
            for reservation in _parse_ec2(action, status, body).get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    if raw["InstanceId"] in self.machines:
                        self.machines.address(raw["InstanceId"], raw.get("PublicIpAddress"))
        elif action in ("StopInstances", "TerminateInstances", "StartInstances"):
            out_key = {"StopInstances": "StoppingInstances", "TerminateInstances": "TerminatingInstances",
                       "StartInstances": "StartingInstances"}[action]
            for change in _parse_ec2(action, status, body).get(out_key, []):
                {"StopInstances": self.bill.stopped, "TerminateInstances": self.bill.deleted,
                 "StartInstances": self.bill.started}[action](change["InstanceId"])
                if change["InstanceId"] not in self.machines:
                    continue
                if action == "StartInstances":
                    self.machines.power_on(change["InstanceId"])
                else:
                    self.machines.power_off(change["InstanceId"])

    def _honour_deadline(self, region: str, instance_id: str, params: Mapping[str, str]) -> None:
        """What cloud-init does with the deadline in the user data (templates/deadline.sh): the OS
        shuts down that many seconds after boot, and EC2 makes it a stop or a termination per the
        instance's shutdown behaviour. Here: a timer that asks moto for the same."""
        raw = params.get("UserData")
        if not raw:
            return
        found = re.search(r"CLOUDTRAIN_DEADLINE_S=(\d+)", base64.b64decode(raw).decode("utf-8", "replace"))
        if found is None:
            return
        spot = params.get("InstanceMarketOptions.MarketType") == "spot"

        def shut_down() -> None:
            ec2 = self.ec2(region)
            live = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
            if live["State"]["Name"] not in ("running", "pending"):
                return
            # The behaviour the instance has now (a live `autostop --down` may have changed it).
            behaviour = ec2.describe_instance_attribute(InstanceId=instance_id,
                                                        Attribute="instanceInitiatedShutdownBehavior")
            if spot or behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
                ec2.terminate_instances(InstanceIds=[instance_id])
            else:
                ec2.stop_instances(InstanceIds=[instance_id])

        timer = threading.Timer(int(found.group(1)), shut_down)
        timer.daemon = True
        with self._lock:
            self._deadlines.append(timer)
        timer.start()

    def _bill_created(self, region: str, raw: dict[str, Any]) -> None:
        """EC2's bill from the launch on: the catalog's price of the type in its zone and market,
        its EBS volumes at the storage price per GB."""
        from cloudtrain.catalog import default_catalog
        from cloudtrain.cost import HOURS_PER_MONTH, disk_price

        zone = raw.get("Placement", {}).get("AvailabilityZone")
        spot = raw.get("InstanceLifecycle") == "spot"
        hourly = default_catalog().price("aws", region, raw.get("InstanceType", ""), spot=spot, zone=zone)
        attached = [{"Name": "attachment.instance-id", "Values": [raw["InstanceId"]]}]
        size = sum(v.get("Size", 0) for v in self._ec2(region).describe_volumes(Filters=attached)["Volumes"])
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        if not tags:
            described = self._ec2(region).describe_instances(InstanceIds=[raw["InstanceId"]])["Reservations"]
            tags = {t["Key"]: t["Value"] for r in described for i in r["Instances"] for t in i.get("Tags", [])}
        # From EC2's own launch time, not from when this observer got to it (the describe calls
        # above take seconds on a loaded machine; EC2 bills from the launch).
        launched = raw.get("LaunchTime")
        self.bill.created(raw["InstanceId"], tags.get("cloudtrain-cluster", ""), hourly or 0.0,
                          (disk_price("aws") or 0.0) * size / HOURS_PER_MONTH,
                          at=launched.timestamp() if hasattr(launched, "timestamp") else None)

    def _public_key(self, region: str, name: str | None) -> str | None:
        if not name:
            return None
        with self._lock:
            known = self._keys.get((region, name))
        if known:
            return known
        pairs = self._ec2(region).describe_key_pairs(KeyNames=[name], IncludePublicKey=True)["KeyPairs"]
        return pairs[0].get("PublicKey") if pairs else None


@pytest.fixture
def aws_cloud(moto_server: MotoServer, sshd_vm_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[AwsCloud]:
    """`cloud: aws` for this test, offline, with no settings of yours (an `AwsCloud`).

    EC2, SSM and STS are moto's server (`moto_server`); each instance moto launches, in any region,
    boots its own sshd VM that trusts the instance's key pair and is reached at the instance's
    public IP (through `config.ssh.proxy_command`; a new IP after stop/start follows the instance;
    stop/terminate power the VM off). The default Ubuntu / Deep Learning AMI parameters answer in
    every region with an AMI whose login user is the VMs' user. The config sets the caller CIDR,
    the region and short SSH windows; HOME and CLOUDTRAIN_HOME are the test's own; `cluster` is
    unique. `fail("capacity" | "quota" | "auth", ...)` injects faults that botocore does not
    retry unless `retried=True`. At teardown what the test left running is terminated.

        def test_train(aws_cloud):
            result = aws_cloud.run(aws_cloud.recipe("recipes/train.yaml"))
            assert result.ok, result.output
            assert aws_cloud.leftovers() == []
    """
    cloud = AwsCloud(tmp_path_factory.mktemp("aws-cloud"), monkeypatch, moto_server, CloudMachines(sshd_vm_factory),
                     hint=cluster_hint(request))
    try:
        yield cloud
    finally:
        cloud.close()


def _print_authorized_keys(url: str, regions: str) -> int:
    import boto3

    for region in regions.split(","):
        ec2 = boto3.client(
            "ec2", region_name=region, endpoint_url=url, aws_access_key_id=FAKE_KEY_ID,
            aws_secret_access_key=FAKE_SECRET,
        )
        for pair in ec2.describe_key_pairs(IncludePublicKey=True)["KeyPairs"]:
            if pair.get("PublicKey"):
                print(pair["PublicKey"].strip())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "authorized-keys":
        print("usage: python -m cloudtrain.testing.aws authorized-keys MOTO_URL REGION[,REGION...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(_print_authorized_keys(sys.argv[2], sys.argv[3]))
