"""The azure provider's read path without the SDKs: Virtual Machines - Get (with instanceView) and
List, Network Interfaces - List, Public IP Addresses - List and Resource Groups - List/Get as REST
calls (api.ArmApi.get_json / list_json, one azure-core pipeline), against the fake ARM.

What it must keep: the Instance records the SDK path made (the former reader, `sdk_record` below,
is the oracle, fed by the real SDK clients or by the SDK's models of the same JSON), the errors
`call` made of the SDK's exceptions, every page of a listing; and what it is for: `describe` and
`list_tagged` never import azure.mgmt.compute, azure.mgmt.network or azure.mgmt.resource (1-2 s
each on `cloudtrain status --refresh`).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import pytest

from cloudtrain.errors import CloudtrainError, CredentialsError, ProviderError
from cloudtrain.expiry import expiry_of
from cloudtrain.providers.azure import AzureProvider, build
from cloudtrain.providers.azure.api import (
    COMPUTE_API_VERSION,
    NETWORK_API_VERSION,
    RESOURCE_API_VERSION,
    AzureApiError,
)
from cloudtrain.providers.azure.records import POWER_STATES, vm_record
from cloudtrain.providers.base import (
    TAG_ALIVE,
    TAG_CLUSTER,
    TAG_INCARNATION,
    Instance,
    InstanceSpec,
    InstanceState,
    alive_of,
    owner_id,
)
from cloudtrain.testing.azure import ArmServer
from cloudtrain.testing.serving import serve, stop_serving
from tests.lazy import requires

pytestmark = [pytest.mark.quick, requires("azure.identity")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheAzureRestTests test"


@pytest.fixture
def provider(arm_server: ArmServer) -> AzureProvider:
    return AzureProvider(**arm_server.config(region="eastus"), polling_interval=0)


def spec(cluster: str, **kwargs: Any) -> InstanceSpec:
    defaults: dict[str, Any] = {"instance_type": "Standard_D2s_v5", "region": "eastus", "ssh_public_key": KEY,
                                "allowed_cidr": "203.0.113.7/32"}
    return InstanceSpec(cluster=cluster, owner=owner_id(), **{**defaults, **kwargs})


# the oracle: the SDK path's reader, as it was before the read path left the SDKs ------------------


def sdk_record(group: str, vm: Any, nics: dict[str, Any], ips: dict[str, Any]) -> Instance:
    """An SDK VirtualMachine (with instanceView) and its group's SDK NICs and public IPs (by
    lower-case id) -> ours, read by attribute: records.vm_record as it was."""
    statuses = vm.instance_view.statuses if vm.instance_view and vm.instance_view.statuses else []
    power = next((s.code.split("/", 1)[1].lower() for s in statuses if (s.code or "").startswith("PowerState/")), None)
    provisioning = (vm.provisioning_state or "").lower()
    if provisioning == "deleting":
        state = InstanceState.TERMINATED
    elif provisioning == "creating" or power is None:
        state = InstanceState.PENDING if provisioning in ("creating", "updating", "succeeded") else InstanceState.UNKNOWN
    else:
        state = POWER_STATES.get(power, InstanceState.UNKNOWN)
    public_ip = private_ip = None
    refs = vm.network_profile.network_interfaces if vm.network_profile else []
    nic = nics.get(refs[0].id.lower()) if refs else None
    if nic is not None and nic.ip_configurations:
        config = nic.ip_configurations[0]
        private_ip = config.private_ip_address
        if config.public_ip_address is not None and config.public_ip_address.id:
            address = ips.get(config.public_ip_address.id.lower())
            public_ip = address.ip_address if address is not None else None
    power_time = next((s.time for s in statuses if (s.code or "").startswith("PowerState/") and s.time), None)
    settled = next((s.time for s in statuses if (s.code or "").lower().startswith("provisioningstate/succeeded")
                    and s.time), None)
    since = power_time or settled
    disk = vm.storage_profile.os_disk if vm.storage_profile is not None else None
    tags = vm.tags or {}
    return Instance(
        id=build.instance_id(group, vm.name), cluster=tags.get(TAG_CLUSTER, ""),
        incarnation=tags.get(TAG_INCARNATION), alive_at=alive_of(tags), expiry=expiry_of(tags), state=state,
        instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else None, region=vm.location,
        zone=vm.zones[0] if vm.zones else None, public_ip=public_ip, private_ip=private_ip,
        ssh_user=vm.os_profile.admin_username if vm.os_profile else build.SSH_USER,
        launched_at=vm.time_created.timestamp() if getattr(vm, "time_created", None) else None,
        state_since=float(since.timestamp()) if since is not None else None,
        spot=(vm.priority or "").lower() == "spot",
        disk_gb=disk.disk_size_gb if disk is not None and disk.disk_size_gb else None,
    )


def sdk_group(arm: ArmServer, group: str, names: Iterable[str]) -> list[Instance]:
    compute, net = arm.client("compute"), arm.client("network")
    nics = {n.id.lower(): n for n in net.network_interfaces.list(group)}
    ips = {i.id.lower(): i for i in net.public_ip_addresses.list(group)}
    return [sdk_record(group, compute.virtual_machines.get(group, name, expand="instanceView"), nics, ips)
            for name in names]


def sdk_describe(arm: ArmServer, ids: Iterable[str]) -> list[Instance]:
    found = []
    for value in ids:
        group, name = value.split(":")
        found += sdk_group(arm, group, [name])
    return found


def sdk_listed(arm: ArmServer, cluster: str | None) -> list[Instance]:
    wanted = f"tagName eq '{TAG_CLUSTER}'" + (f" and tagValue eq '{cluster}'" if cluster else "")
    groups = arm.client("resource").resource_groups.list(filter=wanted)
    compute = arm.client("compute")
    return [i for g in groups for i in sdk_group(arm, g.name, [vm.name for vm in compute.virtual_machines.list(g.name)])]


def by_id(instances: Iterable[Instance]) -> list[Instance]:
    return sorted(instances, key=lambda i: i.id)


# records -----------------------------------------------------------------------------------------


def test_describe_and_list_tagged_answer_what_the_sdk_path_answered(arm_server: ArmServer,
                                                                    provider: AzureProvider) -> None:
    (plain,) = provider.launch(spec("mix", tags={TAG_ALIVE: "1000", TAG_INCARNATION: "7"}), 1)
    # Its own cluster: the fake evicts by VM name, and a cluster's VMs have the same names in every region.
    (spot,) = provider.launch(spec("mix-spot", region="westus2", spot=True, disk_gb=64), 1)
    (stopped,) = provider.launch(spec("mix", region="centralus"), 1)
    (gone,) = provider.launch(spec("mix", region="eastus2"), 1)
    provider.stop([stopped.id])
    arm_server.evict(spot.id.split(":")[1])  # the cloud's stop: a deallocation cloudtrain did not make
    provider.terminate([gone.id])
    live = [plain.id, spot.id, stopped.id]

    described = provider.describe([*live, gone.id])
    assert described[:3] == sdk_describe(arm_server, live)
    assert described[3] == Instance(gone.id, "", InstanceState.TERMINATED)
    listed = by_id(provider.list_tagged("mix"))
    assert listed == by_id(sdk_listed(arm_server, "mix")) == by_id([described[0], described[2]])
    assert by_id(provider.list_tagged()) == by_id(sdk_listed(arm_server, None)) == by_id(described[:3])
    # What each case must carry, so that agreeing is not agreeing on nothing.
    found = {i.id: i for i in described}
    running = found[plain.id]
    assert (running.state, running.cluster, running.incarnation, running.alive_at) == (
        InstanceState.RUNNING, "mix", "7", 1000.0)
    assert running.public_ip and running.private_ip and running.launched_at and running.state_since
    assert (running.instance_type, running.region, running.spot, running.disk_gb) == (
        "Standard_D2s_v5", "eastus", False, 30)
    assert (found[spot.id].state, found[spot.id].spot, found[spot.id].disk_gb) == (InstanceState.STOPPED, True, 64)
    deallocated = found[stopped.id]
    assert deallocated.state is InstanceState.STOPPED and deallocated.state_since is not None
    # The stop's time is the ProvisioningState status's (the PowerState one has none, as on Azure).
    view = arm_server.client("compute").virtual_machines.instance_view(*stopped.id.split(":"))
    assert [s.time for s in view.statuses if s.code.startswith("PowerState/")] == [None]
    assert deallocated.state_since >= running.state_since and found[spot.id].state_since >= running.state_since


def vm_json(**properties: Any) -> dict[str, Any]:
    return {"name": "vm-0", "location": "eastus", "tags": {TAG_CLUSTER: "c"}, "properties": properties}


ROUGH_EDGES = {
    "creating, nothing yet": vm_json(provisioningState="Creating"),
    "succeeded, no instance view": vm_json(provisioningState="Succeeded"),
    "failed, no power state": vm_json(provisioningState="Failed",
                                      instanceView={"statuses": [{"code": "ProvisioningState/failed"}]}),
    "stopped (allocated) is still billed": vm_json(provisioningState="Succeeded", instanceView={"statuses": [
        {"code": "ProvisioningState/succeeded", "time": "2026-03-01T10:00:00.1234567+00:00"},
        {"code": "PowerState/stopped"}]}),
    "a PowerState time wins": vm_json(provisioningState="Succeeded", instanceView={"statuses": [
        {"code": "ProvisioningState/succeeded", "time": "2026-03-01T10:00:00+00:00"},
        {"code": "PowerState/deallocated", "time": "2026-03-01T09:00:00.5Z"}]}),
    "deleting": vm_json(provisioningState="Deleting", instanceView={"statuses": [{"code": "PowerState/running"}]}),
    "an unknown power state": vm_json(provisioningState="Succeeded", priority="Spot",
                                      instanceView={"statuses": [{"code": "PowerState/hibernated"}]}),
    "every field": {**vm_json(
        provisioningState="Succeeded", priority="Regular", timeCreated="2026-02-01T08:00:00.0000001Z",
        hardwareProfile={"vmSize": "Standard_NC4as_T4_v3"}, osProfile={"adminUsername": "ubuntu"},
        storageProfile={"osDisk": {"diskSizeGB": 128}},
        networkProfile={"networkInterfaces": [{"id": "/x/NIC-0"}, {"id": "/x/nic-1"}]},
        instanceView={"statuses": [{"code": "ProvisioningState/succeeded", "time": "2026-02-01T08:01:00Z"},
                                   {"code": "PowerState/running"}]}), "zones": ["2"]},
}
NICS = {"/x/nic-0": {"id": "/x/nic-0", "properties": {"ipConfigurations": [{"name": "c", "properties": {
    "privateIPAddress": "10.0.0.4", "publicIPAddress": {"id": "/x/IP-0"}}}]}}}
IPS = {"/x/ip-0": {"id": "/x/ip-0", "properties": {"ipAddress": "20.1.2.3"}}}


@pytest.mark.parametrize("case", sorted(ROUGH_EDGES))
def test_the_reader_reads_arms_json_as_the_sdk_path_read_the_same_answer(case: str) -> None:
    """The same JSON through the SDK's models and the former reader, and through vm_record: one
    answer, absent fields included (ARM's seven fractional digits, a 'Z', no instance view)."""
    from azure.mgmt.compute.models import VirtualMachine
    from azure.mgmt.network.models import NetworkInterface, PublicIPAddress

    raw = ROUGH_EDGES[case]
    sdk_nics = {k: NetworkInterface(v) for k, v in NICS.items()}
    sdk_ips = {k: PublicIPAddress(v) for k, v in IPS.items()}
    record = vm_record("rg", raw, NICS, IPS)
    assert record.instance == sdk_record("rg", VirtualMachine(raw), sdk_nics, sdk_ips)
    assert record.name == "vm-0" and record.group == "rg"


def test_the_reader_keeps_azures_own_meanings() -> None:
    """What the cases above must say: Stopped (allocated) is STOPPING, the ProvisioningState time is
    the power state's when it has none, the first NIC's addresses."""
    def read(case: str) -> Instance:
        return vm_record("rg", ROUGH_EDGES[case], NICS, IPS).instance

    allocated = read("stopped (allocated) is still billed")
    assert allocated.state is InstanceState.STOPPING
    assert allocated.state_since == datetime.fromisoformat("2026-03-01T10:00:00.123456+00:00").timestamp()
    assert read("a PowerState time wins").state_since == datetime.fromisoformat(
        "2026-03-01T09:00:00.5+00:00").timestamp()
    full = read("every field")
    assert (full.state, full.public_ip, full.private_ip, full.zone, full.ssh_user, full.disk_gb) == (
        InstanceState.RUNNING, "20.1.2.3", "10.0.0.4", "2", "ubuntu", 128)
    assert full.launched_at == datetime.fromisoformat("2026-02-01T08:00:00+00:00").timestamp()
    assert [read(c).state for c in ("creating, nothing yet", "failed, no power state", "deleting")] == [
        InstanceState.PENDING, InstanceState.UNKNOWN, InstanceState.TERMINATED]
    assert vm_record("rg", ROUGH_EDGES["every field"], NICS, IPS).power == "running"


def test_the_api_versions_are_the_installed_sdks(arm_server: ArmServer, provider: AzureProvider) -> None:
    """The read path asks for the api-versions the installed SDKs ask for (so the JSON is theirs)."""
    (inst,) = provider.launch(spec("versions"), 1)
    group, name = inst.id.split(":")
    sent: list[str] = []

    def hook(request: Any) -> None:
        sent.append(request.http_request.url)

    compute, net, resource = arm_server.client("compute"), arm_server.client("network"), arm_server.client("resource")
    compute.virtual_machines.get(group, name, expand="instanceView", raw_request_hook=hook)
    list(compute.virtual_machines.list(group, raw_request_hook=hook))
    list(net.network_interfaces.list(group, raw_request_hook=hook))
    list(net.public_ip_addresses.list(group, raw_request_hook=hook))
    list(resource.resource_groups.list(raw_request_hook=hook))
    resource.resource_groups.get(group, raw_request_hook=hook)
    versions = [parse_qs(urlsplit(url).query)["api-version"] for url in sent]
    assert versions == [[COMPUTE_API_VERSION]] * 2 + [[NETWORK_API_VERSION]] * 2 + [[RESOURCE_API_VERSION]] * 2


# paging ------------------------------------------------------------------------------------------


class PagingArm:
    """The fake answers a list in one page (no nextLink); ARM pages long ones. This WSGI layer in
    front of the fake (HTTPS with the fake's own certificate, which the environment trusts) answers
    every list one item a page, each with a nextLink to the next as ARM writes it (the request's
    own query and a $skiptoken), so a reader that stops after the first page sees one item only.
    Every list request it saw: `seen` (path, $skiptoken or None)."""

    def __init__(self, arm: ArmServer) -> None:
        self.arm = arm
        self.seen: list[tuple[str, str | None]] = []
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = dict(parse_qsl(environ.get("QUERY_STRING", "")))
        token = query.pop("$skiptoken", None)
        answered: list[Any] = []
        body = b"".join(self.arm({**environ, "QUERY_STRING": urlencode(query)},
                                 lambda status, headers, *rest: answered.append((status, headers))))
        status, headers = answered[0]
        whole = json.loads(body) if body and environ["REQUEST_METHOD"] == "GET" and status.startswith("200") else {}
        if not isinstance(whole.get("value"), list) or "nextLink" in whole:
            start_response(status, headers)
            return [body]
        self.seen.append((environ["PATH_INFO"], token))
        at = int(token or 0)
        page: dict[str, Any] = {"value": whole["value"][at:at + 1]}
        if at + 1 < len(whole["value"]):
            page["nextLink"] = f"{self.url}{environ['PATH_INFO']}?{urlencode({**query, '$skiptoken': at + 1})}"
        data = json.dumps(page).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def start(self) -> PagingArm:
        from werkzeug.serving import make_server

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.arm.directory / "arm-cert.pem"), str(self.arm.directory / "arm-key.pem"))
        self._server = make_server("127.0.0.1", 0, self, threaded=True, ssl_context=context)
        self._thread = serve(self._server, "paging-arm")
        self.url = f"https://127.0.0.1:{self._server.server_port}"
        return self

    def stop(self) -> None:
        stop_serving(self._server, self._thread)


@pytest.fixture
def paging(arm_server: ArmServer) -> Iterator[PagingArm]:
    layer = PagingArm(arm_server).start()
    try:
        yield layer
    finally:
        layer.stop()


def test_every_listing_reads_every_page(arm_server: ArmServer, provider: AzureProvider, paging: PagingArm) -> None:
    made = provider.launch(spec("paged"), 2) + provider.launch(spec("paged", region="westus2"), 1)
    paged = AzureProvider(**{**arm_server.config(), "arm_endpoint": paging.url}, polling_interval=0)
    listed = by_id(paged.list_tagged("paged"))
    assert listed == by_id(provider.list_tagged("paged")) and [i.id for i in listed] == sorted(i.id for i in made)
    assert all(i.public_ip and i.private_ip for i in listed)  # the NIC and IP listings' later pages too
    pages: dict[str, list[str | None]] = {}
    for path, token in paging.seen:
        pages.setdefault(path.rsplit("/", 1)[-1].lower(), []).append(token)
    # Two groups, the first with two VMs, NICs and IPs: every list was read to its last page.
    assert pages["resourcegroups"] == [None, "1"]
    for kind in ("virtualmachines", "networkinterfaces", "publicipaddresses"):
        assert pages[kind] == [None, "1", None], kind
    assert by_id(paged.describe([i.id for i in made])) == listed


# errors ------------------------------------------------------------------------------------------


def error_of(fn: Callable[[], Any]) -> CloudtrainError:
    with pytest.raises(CloudtrainError) as caught:
        fn()
    return caught.value


def said(exc: CloudtrainError) -> tuple[Any, ...]:
    return (type(exc), str(exc), exc.hint, getattr(exc, "code", None), getattr(exc, "status", None))


@pytest.mark.parametrize("code,kind", [
    ("AuthorizationFailed", CredentialsError),  # 403
    ("InvalidAuthenticationToken", CredentialsError),  # 401
    ("InvalidParameter", AzureApiError),  # 400
    ("OperationNotAllowed", AzureApiError),  # 409: ResourceExistsError in the SDK's error map
])
def test_an_arm_error_becomes_what_the_sdk_path_made_of_it(arm_server: ArmServer, provider: AzureProvider,
                                                           code: str, kind: type) -> None:
    (inst,) = provider.launch(spec("err"), 1)
    group, name = inst.id.split(":")
    arm_server.faults.add(code, action="vm.get")
    before = arm_server.faults.count("vm.get")
    sdk = error_of(lambda: provider.api.call(f"reading VM {name}", provider.api.compute.virtual_machines.get,
                                             group, name, expand="instanceView"))
    asked = arm_server.faults.count("vm.get") - before
    rest = error_of(lambda: provider.describe([inst.id]))
    assert isinstance(rest, kind) and said(rest) == said(sdk) and code in str(rest)
    assert arm_server.faults.count("vm.get") - before - asked == asked == 1  # not retried, either way
    arm_server.faults.add(code, action="group.list")
    wanted = f"tagName eq '{TAG_CLUSTER}' and tagValue eq 'err'"
    sdk_listing = error_of(lambda: provider.api.call("listing resource groups", lambda: list(
        provider.api.resource.resource_groups.list(filter=wanted))))
    assert said(error_of(lambda: provider.list_tagged("err"))) == said(sdk_listing)


def test_not_found_is_the_sdks_404_and_a_server_error_is_retried(arm_server: ArmServer,
                                                                 provider: AzureProvider) -> None:
    (inst,) = provider.launch(spec("flaky"), 1)
    group = inst.id.split(":")[0]
    sdk = error_of(lambda: provider.api.call("reading VM nope", provider.api.compute.virtual_machines.get, group,
                                             "nope", expand="instanceView"))
    url = provider.api.url(f"resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/nope")
    rest = error_of(lambda: provider.api.get_json("reading VM nope", url, **{"api-version": COMPUTE_API_VERSION}))
    assert said(rest) == said(sdk) and isinstance(rest, AzureApiError)
    assert (rest.status, rest.code) == (404, "ResourceNotFound")
    # A 500 is retried by the pipeline, as the SDK clients' retry policy did (once each here).
    actions = ("vm.get", "nic.list", "group.list")

    def counts() -> list[int]:
        return [arm_server.faults.count(a) for a in actions]

    for action in actions:
        arm_server.faults.add("InternalServerError", action=action, times=1)
    before = counts()
    assert [i.state for i in provider.describe([inst.id])] == [InstanceState.RUNNING]
    described = counts()
    assert [i.id for i in provider.list_tagged("flaky")] == [inst.id]
    listed = counts()
    assert [b - a for a, b in zip(before, described)] == [2, 2, 0]
    assert [b - a for a, b in zip(described, listed)] == [1, 1, 2]


def test_an_unreachable_arm_is_said_as_the_sdk_path_said_it(arm_server: ArmServer) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nowhere = AzureProvider(**{**arm_server.config(), "arm_endpoint": f"https://127.0.0.1:{port}"})
    sdk = error_of(lambda: nowhere.api.call("reading VM x", nowhere.api.compute.virtual_machines.get, "rg", "x",
                                            expand="instanceView"))
    rest = error_of(lambda: nowhere.describe(["rg:x"]))
    assert said(rest) == said(sdk) and type(rest) is ProviderError and "could not reach Azure" in str(rest)


# the point of it ---------------------------------------------------------------------------------


def test_describe_and_list_tagged_import_no_management_sdk(arm_server: ArmServer, provider: AzureProvider) -> None:
    """In a fresh process (the fake's service principal in its environment): no azure.mgmt.* after
    a describe, a listing, nor a read that ARM answered 404 (a deleted VM)."""
    (inst,) = provider.launch(spec("light"), 1)
    group = inst.id.split(":")[0]
    code = (
        "import json, sys\n"
        "from cloudtrain.providers.azure import AzureProvider\n"
        "def heavy():\n"
        "    return sorted({'.'.join(m.split('.')[:3]) for m in list(sys.modules) if m.startswith('azure.mgmt.')})\n"
        f"p = AzureProvider(**{arm_server.config()!r}, all_owners=True)\n"
        f"states = [i.state.value for i in p.describe([{inst.id!r}, {group + ':gone'!r}])]\n"
        "listed = [i.id for i in p.list_tagged('light')]\n"
        "print(json.dumps([states, listed, heavy()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    states, listed, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert states == ["running", "terminated"] and listed == [inst.id]
    assert imported == []
