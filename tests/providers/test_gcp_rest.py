"""The gcp provider without the SDK: its reads and the writes of stop, start, down and the liveness
mark as REST calls (api.ComputeApi.get_json / post_json / delete_json and `wait`, google-auth's
AuthorizedSession), against the fake Compute Engine.

What it must keep: the Instance records the SDK path made (the former reader, `sdk_record` below,
is the oracle, fed by the real SDK), the requests the SDK's transport sent for each write and wait
(method, path, query, content type, body: `Recorder`), the errors `call` made of the SDK's
exceptions and of its operations' `error.errors[]`, every page of a listing; and what it is for:
`describe`, `list_tagged`, `stop`, `start`, `terminate`, `mark_alive` and `release_resources` never
import google.cloud.compute_v1 (2-4 s of import on `status --refresh`, `stop`, `start`, `down`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest

from cloudtrain.errors import CloudtrainError, CredentialsError, ProviderError
from cloudtrain.expiry import expiry_of
from cloudtrain.providers.base import (
    TAG_ALIVE,
    TAG_CLUSTER,
    TAG_INCARNATION,
    TAG_OWNER,
    Instance,
    InstanceSpec,
    InstanceState,
    alive_of,
    alive_value,
    owner_id,
)
from cloudtrain.providers.gcp import GcpProvider, build
from cloudtrain.providers.gcp.api import Backoff, GcpApiError
from cloudtrain.testing.gcp import GceServer
from cloudtrain.testing.serving import serve, stop_serving
from tests.lazy import requires

pytestmark = [pytest.mark.quick, requires("google.cloud.compute_v1")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheGcpRestTests test"


@pytest.fixture
def waits() -> list[float]:
    return []


@pytest.fixture
def provider(gce_server: GceServer, waits: list[float]) -> GcpProvider:
    made = GcpProvider(**gce_server.config(region="us-central1"))
    made.api.backoff = Backoff(sleep=waits.append)  # the backoff's waits are recorded, not slept
    return made


def spec(cluster: str, **kwargs: Any) -> InstanceSpec:
    defaults: dict[str, Any] = {"owner": owner_id(), "instance_type": "e2-standard-2", "region": "us-central1",
                                "ssh_public_key": KEY, "allowed_cidr": "203.0.113.7/32"}
    return InstanceSpec(cluster=cluster, **{**defaults, **kwargs})


# the oracle: the SDK path's reader, as it was before the read path left the SDK ------------------


def sdk_record(raw: Any, zone: str) -> Instance:
    """An SDK Instance (compute_v1, read by attribute) -> ours: build.instance_record as it was."""
    def timestamp(value: str) -> float | None:
        return datetime.fromisoformat(value).timestamp() if value else None

    labels = dict(raw.labels or {})
    public_ip = private_ip = None
    if raw.network_interfaces:
        nic = raw.network_interfaces[0]
        private_ip = nic.network_i_p or None
        public_ip = next((c.nat_i_p for c in nic.access_configs if c.nat_i_p), None)
    accelerators = [(build.last_part(a.accelerator_type), a.accelerator_count) for a in raw.guest_accelerators]
    return Instance(
        id=build.instance_id(zone, raw.name), cluster=labels.get(TAG_CLUSTER, ""),
        incarnation=labels.get(TAG_INCARNATION), alive_at=alive_of(labels), expiry=expiry_of(labels),
        state=build.STATES.get(raw.status, InstanceState.UNKNOWN),
        instance_type=build.instance_type_name(build.last_part(raw.machine_type), accelerators)
        if raw.machine_type else None,
        region=build.region_of(zone), zone=zone, public_ip=public_ip, private_ip=private_ip,
        ssh_user=labels.get(build.LABEL_SSH_USER, build.SSH_USER),
        launched_at=timestamp(raw.last_start_timestamp or raw.creation_timestamp),
        spot=bool(raw.scheduling and raw.scheduling.provisioning_model == "SPOT"),
        disk_gb=sum(d.disk_size_gb for d in raw.disks if d.disk_size_gb) or None,
        state_since=timestamp(raw.last_start_timestamp) if raw.status == "RUNNING"
        else timestamp(raw.last_stop_timestamp) if raw.status in ("TERMINATED", "STOPPING", "SUSPENDED") else None,
    )


def sdk_describe(gce: GceServer, ids: Iterable[str]) -> list[Instance]:
    instances = gce.client("instances")
    found = []
    for value in ids:
        zone, name = value.split(":")
        found.append(sdk_record(instances.get(project=gce.project, zone=zone, instance=name), zone))
    return found


def sdk_listed(gce: GceServer, cluster: str) -> list[Instance]:
    listing = gce.client("instances").aggregated_list(request={
        "project": gce.project,
        "filter": f'(labels.{TAG_CLUSTER} = "{cluster}") (labels.{TAG_OWNER} = "{owner_id()}")'})
    return [sdk_record(raw, scope.split("/", 1)[1]) for scope, scoped in listing if scope.startswith("zones/")
            for raw in scoped.instances]


# records -----------------------------------------------------------------------------------------


def test_describe_and_list_tagged_answer_what_the_sdk_path_answered(gce_server: GceServer,
                                                                    provider: GcpProvider) -> None:
    (plain,) = provider.launch(spec("mix", tags={TAG_ALIVE: "1000"}), 1)
    (gpu,) = provider.launch(spec("mix", instance_type="n1-standard-4+t4x1", spot=True, disk_gb=120), 1)
    (stopped,) = provider.launch(spec("mix", zone="us-central1-c"), 1)
    (gone,) = provider.launch(spec("mix"), 1)
    provider.stop([stopped.id])
    provider.terminate([gone.id])
    live = [plain.id, gpu.id, stopped.id]

    described = provider.describe([*live, gone.id])
    assert described[:3] == sdk_describe(gce_server, live)
    assert described[3] == Instance(gone.id, "", InstanceState.TERMINATED)
    listed = sorted(provider.list_tagged("mix"), key=lambda i: i.id)
    assert listed == sorted(sdk_listed(gce_server, "mix"), key=lambda i: i.id)
    assert listed == sorted(described[:3], key=lambda i: i.id)
    # What each case must carry, so that agreeing is not agreeing on nothing.
    by_id = {i.id: i for i in described}
    assert by_id[plain.id].state is InstanceState.RUNNING and by_id[plain.id].public_ip
    assert by_id[plain.id].private_ip and by_id[plain.id].alive_at == 1000.0 and not by_id[plain.id].spot
    assert by_id[plain.id].state_since and by_id[plain.id].launched_at and by_id[plain.id].cluster == "mix"
    assert (by_id[gpu.id].instance_type, by_id[gpu.id].spot, by_id[gpu.id].disk_gb) == ("n1-standard-4+t4x1", True, 120)
    assert (by_id[stopped.id].state, by_id[stopped.id].public_ip) == (InstanceState.STOPPED, None)
    assert by_id[stopped.id].state_since is not None and by_id[stopped.id].zone == "us-central1-c"
    assert gce_server.instance("us-central1-c", stopped.id.split(":")[1])["lastStopTimestamp"]


def test_the_record_reads_absent_fields_as_the_sdk_read_its_zero_values() -> None:
    """A PROVISIONING instance has no addresses, timestamps but its creation, nor labels; a
    SUSPENDED one has its lastStopTimestamp; an unknown status is UNKNOWN."""
    bare = build.instance_record({"name": "n", "status": "PROVISIONING", "creationTimestamp":
                                  "2026-01-01T00:00:00.000-08:00"}, "us-east1-b")
    assert (bare.state, bare.public_ip, bare.private_ip, bare.disk_gb, bare.instance_type, bare.spot) == (
        InstanceState.PENDING, None, None, None, None, False)
    assert bare.launched_at == datetime.fromisoformat("2026-01-01T00:00:00-08:00").timestamp()
    assert (bare.state_since, bare.cluster, bare.ssh_user, bare.region) == (None, "", build.SSH_USER, "us-east1")
    suspended = build.instance_record({"name": "n", "status": "SUSPENDED", "lastStopTimestamp":
                                       "2026-01-02T00:00:00Z", "disks": [{"diskSizeGb": "10"}, {"diskSizeGb": "5"}]},
                                      "us-east1-b")
    assert suspended.state is InstanceState.STOPPED and suspended.disk_gb == 15
    assert suspended.state_since == datetime.fromisoformat("2026-01-02T00:00:00+00:00").timestamp()
    assert build.instance_record({"name": "n", "status": "NEW_STATE"}, "us-east1-b").state is InstanceState.UNKNOWN


# paging ------------------------------------------------------------------------------------------


class PagingGce:
    """The fake's aggregatedList answers in one page (it ignores maxResults and pageToken); Compute
    Engine pages it (at most 500 items a page, a zone's items split across pages). This WSGI layer
    in front of the fake serves each zone that has instances as its own page, so a reader that
    stops after the first page sees one zone only. Every request it saw is in `seen`."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.seen: list[dict[str, list[str]]] = []
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not environ["PATH_INFO"].endswith("/aggregated/instances"):
            return self.app(environ, start_response)
        args = parse_qs(environ.get("QUERY_STRING", ""))
        self.seen.append(dict(args))
        page = int(args.pop("pageToken", ["0"])[0])
        answered: list[Any] = []
        body = b"".join(self.app({**environ, "QUERY_STRING": urlencode(args, doseq=True)},
                                 lambda status, headers, *rest: answered.append((status, headers))))
        status, headers = answered[0]
        whole = json.loads(body)
        if not status.startswith("200"):
            start_response(status, headers)
            return [body]
        scopes = sorted(s for s, v in whole["items"].items() if "instances" in v)
        out = {**whole, "items": {scopes[page]: whole["items"][scopes[page]]} if scopes else {}}
        if page + 1 < len(scopes):
            out["nextPageToken"] = str(page + 1)
        data = json.dumps(out).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def start(self) -> PagingGce:
        from werkzeug.serving import make_server

        self._server = make_server("127.0.0.1", 0, self, threaded=True)
        self._thread = serve(self._server, "paging-gce")
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)


@pytest.fixture
def paging(gce_server: GceServer) -> Iterator[PagingGce]:
    layer = PagingGce(gce_server).start()
    try:
        yield layer
    finally:
        layer.stop()


def test_a_listing_reads_every_page_with_the_same_filter(gce_server: GceServer, provider: GcpProvider,
                                                         paging: PagingGce) -> None:
    zones = ("us-central1-a", "us-central1-b", "us-central1-c")
    made = sorted(provider.launch(spec("paged", zone=zone), 1)[0].id for zone in zones)
    paged = GcpProvider(**{**gce_server.config(region="us-central1"), "api_endpoint": paging.url})
    assert sorted(i.id for i in paged.list_tagged("paged")) == made
    assert [a.get("pageToken") for a in paging.seen] == [None, ["1"], ["2"]]
    assert len({json.dumps(a["filter"]) for a in paging.seen}) == 1 and "paged" in paging.seen[0]["filter"][0]
    # The release after a delete counts the cluster's instances over every page too.
    assert sorted(i.id for i in paged.list_tagged()) == made


# errors ------------------------------------------------------------------------------------------


def error_of(fn: Callable[[], Any]) -> CloudtrainError:
    with pytest.raises(CloudtrainError) as caught:
        fn()
    return caught.value


def said(exc: CloudtrainError) -> tuple[Any, ...]:
    return (type(exc), str(exc), exc.hint, getattr(exc, "codes", None), getattr(exc, "status", None))


@pytest.mark.parametrize("code,status,kind", [
    ("forbidden", None, CredentialsError),  # 403: a missing permission
    ("authError", None, CredentialsError),  # 401
    ("quotaExceeded", None, GcpApiError),
    ("rateLimitExceeded", None, GcpApiError),  # 403, retried with backoff, then the answer
    ("rateLimitExceeded", 429, GcpApiError),
    ("invalid", 400, GcpApiError),
])
def test_an_http_error_becomes_what_the_sdk_path_made_of_it(gce_server: GceServer, provider: GcpProvider,
                                                            waits: list[float], code: str, status: int | None,
                                                            kind: type) -> None:
    (inst,) = provider.launch(spec("err"), 1)
    zone, name = inst.id.split(":")
    provider.api.backoff = Backoff(tries=2, sleep=waits.append)
    gce_server.faults.add(code, action="instances.get", status=status)
    before = gce_server.faults.count("instances.get")
    sdk = error_of(lambda: provider.api.call(f"reading {name}", provider.api.client("instances").get,
                                             project=gce_server.project, zone=zone, instance=name))
    asked = gce_server.faults.count("instances.get") - before
    rest = error_of(lambda: provider.describe([inst.id]))
    assert isinstance(rest, kind) and said(rest) == said(sdk)
    assert gce_server.faults.count("instances.get") - before - asked == asked  # retried (or not) alike
    listing_fault = gce_server.faults.add(code, action="instances.aggregatedList", status=status)
    assert isinstance(error_of(lambda: provider.list_tagged("err")), kind) and listing_fault.hits >= 1


def test_gone_is_not_found_and_a_503_is_retried(gce_server: GceServer, provider: GcpProvider,
                                                 waits: list[float]) -> None:
    (inst,) = provider.launch(spec("flaky"), 1)
    zone = inst.zone or ""
    missing = f"zones/{zone}/instances/no-such-vm"
    sdk = error_of(lambda: provider.api.call("reading no-such-vm", provider.api.client("instances").get,
                                             project=gce_server.project, zone=zone, instance="no-such-vm"))
    rest = error_of(lambda: provider.api.get_json("reading no-such-vm", missing))
    assert said(rest) == said(sdk) and isinstance(rest, GcpApiError) and rest.not_found
    # A 503 on a read is retried with cloudtrain's backoff (the SDK retried reads itself).
    gce_server.faults.add("backendError", action="instances.get", times=1)
    gce_server.faults.add("backendError", action="instances.aggregatedList", times=1)
    assert [i.state for i in provider.describe([inst.id])] == [InstanceState.RUNNING]
    assert [i.id for i in provider.list_tagged("flaky")] == [inst.id]
    assert len(waits) == 2


def test_an_unreachable_endpoint_is_said_as_the_sdk_path_said_it(gce_server: GceServer) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nowhere = GcpProvider(**{**gce_server.config(), "api_endpoint": f"http://127.0.0.1:{port}"})
    sdk = error_of(lambda: nowhere.api.call("reading x", nowhere.api.client("instances").get,
                                            project=gce_server.project, zone="us-central1-a", instance="x"))
    rest = error_of(lambda: nowhere.describe(["us-central1-a:x"]))
    assert said(rest) == said(sdk) and type(rest) is ProviderError and "could not reach" in str(rest)


# the point of it ---------------------------------------------------------------------------------


def test_describe_and_list_tagged_import_no_compute_sdk(gce_server: GceServer, provider: GcpProvider) -> None:
    """In a fresh process: no google.cloud.compute_v1 (nor proto-plus, which it brings); google-api-core
    (~0.1 s, for its HTTP error mapping) only once an answer was an error (here: a deleted VM's 404)."""
    (inst,) = provider.launch(spec("light"), 1)
    code = (
        "import json, sys\n"
        "from cloudtrain.providers.gcp import GcpProvider\n"
        "def heavy():\n"
        "    prefixes = ('google.cloud.compute_v1', 'google.api_core', 'proto')\n"
        "    return sorted({p for m in list(sys.modules) for p in prefixes if m == p or m.startswith(p + '.')})\n"
        f"p = GcpProvider(project={gce_server.project!r}, api_endpoint={gce_server.url!r}, all_owners=True)\n"
        f"states = [i.state.value for i in p.describe([{inst.id!r}])]\n"
        "listed = [i.id for i in p.list_tagged('light')]\n"
        "answered = heavy()\n"
        "states += [i.state.value for i in p.describe(['us-central1-a:gone'])]\n"
        "print(json.dumps([states, listed, answered, heavy()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    states, listed, answered, after_an_error = json.loads(out.stdout.strip().splitlines()[-1])
    assert states == ["running", "terminated"] and listed == [inst.id]
    assert answered == [] and after_an_error == ["google.api_core"]


# the write path: stop, start, delete, setLabels, firewall and disk deletes, operation waits --------


class Recorder:
    """A WSGI layer in front of the fake that notes every request as it arrived on the wire:
    (method, path, query, content type, JSON body), so the REST path's requests can be held
    against the ones the SDK's transport sent."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.seen: list[tuple[str, str, dict[str, list[str]], str, Any]] = []
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        import io

        size = int(environ.get("CONTENT_LENGTH") or 0)
        data = environ["wsgi.input"].read(size) if size else b""
        self.seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], parse_qs(environ.get("QUERY_STRING", "")),
                          environ.get("CONTENT_TYPE", ""), json.loads(data) if data else None))
        return self.app({**environ, "wsgi.input": io.BytesIO(data)}, start_response)

    def writes(self, since: int, names: dict[str, str]) -> list[tuple[str, str, str, str, str]]:
        """The requests after `since` but reads, as comparable text: `names` (a name -> a
        placeholder) and operation names written out of the paths, bodies as sorted JSON."""
        found = []
        for method, path, query, content_type, body in self.seen[since:]:
            if method == "GET":
                continue
            text = re.sub(r"/operations/[^/]+", "/operations/{op}", path)
            text, dumped = _named(text, names), _named(json.dumps(body, sort_keys=True), names)
            found.append((method, text, json.dumps(query, sort_keys=True), content_type, dumped))
        return found

    def start(self) -> Recorder:
        from werkzeug.serving import make_server

        self._server = make_server("127.0.0.1", 0, self, threaded=True)
        self._thread = serve(self._server, "recording-gce")
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)


def _any_fingerprint(body: str) -> str:
    """A setLabels body with its fingerprint (each instance's own) written out."""
    return re.sub(r'"labelFingerprint": "[^"]*"', '"labelFingerprint": "{fp}"', body)


def _named(text: str, names: dict[str, str]) -> str:
    for name, placeholder in sorted(names.items(), key=lambda item: -len(item[0])):
        text = text.replace(name, placeholder)
    return text


@pytest.fixture
def recording(gce_server: GceServer) -> Iterator[Recorder]:
    layer = Recorder(gce_server).start()
    try:
        yield layer
    finally:
        layer.stop()


def sdk_waited(via: GcpProvider, operation: Any, zone: str | None) -> Any:
    """The SDK's own wait (ZoneOperationsClient / GlobalOperationsClient), as the write path had it."""
    project = via.api.project
    if zone:
        return via.api.client("zone_operations").wait(project=project, zone=zone, operation=operation.name)
    return via.api.client("global_operations").wait(project=project, operation=operation.name)


def test_the_writes_are_the_requests_the_sdk_sent(gce_server: GceServer, recording: Recorder, waits: list[float]) -> None:
    """Each write of stop, start, down, the liveness mark and release_resources, and each wait,
    leaves as the SDK's transport sent it: method, path, query, content type and body."""
    via = GcpProvider(**{**gce_server.config(region="us-central1"), "api_endpoint": recording.url})
    via.api.backoff = Backoff(sleep=waits.append)
    sdk, project = via.api.client("instances"), gce_server.project
    a, b = via.launch(spec("wire", zone="us-central1-a"), 2)
    zone, name_a, name_b = "us-central1-a", a.id.split(":")[1], b.id.split(":")[1]
    as_a, as_b = {name_a: "{vm}"}, {name_b: "{vm}"}

    def sdk_did(what: Callable[[], Any], waited_in: str | None = "us-central1-a") -> list[Any]:
        since = len(recording.seen)
        operation = what()
        sdk_waited(via, operation, waited_in)
        return recording.writes(since, as_a)

    def rest_did(what: Callable[[], Any]) -> list[Any]:
        since = len(recording.seen)
        what()
        return recording.writes(since, as_b)

    stop = sdk_did(lambda: sdk.stop_unary(project=project, zone=zone, instance=name_a))
    assert rest_did(lambda: via.stop([b.id])) == stop
    assert [m for m, *_ in stop] == ["POST", "POST"] and stop[0][1].endswith("/instances/{vm}/stop")
    start = sdk_did(lambda: sdk.start_unary(project=project, zone=zone, instance=name_a))
    assert rest_did(lambda: via.start([b.id])) == start and start[1][1].endswith(f"/zones/{zone}/operations/{{op}}/wait")

    # The liveness mark: the labels read, the mark added, with the fingerprint read (not waited for).
    at = 1_700_000_000.0
    since = len(recording.seen)
    raw = gce_server.instance(zone, name_a) or {}
    sdk.set_labels_unary(project=project, zone=zone, instance=name_a, instances_set_labels_request_resource={
        "labels": {**raw["labels"], TAG_ALIVE: alive_value(at)}, "label_fingerprint": raw["labelFingerprint"]})
    labelled = [(*request[:4], _any_fingerprint(request[4])) for request in recording.writes(since, as_a)]
    since = len(recording.seen)
    via.mark_alive([b.id], at)
    marked = [(*request[:4], _any_fingerprint(request[4])) for request in recording.writes(since, as_b)]
    assert marked == labelled and '"labelFingerprint": "{fp}"' in marked[0][4]
    assert alive_of((gce_server.instance(zone, name_b) or {})["labels"]) == at

    # Deleting an instance; the other of the cluster still lives, so no rule goes with it.
    deleted = rest_did(lambda: via.terminate([b.id]))
    assert deleted == sdk_did(lambda: sdk.delete_unary(project=project, zone=zone, instance=name_a))
    assert [m for m, *_ in deleted] == ["DELETE", "POST"]

    # The cluster's rules and a loose disk, once no instance is left: global and zonal deletes.
    rules = [r.id for r in via.firewalls.list("wire")]
    assert len(rules) == 3
    since = len(recording.seen)
    firewalls = via.api.client("firewalls")
    operations = [firewalls.delete_unary(project=project, firewall=rule) for rule in rules]
    for operation in operations:
        sdk_waited(via, operation, None)
    sdk_rules = recording.writes(since, {"cloudtrain-wire-": "cloudtrain-{c}-"})
    assert [m for m, *_ in sdk_rules] == ["DELETE"] * 3 + ["POST"] * 3
    assert "/global/operations/{op}/wait" in sdk_rules[3][1]
    from google.cloud import compute_v1

    labels = {TAG_CLUSTER: "wire2", TAG_OWNER: owner_id()}
    disk = gce_server.client("disks").insert_unary(project=project, zone=zone, disk_resource=compute_v1.Disk(
        name="wire2-left", size_gb=10, labels=labels))
    sdk_waited(via, disk, zone)
    # The same rules again, for a cluster whose last instance is gone: release_resources deletes them.
    for body in build.firewall_bodies("wire2", owner_id(), "203.0.113.7/32", 2).values():
        sdk_waited(via, firewalls.insert_unary(project=project, firewall_resource=compute_v1.Firewall(body)), None)
    since = len(recording.seen)
    assert via.release_resources("wire2") == []
    released = recording.writes(since, {"cloudtrain-wire2-": "cloudtrain-{c}-", "wire2-left": "{disk}"})
    assert released[:6] == sdk_rules
    other = gce_server.client("disks").insert_unary(project=project, zone=zone, disk_resource=compute_v1.Disk(
        name="wire3-left", size_gb=10, labels={**labels, TAG_CLUSTER: "wire3"}))
    sdk_waited(via, other, zone)
    since = len(recording.seen)
    sdk_waited(via, via.api.client("disks").delete_unary(project=project, zone=zone, disk="wire3-left"), zone)
    assert released[6:] == recording.writes(since, {"wire3-left": "{disk}"})
    assert [m for m, *_ in released[6:]] == ["DELETE", "POST"] and released[6][1].endswith(f"/zones/{zone}/disks/{{disk}}")
    assert not gce_server.disks and not [r for r in via.firewalls.list() if "wire" in r.id]


@pytest.mark.parametrize("code,status,kind", [
    ("forbidden", None, CredentialsError),  # 403: a missing permission
    ("authError", None, CredentialsError),  # 401
    ("rateLimitExceeded", None, GcpApiError),  # retried with backoff, then the answer
    ("backendError", None, GcpApiError),  # a 503: retried likewise
    ("invalid", 400, GcpApiError),
])
def test_a_refused_write_becomes_what_the_sdk_path_made_of_it(gce_server: GceServer, provider: GcpProvider,
                                                              waits: list[float], code: str, status: int | None,
                                                              kind: type) -> None:
    (inst,) = provider.launch(spec("refused"), 1)
    zone, name = inst.id.split(":")
    provider.api.backoff = Backoff(tries=2, sleep=waits.append)
    sdk, project = provider.api.client("instances"), gce_server.project
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("instances.stop", lambda: provider.api.call(f"stopping {name}", sdk.stop_unary, project=project, zone=zone,
                                                     instance=name), lambda: provider.stop([inst.id])),
        ("instances.setLabels", lambda: provider.api.call(
            f"labelling {name}", sdk.set_labels_unary, project=project, zone=zone, instance=name,
            instances_set_labels_request_resource={"labels": {}, "label_fingerprint": ""}),
         lambda: provider.mark_alive([inst.id], 1000.0)),
        ("instances.delete", lambda: provider.api.call(f"deleting {name}", sdk.delete_unary, project=project,
                                                       zone=zone, instance=name), lambda: provider.terminate([inst.id])),
    ]
    for action, by_sdk, by_rest in cases:
        gce_server.faults.add(code, action=action, status=status)
        before = gce_server.faults.count(action)
        was = error_of(by_sdk)
        asked = gce_server.faults.count(action) - before
        now = error_of(by_rest)
        assert isinstance(now, kind) and said(now) == said(was), action
        assert gce_server.faults.count(action) - before - asked == asked, action  # retried (or not) alike
        gce_server.faults.faults.clear()
    assert (gce_server.instance(zone, name) or {}).get("status") == "RUNNING"


def test_an_operation_that_ends_in_an_error_is_said_as_the_sdk_operation_was(gce_server: GceServer,
                                                                            provider: GcpProvider) -> None:
    """A write accepted whose operation ends DONE with `error.errors[]`: the codes, messages and
    HTTP status the SDK's Operation carried; a permission code is a CredentialsError."""
    a, b = provider.launch(spec("op-error", zone="us-central1-b"), 2)
    zone = "us-central1-b"
    sdk, project = provider.api.client("instances"), gce_server.project
    gce_server.faults.add("RESOURCE_NOT_READY", action="instances.stop", times=1)
    operation = sdk.stop_unary(project=project, zone=zone, instance=a.id.split(":")[1])
    done = sdk_waited(provider, operation, zone)
    assert done.status == done.Status.DONE and done.error.errors
    gce_server.faults.add("RESOURCE_NOT_READY", action="instances.stop", times=1)
    now = error_of(lambda: provider.stop([b.id]))
    assert isinstance(now, GcpApiError)
    assert (now.codes, now.gcp_message, now.status) == (
        tuple(e.code for e in done.error.errors),
        "; ".join(e.message for e in done.error.errors).replace(a.id.split(":")[1], b.id.split(":")[1]),
        done.http_error_status_code)
    gce_server.faults.add("IAM_PERMISSION_DENIED", action="instances.delete", times=1)
    denied = error_of(lambda: provider.terminate([b.id]))
    assert isinstance(denied, CredentialsError) and "GCP denied deleting" in str(denied)
    # An operation gone from the server (a 404 on its wait) is an error of the write, not a hang.
    with pytest.raises(GcpApiError) as gone:
        provider.api.wait("stopping x", {"name": "operation-none", "status": "RUNNING"}, zone)
    assert gone.value.not_found


def test_a_delete_answered_503_after_it_acted_is_done_and_a_gone_one_is_fine(gce_server: GceServer,
                                                                            provider: GcpProvider,
                                                                            waits: list[float]) -> None:
    (inst,) = provider.launch(spec("again"), 1)
    gce_server.faults.add("backendError", action="instances.delete", delivery="reply", times=1)
    gce_server.faults.add("backendError", action="globalOperations.wait", times=1)
    provider.terminate([inst.id])  # the retry finds it gone (404): done
    assert provider.list_tagged("again") == [] and not [r for r in gce_server.firewalls if "again" in r]
    assert len(waits) == 2
    provider.terminate([inst.id])  # nothing left: nothing asked but the read


def test_stop_start_down_and_the_mark_import_no_compute_sdk(gce_server: GceServer, provider: GcpProvider) -> None:
    """In a fresh process, what `stop`, `start`, `down` (terminate and release_resources) and the
    liveness mark call never imports google.cloud.compute_v1 (nor proto-plus, which it brings)."""
    (inst,) = provider.launch(spec("light-writes"), 1)
    code = (
        "import json, sys\n"
        "from cloudtrain.providers.gcp import GcpProvider\n"
        f"p = GcpProvider(project={gce_server.project!r}, api_endpoint={gce_server.url!r}, all_owners=True)\n"
        f"ids = [{inst.id!r}]\n"
        "p.mark_alive(ids, 1000.0)\n"
        "p.stop(ids)\n"
        "stopped = [i.state.value for i in p.describe(ids)]\n"
        "p.start(ids)\n"
        "p.terminate(ids)\n"
        "left = [r.id for r in p.list_resources('light-writes')]\n"
        "heavy = sorted({p for m in list(sys.modules) for p in ('google.cloud.compute_v1', 'proto')\n"
        "                if m == p or m.startswith(p + '.')})\n"
        "print(json.dumps([stopped, [i.state.value for i in p.describe(ids)], left, heavy]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    stopped, after, left, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert stopped == ["stopped"] and after == ["terminated"] and left == [] and heavy == []
    assert not [r for r in gce_server.firewalls if "light-writes" in r]


def test_a_wait_may_take_the_two_minutes_the_api_may_hold_it(gce_server: GceServer, provider: GcpProvider,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """zoneOperations.wait answers when the operation is DONE or after its 2-minute deadline: its
    read timeout is longer than that (a slow delete going well is not an error); other calls keep
    the usual one."""
    (inst,) = provider.launch(spec("slow"), 1)
    session = provider.api.session()
    asked: list[tuple[str, float]] = []
    real = session.request

    def noted(method: str, url: str, **kwargs: Any) -> Any:
        asked.append((url.rsplit("/", 1)[-1], kwargs["timeout"]))
        return real(method, url, **kwargs)

    monkeypatch.setattr(session, "request", noted)
    provider.stop([inst.id])
    timeouts = dict(asked)
    assert timeouts["wait"] > 120 and timeouts["stop"] < timeouts["wait"]
