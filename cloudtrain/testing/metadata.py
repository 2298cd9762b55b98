"""What a VM asks of its own cloud, faked for the on-node watchdog (cloudtrain/node).

- `MetadataServer`: an instance metadata server on loopback answering the two token endpoints a
  watchdog uses to act with the machine's own identity, with the headers the real ones require:
    GCE metadata server  GET /computeMetadata/v1/instance/service-accounts/default/token
                         (header `Metadata-Flavor: Google`) -> {"access_token", "expires_in", "token_type"}
    Azure IMDS           GET /metadata/identity/oauth2/token?api-version=...&resource=...
                         (header `Metadata: true`) -> {"access_token", "expires_on", "resource", "token_type"}
  and the clouds' interruption notices, as each documents them (`interrupt(cloud)` arms one,
  `clear()` takes it back; until then each answers "nothing scheduled"):
    EC2 IMDSv2           GET /latest/meta-data/spot/instance-action (header `X-aws-ec2-metadata-token`
                         from PUT /latest/api/token) -> 404, or {"action": "terminate", "time": <now + 2 min>}
    GCE metadata server  GET /computeMetadata/v1/instance/preempted (`Metadata-Flavor: Google`) -> FALSE | TRUE
    Azure IMDS           GET /metadata/scheduledevents?api-version=... (`Metadata: true`) ->
                         {"DocumentIncarnation": n, "Events": [{"EventType": "Preempt", "Resources": [vm], ...}]}
  The fake cannot tell which machine asks (the real ones answer by source address): an armed
  notice is every asker's, so a test arms it for one machine and clears it once it was served
  (`notices_served(cloud)`).
  Point the watchdog at it with `CLOUDTRAIN_WATCHDOG_METADATA_URL=<server.url>` (read when the CLI
  writes the watchdog's config). `requests` lists what it was asked; `token_for(kind)` is the token
  it hands out, which the fake cloud API should expect as the bearer token. `fail(status)` makes
  the next answers fail (a metadata server that is not there yet).
- `metadata_server`: a fixture with one of them for the test.
- An OS-shutdown stand-in for EC2, for a VM that is an sshd process and cannot power off:

      python -m cloudtrain.testing.metadata ec2-shutdown --endpoint URL [--region R]

  does what EC2 does when an instance's OS shuts down: reads the instance's
  InstanceInitiatedShutdownBehavior and calls StopInstances or TerminateInstances for it (the
  instance id comes from $CLOUDTRAIN_INSTANCE_ID, which the watchdog sets for its shutdown command).
  Use it as the watchdog's shutdown command: `CLOUDTRAIN_WATCHDOG_SHUTDOWN="<python> -m
  cloudtrain.testing.metadata ec2-shutdown --endpoint <moto url>"`.
- The same for Compute Engine, against the fake GCE (cloudtrain.testing.gcp):

      python -m cloudtrain.testing.metadata gce-shutdown --endpoint URL --project P --key-file KEY

  does what Compute Engine does when a guest OS powers off: the instance `$CLOUDTRAIN_INSTANCE_ID`
  (`<zone>:<name>`, cloudtrain's GCP instance id) goes TERMINATED, i.e. stopped, whatever its
  scheduling says (instanceTerminationAction applies to preemption and maxRunDuration only). It
  calls instances.stop with the kit's service-account key (KEY, the fake's `key_file`: the
  hypervisor needs no credentials of the VM) and waits for the operation. `gcp_cloud.watchdog_env()`
  sets it up.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from cloudtrain.node.protocol import ENV_INSTANCE_ID
from cloudtrain.testing.serving import serve, stop_serving

GCE_TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
EC2_TOKEN_PATH = "/latest/api/token"
EC2_CREDENTIALS_PATH = "/latest/meta-data/iam/security-credentials/"
IMDS_TOKEN_PATH = "/metadata/identity/oauth2/token"
EC2_NOTICE_PATH = "/latest/meta-data/spot/instance-action"
GCE_NOTICE_PATH = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS_PATH = "/metadata/scheduledevents"


@dataclass(frozen=True)
class MetadataRequest:
    kind: str  # "gce" | "imds" | "unknown"
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int


@dataclass
class MetadataServer:
    """A fake instance metadata server (GCE metadata server and Azure IMDS token endpoints)."""

    host: str = "127.0.0.1"
    requests: list[MetadataRequest] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=lambda: {
        "gce": "ya29.fake-" + secrets.token_hex(8), "imds": "eyJ.fake-" + secrets.token_hex(8)})
    # EC2 instance metadata (IMDSv2): the role credentials of the instance profile, from a callback
    # that returns (role name, {AccessKeyId, SecretAccessKey, Token, Expiration}) or None (no profile
    # attached: 404, as on EC2). cloudtrain.testing.buckets sets it (moto STS AssumeRole).
    ec2_credentials: Callable[[], tuple[str, dict[str, str]] | None] | None = None
    _ec2_tokens: set[str] = field(default_factory=set)
    _fail_status: int | None = None
    _fail_times: int = 0
    _notices: dict[str, list[str]] = field(default_factory=dict)  # armed: cloud -> the VMs Azure's event names
    _incarnation: int = 1
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> MetadataServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                if not server._answer_ec2(self):
                    server._answer(self)

            def do_PUT(self) -> None:
                if not server._answer_ec2(self):
                    server._answer(self)

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = serve(self._server, "metadata-server")
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def token_for(self, kind: str) -> str:
        """The bearer token handed out by the "gce" or "imds" endpoint."""
        return self.tokens[kind]

    def fail(self, status: int = 503, times: int = 1) -> None:
        """Answer the next `times` token requests with HTTP `status`."""
        with self._lock:
            self._fail_status, self._fail_times = status, times

    def interrupt(self, cloud: str, machines: list[str] | None = None) -> None:
        """Announce that the cloud takes the machine back: "aws", "gcp" or "azure" (`machines`: the
        VM names Azure's Preempt event lists)."""
        if cloud not in ("aws", "gcp", "azure"):
            raise ValueError(f"no interruption notice for {cloud!r}")
        with self._lock:
            self._notices[cloud] = list(machines or [])
            self._incarnation += 1

    def clear(self) -> None:
        """No interruption scheduled any more (for machines that ask from now on)."""
        with self._lock:
            self._notices.clear()
            self._incarnation += 1

    def notices_served(self, cloud: str) -> int:
        """How many answers announced an interruption of `cloud`'s kind."""
        with self._lock:
            return sum(1 for r in self.requests if r.kind == f"notice-{cloud}" and r.status == 200
                       and r.query.get("served") == "yes")

    def seen(self, kind: str) -> list[MetadataRequest]:
        with self._lock:
            return [r for r in self.requests if r.kind == kind]

    def _answer_ec2(self, handler: BaseHTTPRequestHandler) -> bool:
        """EC2's IMDSv2 token and role-credential paths (as the instance metadata reference describes
        them); False for any other path."""
        path = urlsplit(handler.path).path
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if path == EC2_TOKEN_PATH and handler.command == "PUT" and "x-aws-ec2-metadata-token-ttl-seconds" in headers:
            token = "AQAE-fake-" + secrets.token_hex(8)
            with self._lock:
                self._ec2_tokens.add(token)
            status, body, kind = 200, token.encode(), "text/plain"
        elif path.startswith(EC2_CREDENTIALS_PATH.rstrip("/")) and handler.command == "GET":
            found = self.ec2_credentials() if self.ec2_credentials is not None else None
            role = path[len(EC2_CREDENTIALS_PATH):].strip("/") if len(path) > len(EC2_CREDENTIALS_PATH) else ""
            if headers.get("x-aws-ec2-metadata-token") not in self._ec2_tokens:
                status, body, kind = 401, b"", "text/plain"  # HttpTokens required: no session token, no answer
            elif found is None or (role and role != found[0]):
                status, body, kind = 404, b"", "text/plain"
            elif not role:
                status, body, kind = 200, found[0].encode(), "text/plain"
            else:
                answer = {"Code": "Success", "Type": "AWS-HMAC", "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                          **found[1]}
                status, body, kind = 200, json.dumps(answer).encode(), "application/json"
        else:
            return False
        with self._lock:
            self.requests.append(MetadataRequest("ec2", path, {}, headers, status))
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
        return True

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if parts.path in (EC2_NOTICE_PATH, GCE_NOTICE_PATH, AZURE_EVENTS_PATH) and handler.command == "GET":
            self._answer_notice(handler, parts.path, query, headers)
            return
        if parts.path == GCE_TOKEN_PATH:
            kind = "gce"
            allowed = headers.get("metadata-flavor") == "Google"
            body = {"access_token": self.tokens["gce"], "expires_in": 3599, "token_type": "Bearer"}
        elif parts.path == IMDS_TOKEN_PATH:
            kind = "imds"
            # IMDS also refuses requests that carry X-Forwarded-For (came through a proxy).
            allowed = headers.get("metadata") == "true" and "x-forwarded-for" not in headers and "resource" in query
            body = {"access_token": self.tokens["imds"], "expires_on": str(int(time.time()) + 3600),
                    "resource": query.get("resource", ""), "token_type": "Bearer"}
        else:
            kind, allowed, body = "unknown", False, {}
        with self._lock:
            status = 200 if allowed else (400 if kind != "unknown" else 404)
            if kind != "unknown" and self._fail_times > 0 and self._fail_status is not None:
                status = self._fail_status
                self._fail_times -= 1
            self.requests.append(MetadataRequest(kind, parts.path, query, headers, status))
        payload = json.dumps(body if status == 200 else {"error": "refused"}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


    def _answer_notice(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, str],
                       headers: dict[str, str]) -> None:
        """The interruption-notice endpoints, with the headers each real one requires."""
        with self._lock:
            notices, incarnation = dict(self._notices), self._incarnation
            ec2_token_ok = headers.get("x-aws-ec2-metadata-token") in self._ec2_tokens
        served = False
        if path == EC2_NOTICE_PATH:
            kind = "notice-aws"
            served = ec2_token_ok and "aws" in notices
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
            status = 401 if not ec2_token_ok else (200 if served else 404)  # HttpTokens required
            body = json.dumps({"action": "terminate", "time": when}).encode() if served else b""
            ctype = "application/json"
        elif path == GCE_NOTICE_PATH:
            kind = "notice-gcp"
            ok = headers.get("metadata-flavor") == "Google"
            served = ok and "gcp" in notices
            status, ctype = (200 if ok else 403), "application/text"
            body = (b"TRUE" if served else b"FALSE") if ok else b""
        else:
            kind = "notice-azure"
            ok = headers.get("metadata") == "true" and "api-version" in query and "x-forwarded-for" not in headers
            served = ok and "azure" in notices
            events = [{"EventId": f"preempt-{incarnation}", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                       "Resources": notices.get("azure", []), "EventStatus": "Scheduled",
                       "NotBefore": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30)),
                       "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}] if served else []
            status, ctype = (200 if ok else 400), "application/json"
            body = json.dumps({"DocumentIncarnation": incarnation, "Events": events}).encode() if ok else b""
        with self._lock:
            self.requests.append(MetadataRequest(kind, path, {**query, "served": "yes" if served else "no"},
                                                 headers, status))
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


@pytest.fixture
def metadata_server() -> Iterator[MetadataServer]:
    """A fake instance metadata server on loopback for this test (`MetadataServer`): the GCE
    metadata server's and Azure IMDS's token endpoints, checking the headers the real ones
    require. Point the watchdog at it with CLOUDTRAIN_WATCHDOG_METADATA_URL=metadata_server.url."""
    server = MetadataServer().start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------- EC2 shutdown


def ec2_shutdown(endpoint: str, region: str, instance_id: str) -> str:
    """What EC2 does when the OS of `instance_id` shuts down: stop or terminate it, as its
    InstanceInitiatedShutdownBehavior says. Returns the behaviour applied."""
    import boto3

    from cloudtrain.testing.aws import FAKE_KEY_ID, FAKE_SECRET

    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint, aws_access_key_id=FAKE_KEY_ID,
                       aws_secret_access_key=FAKE_SECRET)
    behavior = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
    value = behavior["InstanceInitiatedShutdownBehavior"]["Value"]
    if value == "terminate":
        ec2.terminate_instances(InstanceIds=[instance_id])
    else:
        ec2.stop_instances(InstanceIds=[instance_id])
    return value


# ---------------------------------------------------------------------------------------- GCE shutdown


def gce_shutdown(endpoint: str, project: str, instance_id: str, key_file: str) -> str:
    """What Compute Engine does when the guest OS of `instance_id` (`<zone>:<name>`) powers off: the
    instance stops (TERMINATED). Returns its status afterwards."""
    from google.cloud import compute_v1
    from google.oauth2 import service_account

    zone, sep, name = instance_id.partition(":")
    if not (sep and zone and name):
        raise ValueError(f"{instance_id!r} is not a GCP instance id (<zone>:<name>)")
    credentials = service_account.Credentials.from_service_account_file(
        key_file, scopes=["https://www.googleapis.com/auth/cloud-platform"])
    options = {"api_endpoint": endpoint}
    instances = compute_v1.InstancesClient(credentials=credentials, transport="rest", client_options=options)
    operations = compute_v1.ZoneOperationsClient(credentials=credentials, transport="rest", client_options=options)
    operation = instances.stop_unary(project=project, zone=zone, instance=name, timeout=60)
    while operation.status != compute_v1.Operation.Status.DONE:  # `wait` long-polls on the server
        operation = operations.wait(project=project, zone=zone, operation=operation.name, timeout=60)
    return instances.get(project=project, zone=zone, instance=name, timeout=60).status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloudtrain.testing.metadata")
    sub = parser.add_subparsers(dest="command", required=True)
    shutdown = sub.add_parser("ec2-shutdown", help="an OS shutdown of an EC2 instance, against moto")
    shutdown.add_argument("--endpoint", required=True, help="moto's URL")
    shutdown.add_argument("--region", default="us-east-1")
    shutdown.add_argument("--instance-id", default=os.environ.get(ENV_INSTANCE_ID))
    gce = sub.add_parser("gce-shutdown", help="an OS shutdown of a GCE instance, against the fake Compute Engine")
    gce.add_argument("--endpoint", required=True, help="the fake Compute Engine's URL")
    gce.add_argument("--project", required=True)
    gce.add_argument("--key-file", default=os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"),
                     help="a service-account key the fake knows (default: $GOOGLE_APPLICATION_CREDENTIALS)")
    gce.add_argument("--instance-id", default=os.environ.get(ENV_INSTANCE_ID), help="<zone>:<name>")
    args = parser.parse_args(argv)
    if not args.instance_id:
        parser.error(f"no instance id: pass --instance-id or set {ENV_INSTANCE_ID}")
    if args.command == "gce-shutdown":
        if not args.key_file:
            parser.error("no key file: pass --key-file or set GOOGLE_APPLICATION_CREDENTIALS")
        status = gce_shutdown(args.endpoint, args.project, args.instance_id, args.key_file)
        print(f"shutdown of {args.instance_id}: {status}", flush=True)
        return 0
    print(f"shutdown of {args.instance_id}: {ec2_shutdown(args.endpoint, args.region, args.instance_id)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
