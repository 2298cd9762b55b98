"""AWS test kit: moto's server on loopback with server-side error injection.

Fixtures (exposed by the `cloudtrain` pytest plugin):

- `moto_server_session`: one `MotoServer` for the whole test session (moto's first EC2 call costs
  about a second of backend setup; sharing the server pays it once). Tests keep apart by using
  their own cluster names, or call `server.reset()` for a blank account.
- `moto_server`: the same server, plus this test's environment: AWS_ENDPOINT_URL(_EC2/_SSM/_STS)
  pointing at it, fake keys, AWS_DEFAULT_REGION=us-east-1, the user's ~/.aws hidden and instance
  metadata lookups off. Subprocesses (`cloudtrain` CLI runs) inherit all of it. Faults added during
  the test are cleared afterwards.

Error injection happens in the server, in front of moto's WSGI app, so it works for a CLI running
in a subprocess too:

    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1a"})
    moto_server.faults.add("VcpuLimitExceeded", regions={"us-east-1"}, times=1)
    moto_server.faults.count("RunInstances", zone="us-east-1b")   # requests seen
    gate = moto_server.faults.hold("RunInstances", after=True)     # moto launches, the answer waits
    gate.wait_held(timeout=60); ...; gate.release()                # ...until the test lets go

A VM from the sshd kit can trust the key pairs moto holds, as cloud-init would on EC2:
`SshdFactory.start(authorized_keys_command=moto_server.authorized_keys_command())`.

moto and boto3 are imported when a server starts, never when this module is imported.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import pytest

_SCOPE_RE = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request")
FAKE_KEY_ID = "AKIACLOUDTRAINTEST00"
FAKE_SECRET = "cloudtrain-test-secret"  # noqa: S105 - moto accepts any key pair
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
}


@dataclass(frozen=True)
class Ec2Request:
    action: str
    region: str | None
    zone: str | None
    instance_type: str | None


@dataclass
class Fault:
    """Answer matching EC2 requests with `code`. None in a filter means "any"."""

    code: str
    action: str = "RunInstances"
    regions: frozenset[str] | None = None
    zones: frozenset[str] | None = None
    message: str | None = None
    status: int = 500  # what EC2 sends for capacity errors (botocore retries 5xx)
    times: int | None = None  # answer this many matching requests, then step aside
    when: Callable[[Ec2Request], bool] | None = None
    hits: int = 0

    def matches(self, request: Ec2Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if request.action != self.action:
            return False
        if self.regions is not None and request.region not in self.regions:
            return False
        if self.zones is not None and request.zone not in self.zones:
            return False
        return self.when is None or self.when(request)


@dataclass
class Gate:
    """Parks matching EC2 requests until released: a test can act "between" two API calls."""

    action: str
    when: Callable[[Ec2Request], bool] | None = None
    after: bool = False  # let moto act first and park the answer (the caller never hears back)
    _released: threading.Event = field(default_factory=threading.Event)
    _held: threading.Event = field(default_factory=threading.Event)

    def matches(self, request: Ec2Request) -> bool:
        return request.action == self.action and (self.when is None or self.when(request))

    def park(self) -> None:
        self._held.set()
        # Bounded, so a test that forgets to release cannot hang the server forever.
        self._released.wait(timeout=600)

    def wait_held(self, timeout: float) -> bool:
        """True once a matching request is parked."""
        return self._held.wait(timeout)

    def release(self) -> None:
        self._released.set()


@dataclass
class FaultInjector:
    """WSGI middleware in front of moto: records EC2 requests and fails the ones a Fault matches."""

    app: Callable[..., Iterable[bytes]]
    faults: list[Fault] = field(default_factory=list)
    requests: list[Ec2Request] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self,
        code: str,
        *,
        action: str = "RunInstances",
        regions: Iterable[str] | None = None,
        zones: Iterable[str] | None = None,
        message: str | None = None,
        status: int = 500,
        times: int | None = None,
        when: Callable[[Ec2Request], bool] | None = None,
    ) -> Fault:
        fault = Fault(
            code=code,
            action=action,
            regions=frozenset(regions) if regions is not None else None,
            zones=frozenset(zones) if zones is not None else None,
            message=message,
            status=status,
            times=times,
            when=when,
        )
        with self._lock:
            self.faults.append(fault)
        return fault

    def hold(self, action: str, *, after: bool = False, when: Callable[[Ec2Request], bool] | None = None) -> Gate:
        gate = Gate(action, when, after)
        with self._lock:
            self.gates.append(gate)
        return gate

    def clear(self) -> None:
        with self._lock:
            for gate in self.gates:
                gate.release()
            self.gates.clear()
            self.faults.clear()
            self.requests.clear()

    def count(self, action: str, *, zone: str | None = None, region: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.action == action and (zone is None or r.zone == zone) and (region is None or r.region == region)
            )

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = _ec2_request(environ)
        if request is None:
            return self.app(environ, start_response)
        with self._lock:
            self.requests.append(request)
            gate = next((g for g in self.gates if g.matches(request)), None)
        if gate is not None and gate.after:
            return _answer_after(gate, self.app, environ, start_response)
        if gate is not None:
            gate.park()
        with self._lock:
            fault = next((f for f in self.faults if f.matches(request)), None)
            if fault is not None:
                fault.hits += 1
        if fault is None:
            return self.app(environ, start_response)
        message = fault.message or _DEFAULT_MESSAGES.get(fault.code, fault.code)
        message = message.format(zone=request.zone or "", instance_type=request.instance_type or "")
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Response><Errors><Error><Code>{escape(fault.code)}</Code><Message>{escape(message)}</Message>"
            f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
        ).encode()
        start_response(
            f"{fault.status} Injected",
            [("Content-Type", "text/xml;charset=UTF-8"), ("Content-Length", str(len(body)))],
        )
        return [body]


def _answer_after(
    gate: Gate, app: Callable[..., Iterable[bytes]], environ: dict[str, Any], start_response: Callable[..., Any]
) -> Iterable[bytes]:
    """Run the request through moto, then park before answering."""
    captured: list[tuple[Any, ...]] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        captured.append((status, headers))
        return lambda data: None  # moto never uses the legacy write() callable

    body = list(app(environ, capture))
    gate.park()
    start_response(*captured[0])
    return body


def _ec2_request(environ: dict[str, Any]) -> Ec2Request | None:
    """An EC2 query-protocol request (form-encoded POST), or None for anything else."""
    scope = _SCOPE_RE.search(environ.get("HTTP_AUTHORIZATION", ""))
    if environ.get("REQUEST_METHOD") != "POST" or scope is None or scope.group("service") != "ec2":
        return None
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)  # moto reads the body again
    params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    return Ec2Request(
        action=params.get("Action", ""),
        region=scope.group("region"),
        zone=params.get("Placement.AvailabilityZone"),
        instance_type=params.get("InstanceType"),
    )


class MotoServer:
    """moto's full AWS server on 127.0.0.1, served by werkzeug with a FaultInjector in front."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.faults: FaultInjector | None = None

    def start(self) -> MotoServer:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        class QuietHandler(MotoRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None  # one line per API call drowns the test output

        self.faults = FaultInjector(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self.host, self._port, self.faults, threaded=True, request_handler=QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

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

    def client(self, service: str, region: str = "us-east-1") -> Any:
        import boto3

        return boto3.client(
            service, region_name=region, endpoint_url=self.url,
            aws_access_key_id=FAKE_KEY_ID, aws_secret_access_key=FAKE_SECRET,
        )

    def reset(self) -> None:
        """Forget every resource (moto's reset API); the next call pays backend setup again."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=30).close()

    def authorized_keys_command(self, region: str = "us-east-1") -> str:
        """An sshd AuthorizedKeysCommand printing the public keys of moto's key pairs in `region`.

        sshd runs it with an empty environment, so everything it needs is on the command line.
        """
        return " ".join([sys.executable, "-m", "cloudtrain.testing.aws", "authorized-keys", self.url, region])

    def register_image(self, ssh_user: str, region: str = "us-east-1", name: str = "cloudtrain-test-vm") -> str:
        """A private AMI whose login user is `ssh_user` (tag `cloudtrain-ssh-user`), e.g. the user
        the sshd kit's VMs accept. Returns its id."""
        ec2 = self.client("ec2", region)
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
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_server(
    moto_server_session: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[MotoServer]:
    isolate_aws_env(monkeypatch, tmp_path, moto_server_session.env())
    assert moto_server_session.faults is not None
    moto_server_session.faults.clear()
    try:
        yield moto_server_session
    finally:
        moto_server_session.faults.clear()


def _print_authorized_keys(url: str, region: str) -> int:
    import boto3

    ec2 = boto3.client(
        "ec2", region_name=region, endpoint_url=url, aws_access_key_id=FAKE_KEY_ID, aws_secret_access_key=FAKE_SECRET
    )
    for pair in ec2.describe_key_pairs(IncludePublicKey=True)["KeyPairs"]:
        if pair.get("PublicKey"):
            print(pair["PublicKey"].strip())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "authorized-keys":
        print("usage: python -m cloudtrain.testing.aws authorized-keys MOTO_URL REGION", file=sys.stderr)
        sys.exit(2)
    sys.exit(_print_authorized_keys(sys.argv[2], sys.argv[3]))
