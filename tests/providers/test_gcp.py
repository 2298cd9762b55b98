"""The gcp provider against the fake Compute Engine (real SDK, real google-auth, HTTP), in process.

What a launch sends and creates (machine type, GPUs, scheduling, labels, metadata, firewall), what
Compute Engine's errors mean for failover (zone, region, all of GCP, stop), what a failure leaves
(nothing), stop/start/terminate, and listing by label. The CLI flows are in
tests/e2e/test_gcp_e2e.py; the fake itself is held to the API in tests/testing/test_gcp_fake.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.catalog import default_catalog
from cloudtrain.config import Config
from cloudtrain.errors import (
    CapacityError,
    CredentialsError,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.base import (
    TAG_CLUSTER,
    TAG_OWNER,
    CreatesMachines,
    InstanceSpec,
    InstanceState,
    SelfStopping,
    StopsMachines,
    owner_id,
    supports,
)
from cloudtrain.testing.gcp import (
    ACCELERATORS,
    DEFAULT_SERVICE_ACCOUNT,
    GLOBAL_GPU_QUOTA_MESSAGE,
    MACHINE_TYPES,
    SERVICE_ACCOUNT,
    GceServer,
)

from cloudtrain.providers.deadline import deadline_seconds
from cloudtrain.providers.gcp import GcpProvider, build, make_provider
from cloudtrain.providers.gcp.api import NO_CREDENTIALS, Backoff
from tests.lazy import requires

pytestmark = [pytest.mark.quick, requires("google.cloud.compute_v1")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheGcpProviderTests test"
CIDR = "203.0.113.7/32"


@pytest.fixture
def provider(gce_server: GceServer, waits: list[float]) -> GcpProvider:
    made = GcpProvider(**gce_server.config(region="us-central1"))
    made.api.backoff = Backoff(sleep=waits.append)  # the backoff's waits are recorded, not slept
    return made


@pytest.fixture
def waits() -> list[float]:
    return []


@pytest.fixture
def image(gce_server: GceServer) -> str:
    return gce_server.create_image("kit-image", labels={"cloudtrain-ssh-user": "kituser"})


def spec(cluster: str = "box", **kwargs: Any) -> InstanceSpec:
    defaults: dict[str, Any] = {"owner": owner_id(), "instance_type": "e2-standard-2", "region": "us-central1",
                                "ssh_public_key": KEY, "allowed_cidr": CIDR}
    return InstanceSpec(cluster=cluster, **{**defaults, **kwargs})


def instances(gce: GceServer, cluster: str | None = None) -> list[tuple[str, dict]]:
    return gce.find_instances(f'labels.cloudtrain-cluster = "{cluster}"' if cluster else "")


def inserted(gce: GceServer) -> list[dict]:
    """The instance bodies cloudtrain sent, as JSON on the wire."""
    return [r.body for r in gce.faults.seen("instances.insert")]


# wiring and credentials ----------------------------------------------------------------------------


def test_capabilities_config_and_lazy_sdk_import(gce_server: GceServer) -> None:
    traits = GcpProvider.traits
    assert (traits.remote, traits.priced, traits.owns_machines, traits.stops_spot) == (True,) * 4
    assert all(supports(GcpProvider, c) for c in (CreatesMachines, StopsMachines, SelfStopping))
    assert not GcpProvider.image_pins_region("projects/p/global/images/x")
    provider = make_provider(Config.model_validate({"gcp": gce_server.config(region="europe-west4")}))
    assert provider.default_region == "europe-west4" and provider.api.endpoint == gce_server.url
    assert provider.api.project == gce_server.project
    code = ("import sys; from cloudtrain.providers import traits; traits('gcp'); "
            "print(sorted(m for m in sys.modules if m.startswith('google')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_check_credentials_says_which_and_why_not(gce_server: GceServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ok = GcpProvider(**gce_server.config(region="us-central1")).check_credentials()
    assert ok.ok, ok.detail
    assert "service account cloudtrain-kit@" in ok.detail and "GOOGLE_APPLICATION_CREDENTIALS" in ok.detail
    assert "project cloudtrain-test (from config gcp.project)" in ok.detail and "region us-central1" in ok.detail
    # The project can come from the key file itself (ADC), the endpoint from the config only.
    adc = GcpProvider(api_endpoint=gce_server.url).check_credentials()
    assert adc.ok and "(from the credentials)" in adc.detail and "no default region" in adc.detail
    # A key the API does not know: google-auth signs, the API refuses.
    stranger = gce_server.add_service_account(tmp_path / "stranger.json", known=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(stranger))
    bad = GcpProvider(**gce_server.config()).check_credentials()
    assert not bad.ok and "authentication credentials" in bad.detail and "\n" not in bad.detail
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("HOME", str(tmp_path))
    none = GcpProvider(**gce_server.config()).check_credentials()
    assert (none.ok, none.detail) == (False, NO_CREDENTIALS)
    with pytest.raises(CredentialsError):
        GcpProvider(**gce_server.config()).launch(spec(), 1)
    assert gce_server.faults.count("write") == 0
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(gce_server.key_file))
    unreachable = GcpProvider(project=gce_server.project, api_endpoint="http://127.0.0.1:9").check_credentials()
    assert not unreachable.ok and unreachable.detail.endswith("could not reach http://127.0.0.1:9: Connection refused")


# what a launch sends and creates -----------------------------------------------------------------------


def test_a_t4_launch_sends_what_the_api_expects(gce_server: GceServer, provider: GcpProvider, image: str) -> None:
    (inst,) = provider.launch(spec(instance_type="n1-standard-4+t4x1", image=image, disk_gb=60), 1)
    assert inst.state is InstanceState.RUNNING and inst.zone == "us-central1-a" and inst.region == "us-central1"
    assert inst.id == f"us-central1-a:{inst.id.split(':')[1]}" and inst.id.split(":")[1].startswith("box-0-")
    assert inst.instance_type == "n1-standard-4+t4x1" and inst.ssh_user == "kituser"
    assert inst.public_ip and inst.public_ip.startswith("34.") and inst.private_ip.startswith("10.128.")
    (body,) = inserted(gce_server)
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-4"
    assert body["guestAccelerators"] == [
        {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}]
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert metadata == {"ssh-keys": f"kituser:{KEY}", "enable-oslogin": "FALSE", "install-nvidia-driver": "True"}
    assert body["labels"] == {TAG_CLUSTER: "box", TAG_OWNER: owner_id(), "cloudtrain-ssh-user": "kituser"}
    assert body["tags"] == {"items": ["cloudtrain-box"]}
    (disk,) = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == image and disk["initializeParams"]["diskSizeGb"] == "60"
    assert disk["initializeParams"]["labels"] == body["labels"]
    assert body["networkInterfaces"] == [{"network": "global/networks/default",
                                          "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}]
    # One firewall rule: SSH from the caller only, to the cluster's tag; no internal rule for one node.
    rule = gce_server.added_firewalls["cloudtrain-box-ssh"]
    assert rule["name"] == "cloudtrain-box-ssh" and rule["sourceRanges"] == [CIDR]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}] and rule["targetTags"] == ["cloudtrain-box"]
    assert rule["description"].startswith(f"cloudtrain-cluster=box cloudtrain-owner={owner_id()}:")
    assert gce_server.firewall_ranges_seen == {CIDR}


def test_default_images_and_built_in_gpus(gce_server: GceServer, provider: GcpProvider) -> None:
    (gpu,) = provider.launch(spec("l4", instance_type="g2-standard-4"), 1)
    (cpu,) = provider.launch(spec("cpu", instance_type="e2-standard-2", disk_gb=None), 1)
    g2, e2 = inserted(gce_server)
    assert "guestAccelerators" not in g2 and g2["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert g2["disks"][0]["initializeParams"]["sourceImage"].startswith(
        "projects/deeplearning-platform-release/global/images/common-cu128-ubuntu-2204-nvidia-570-")
    assert e2["scheduling"] == {"onHostMaintenance": "MIGRATE", "automaticRestart": True}
    assert e2["disks"][0]["initializeParams"]["sourceImage"].startswith(
        "projects/ubuntu-os-cloud/global/images/ubuntu-2204")
    assert e2["disks"][0]["initializeParams"]["diskSizeGb"] == str(build.DEFAULT_DISK_GB)
    assert gpu.ssh_user == cpu.ssh_user == build.SSH_USER == "cloudtrain"
    assert "cloudtrain-ssh-user" not in e2["labels"] and "install-nvidia-driver" not in str(e2["metadata"])
    assert gpu.instance_type == "g2-standard-4" and gpu.zone == "us-central1-a"


def test_labels_are_sanitized_and_a_disk_smaller_than_the_image_grows(
    gce_server: GceServer, provider: GcpProvider, caplog: pytest.LogCaptureFixture
) -> None:
    big = gce_server.create_image("big-image", disk_gb=50)
    caplog.set_level(logging.WARNING, "cloudtrain.providers.gcp")
    odd = spec("box", owner="Jane.Doe@Laptop.LOCAL", tags={"Team": "ML Infra", "9lives": "x" * 80}, image=big,
               disk_gb=20)
    provider.launch(odd, 1)
    (body,) = inserted(gce_server)
    assert body["labels"] == {TAG_CLUSTER: "box", TAG_OWNER: "jane-doe-laptop-local", "team": "ml-infra",
                              "k9lives": "x" * 63}
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "50"
    assert "below the image's 50 GB" in caplog.text


def test_spot_asks_for_spot_the_way_the_api_expects(gce_server: GceServer, provider: GcpProvider) -> None:
    provider.launch(spec("stop", instance_type="n1-standard-4+t4x1", spot=True), 1)
    provider.launch(spec("gone", spot=True, shutdown_behavior="terminate"), 1)
    gpu, cpu = inserted(gce_server)
    assert gpu["scheduling"] == {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE",
                                 "automaticRestart": False, "instanceTerminationAction": "STOP"}
    assert cpu["scheduling"] == {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE",
                                 "automaticRestart": False, "instanceTerminationAction": "DELETE"}
    # Spot VMs stop and start like any other (capability stop_spot).
    (stopped,) = instances(gce_server, "stop")
    ids = [build.instance_id(stopped[0], stopped[1]["name"])]
    provider.stop(ids)
    assert [i.state for i in provider.describe(ids)] == [InstanceState.STOPPED]
    provider.start(ids)
    assert [i.state for i in provider.describe(ids)] == [InstanceState.RUNNING]


def test_max_run_s_becomes_max_run_duration_and_gcp_enforces_it(gce_server: GceServer,
                                                                  provider: GcpProvider) -> None:
    (inst,) = provider.launch(spec("budget", max_run_s=7200.0), 1)
    (spot,) = provider.launch(spec("budgetspot", max_run_s=1800.4, spot=True, shutdown_behavior="terminate"), 1)
    standard, preemptible = inserted(gce_server)
    assert standard["scheduling"] == {"onHostMaintenance": "MIGRATE", "automaticRestart": True,
                                      "maxRunDuration": {"seconds": "7230"}, "instanceTerminationAction": "STOP"}
    # The budget and the backstop's grace (providers/deadline.py): the watchdog acts first.
    assert preemptible["scheduling"]["maxRunDuration"] == {"seconds": str(deadline_seconds(1800.4))} == {"seconds": "1831"}
    assert preemptible["scheduling"]["instanceTerminationAction"] == "DELETE"
    gce_server.advance(1832)  # the spot VM's limit passes: Compute Engine deletes it
    assert [i.state for i in provider.describe([inst.id, spot.id])] == [InstanceState.RUNNING, InstanceState.TERMINATED]
    gce_server.advance(7200)
    assert [i.state for i in provider.describe([inst.id])] == [InstanceState.STOPPED]
    provider.launch(spec("tiny", max_run_s=5), 1)  # 5 s and the grace: 35 s
    assert inserted(gce_server)[-1]["scheduling"]["maxRunDuration"] == {"seconds": "35"}


def test_a_watchdog_stops_its_vm_by_shutting_it_down_and_deletes_it_with_its_service_account(
    gce_server: GceServer, provider: GcpProvider
) -> None:
    (inst,) = provider.launch(spec(watchdog="delete"), 1)
    zone, name = inst.id.split(":")
    # A VM that may have to delete itself runs as the project's default compute service account,
    # with the compute scope only.
    (body,) = inserted(gce_server)
    assert body["serviceAccounts"] == [{"email": "default", "scopes": ["https://www.googleapis.com/auth/compute"]}]
    assert gce_server.instance(zone, name)["serviceAccounts"] == [
        {"email": DEFAULT_SERVICE_ACCOUNT, "scopes": ["https://www.googleapis.com/auth/compute"]}]
    writes = gce_server.faults.count("write")
    assert provider.watchdog_action(inst, down=False) == {"kind": "shutdown", "effect": "stop", "identity": {
        "url": "http://metadata.google.internal/computeMetadata/v1/instance/name",
        "headers": {"Metadata-Flavor": "Google"}, "expect": name}}
    assert provider.watchdog_action(inst, down=True) == {
        "kind": "http", "effect": "delete", "method": "DELETE",
        "url": f"{gce_server.url}/compute/v1/projects/{gce_server.project}/zones/{zone}/instances/{name}",
        "token": {"url": "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token",
                  "headers": {"Metadata-Flavor": "Google"}, "field": "access_token"},
        "ok": [200], "gone_ok": True}
    assert supports(GcpProvider, SelfStopping)
    assert gce_server.faults.count("write") == writes  # asking for the actions changed nothing in the cloud
    provider.terminate([inst.id])
    with pytest.raises(ProviderError, match="no instance"):
        provider.watchdog_action(inst, down=False)


def test_the_vms_service_account_comes_from_the_config(gce_server: GceServer) -> None:
    config = {"gcp": {**gce_server.config(region="us-central1"), "service_account": SERVICE_ACCOUNT}}
    chosen = make_provider(Config.model_validate(config))
    (inst,) = chosen.launch(spec("chosen", shutdown_behavior="terminate"), 1)
    assert gce_server.instance(*inst.id.split(":"))["serviceAccounts"][0]["email"] == SERVICE_ACCOUNT
    assert chosen.watchdog_action(inst, down=True)["effect"] == "delete"
    # `none`: no credentials on the VM; it still stops itself, but cannot delete itself (one line).
    bare = make_provider(Config.model_validate({"gcp": {**config["gcp"], "service_account": "none"}}))
    (plain,) = bare.launch(spec("bare", watchdog="delete"), 1)
    assert "serviceAccounts" not in inserted(gce_server)[-1]
    assert "serviceAccounts" not in gce_server.instance(*plain.id.split(":"))
    assert bare.watchdog_action(plain, down=False)["kind"] == "shutdown"
    with pytest.raises(NotAvailableError, match="cannot delete itself: it runs as no service account") as refused:
        bare.watchdog_action(plain, down=True)
    assert "gcp.service_account" in (refused.value.hint or "")
    # An account the launcher may not act as: Compute Engine refuses the insert, nothing is left.
    stranger = make_provider(Config.model_validate(
        {"gcp": {**config["gcp"], "service_account": "nobody@elsewhere.iam.gserviceaccount.com"}}))
    with pytest.raises(ProviderError, match="does not have access to service account"):
        stranger.launch(spec("stranger", watchdog="delete"), 1)
    assert instances(gce_server, "stranger") == []
    with pytest.raises(ValueError, match="service_account"):
        Config.model_validate({"gcp": {"service_account": "not an email"}})
    chosen.terminate([inst.id])
    bare.terminate([plain.id])


IDENTITY = [  # (gcp.service_account, shutdown_behavior, watchdog) -> the VM's account, or None
    ("default", "stop", None, None),
    ("default", "stop", "stop", None),  # autostop stops by an OS shutdown, a budget too: no credentials
    ("default", "terminate", None, DEFAULT_SERVICE_ACCOUNT),  # autostop.down
    ("default", "stop", "delete", DEFAULT_SERVICE_ACCOUNT),  # a sweep's lease
    (SERVICE_ACCOUNT, "stop", "stop", None),
    (SERVICE_ACCOUNT, "stop", "delete", SERVICE_ACCOUNT),
    ("none", "terminate", "delete", None),
]


@pytest.mark.parametrize("configured,shutdown,watchdog,account", IDENTITY)
def test_a_vm_gets_a_service_account_only_when_its_watchdog_may_delete_it(
    gce_server: GceServer, configured: str, shutdown: str, watchdog: str | None, account: str | None
) -> None:
    config = Config.model_validate({"gcp": {**gce_server.config(region="us-central1"), "service_account": configured}})
    chosen = make_provider(config)
    (inst,) = chosen.launch(spec(shutdown_behavior=shutdown, watchdog=watchdog), 1)
    accounts = gce_server.instance(*inst.id.split(":")).get("serviceAccounts") or []
    assert [a["email"] for a in accounts] == ([account] if account else [])
    said = chosen.vm_identity(watchdog == "delete" or shutdown == "terminate")
    assert said.startswith("no service account") == (account is None), said
    if account is None:
        with pytest.raises(NotAvailableError, match="cannot delete itself"):
            chosen.watchdog_action(inst, down=True)
    chosen.terminate([inst.id])


def test_several_nodes_share_their_firewall_rules(gce_server: GceServer, provider: GcpProvider) -> None:
    nodes = provider.launch(spec("pair"), 2)
    assert [n.id.split(":")[1].rsplit("-", 1)[0] for n in nodes] == ["pair-0", "pair-1"]
    assert len({n.zone for n in nodes}) == 1
    rules = gce_server.added_firewalls
    assert set(rules) == {"cloudtrain-pair-ssh", "cloudtrain-pair-internal", "cloudtrain-pair-deny"}
    internal = rules["cloudtrain-pair-internal"]
    assert internal["sourceTags"] == internal["targetTags"] == ["cloudtrain-pair"] and "sourceRanges" not in internal
    assert gce_server.firewall_ranges_seen == {CIDR}


STRANGER = "198.51.100.66"
REACH = [  # (who connects, port, admitted): the default network's rules open 22 and 3389 to all
    (CIDR.split("/")[0], 22, True),
    (STRANGER, 22, False),
    ("10.128.0.9", 22, False),  # another instance of the project: default-allow-internal does not reach ours
    (CIDR.split("/")[0], 3389, False),
    (STRANGER, 3389, False),
]


@pytest.mark.parametrize("source,port,admitted", REACH)
def test_a_cloudtrain_vm_is_reachable_from_the_callers_address_only(
    gce_server: GceServer, provider: GcpProvider, source: str, port: int, admitted: bool
) -> None:
    from cloudtrain.testing.route import admits

    (inst,) = provider.launch(spec(), 1)
    zone, name = inst.id.split(":")
    assert (admits(gce_server.ingress_rules(zone, name), source, port) is not None) == admitted
    # The same project's other VMs keep the default network's rules (SSH from anywhere): the fake
    # has them, and cloudtrain does not change what is not its own.
    other = gce_server.client("instances")
    from google.cloud import compute_v1

    body = {"name": "theirs", "machine_type": f"zones/{zone}/machineTypes/e2-standard-2",
            "disks": [{"boot": True, "auto_delete": True, "initialize_params": {
                "source_image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
            "network_interfaces": [{"network": "global/networks/default",
                                    "access_configs": [{"name": "External NAT"}]}]}
    other.insert_unary(project=gce_server.project, zone=zone, instance_resource=compute_v1.Instance(body))
    assert admits(gce_server.ingress_rules(zone, "theirs"), STRANGER, 22)["name"] == "default-allow-ssh"


def test_ssh_open_to_everyone_only_when_asked_and_with_a_warning(
    gce_server: GceServer, provider: GcpProvider, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UsageError, match="allowed_cidr is not set"):
        provider.launch(spec(allowed_cidr=None), 1)
    with pytest.raises(NotAvailableError, match="IPv6"):
        provider.launch(spec(allowed_cidr="2001:db8::1/128"), 1)
    assert gce_server.faults.count("write") == 0
    caplog.set_level(logging.WARNING, "cloudtrain.providers.gcp")
    provider.launch(spec("world", allowed_cidr="0.0.0.0/0"), 1)
    assert "open to the whole internet" in caplog.text
    assert gce_server.firewalls["cloudtrain-world-ssh"]["sourceRanges"] == ["0.0.0.0/0"]


def test_an_existing_rule_follows_the_callers_new_address_and_a_strangers_is_refused(
    gce_server: GceServer, provider: GcpProvider
) -> None:
    (first,) = provider.launch(spec("moved"), 1)
    provider.terminate([first.id])
    assert gce_server.added_firewalls == {}
    provider.launch(spec("moved"), 1)
    rule = provider.firewalls  # the same rule, kept while an instance uses it: relaunch with a new address
    rule.ensure("moved", owner_id(), "198.51.100.9/32", 1)
    assert gce_server.firewalls["cloudtrain-moved-ssh"]["sourceRanges"] == ["198.51.100.9/32"]
    client = gce_server.client("firewalls")
    from google.cloud import compute_v1

    client.insert_unary(project=gce_server.project, firewall_resource=compute_v1.Firewall(
        name="cloudtrain-taken-ssh", description="someone else's", allowed=[{"I_p_protocol": "tcp", "ports": ["22"]}],
        source_ranges=["10.0.0.0/8"]))
    with pytest.raises(ProviderError, match="not cloudtrain's for cluster taken"):
        provider.launch(spec("taken"), 1)
    assert instances(gce_server, "taken") == [] and "cloudtrain-taken-ssh" in gce_server.firewalls


# failover and failures -------------------------------------------------------------------------------


def test_a_stockout_moves_to_the_next_zone(gce_server: GceServer, provider: GcpProvider) -> None:
    gce_server.faults.add("ZONE_RESOURCE_POOL_EXHAUSTED", zones={"us-central1-a"})
    gce_server.faults.add("insufficientCapacity", zones={"us-central1-b"})  # as an HTTP error this time
    (inst,) = provider.launch(spec(instance_type="n1-standard-4+t4x1"), 1)
    assert inst.zone == "us-central1-c"
    assert [(r.zone, r.action) for r in gce_server.faults.seen("instances.insert")] == [
        ("us-central1-a", "instances.insert"), ("us-central1-b", "instances.insert"),
        ("us-central1-c", "instances.insert")]
    # The stocked-out instance is gone (the fake deleted it; the provider asked anyway).
    assert [z for z, _ in instances(gce_server, "box")] == ["us-central1-c"]


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "UNSUPPORTED_OPERATION",
                                  "RESOURCE_NOT_READY"])
def test_every_zone_out_is_a_zone_capacity_error_that_leaves_nothing(
    gce_server: GceServer, provider: GcpProvider, code: str
) -> None:
    gce_server.faults.add(code)
    with pytest.raises(CapacityError) as caught:
        provider.launch(spec(instance_type="n1-standard-4+t4x1"), 1)
    assert caught.value.scope == "zone" and "us-central1-f" in caught.value.message
    assert gce_server.faults.count("instances.insert") == 4  # a, b, c, f
    assert instances(gce_server) == [] and gce_server.added_firewalls == {} and gce_server.disks == {}


@pytest.mark.parametrize("code,message,scope", [
    ("QUOTA_EXCEEDED", None, "region"),
    ("quotaExceeded", None, "region"),
    ("QUOTA_EXCEEDED", GLOBAL_GPU_QUOTA_MESSAGE, "cloud"),
])
def test_quota_ends_the_region_or_all_of_gcp(gce_server: GceServer, provider: GcpProvider, code: str,
                                             message: str | None, scope: str) -> None:
    gce_server.faults.add(code, message=message)
    with pytest.raises(CapacityError) as caught:
        provider.launch(spec(instance_type="n1-standard-4+t4x1"), 1)
    assert caught.value.scope == scope
    assert ("GPUS_ALL_REGIONS" in caught.value.message) == (scope == "cloud")
    assert gce_server.faults.count("instances.insert") == 1  # no other zone tried
    assert instances(gce_server) == [] and gce_server.added_firewalls == {}


def test_permission_denied_stops_at_once_and_leaves_nothing(gce_server: GceServer, provider: GcpProvider) -> None:
    gce_server.faults.add("forbidden")
    with pytest.raises(CredentialsError) as caught:
        provider.launch(spec(), 1)
    assert "compute.instances.create" in caught.value.message and "roles/compute" in (caught.value.hint or "")
    assert gce_server.faults.count("instances.insert") == 1
    assert instances(gce_server) == [] and gce_server.added_firewalls == {}
    gce_server.faults.clear()
    gce_server.faults.add("IAM_PERMISSION_DENIED")  # the same, as a DONE operation
    with pytest.raises(CredentialsError):
        provider.launch(spec(), 1)
    assert instances(gce_server) == [] and gce_server.added_firewalls == {}


def test_a_missing_vpc_network_stops_with_a_hint(gce_server: GceServer, provider: GcpProvider) -> None:
    del gce_server.networks["default"]
    with pytest.raises(ProviderError) as caught:
        provider.launch(spec(), 1)
    assert not isinstance(caught.value, CapacityError) and "network" in (caught.value.hint or "")
    gce_server.networks["default"] = gce_server._network("default")
    gce_server.faults.add("VPC_NOT_FOUND")
    with pytest.raises(ProviderError) as caught:
        provider.launch(spec(), 1)
    assert not isinstance(caught.value, CapacityError) and "network" in (caught.value.hint or "")
    assert gce_server.faults.count("instances.insert") == 1
    assert instances(gce_server) == [] and gce_server.added_firewalls == {}


def test_a_node_that_fails_takes_the_launched_ones_with_it(gce_server: GceServer, provider: GcpProvider) -> None:
    gce_server.faults.add("backendError", when=lambda r: (r.body or {}).get("name", "").startswith("trio-2-"))
    with pytest.raises(ProviderError, match="backendError"):
        provider.launch(spec("trio"), 3)
    tries = provider.api.backoff.tries  # a 503 is retried, to the bound, before it counts as a failure
    assert gce_server.faults.count("instances.insert") == 2 + tries and gce_server.faults.count("instances.delete") >= 2
    assert instances(gce_server) == [] and gce_server.added_firewalls == {} and gce_server.disks == {}


def test_bad_input_is_refused_before_anything_exists(gce_server: GceServer, provider: GcpProvider) -> None:
    with pytest.raises(UsageError, match="MACHINE\\+GPUxCOUNT"):
        provider.launch(spec(instance_type="n1-standard-4+t4"), 1)
    with pytest.raises(UsageError, match="N1 machines only"):
        provider.launch(spec(instance_type="e2-standard-4+t4x1"), 1)
    with pytest.raises(UsageError, match="not found"):
        provider.launch(spec(image="projects/nope/global/images/family/nothing"), 1)
    with pytest.raises(UsageError, match="expected projects/PROJECT"):
        provider.launch(spec(image="ubuntu"), 1)
    with pytest.raises(CapacityError, match="not offered in any zone of us-east1"):
        provider.launch(spec(instance_type="a3-highgpu-8g", region="us-east1"), 1)
    assert gce_server.faults.count("write") == 0


# retries: what Google documents as "try again" -----------------------------------------------------

RETRIED = [  # (code, action, how it is delivered, HTTP status): each answered twice, then not
    ("rateLimitExceeded", "instances.insert", "http", 403),
    ("userRateLimitExceeded", "instances.insert", "http", 403),
    ("rateLimitExceeded", "instances.insert", "http", 429),
    ("backendError", "instances.insert", "http", 503),
    ("backendError", "instances.insert", "reply", 503),  # GCP acted, the answer was a 503: requestId
    ("backendError", "firewalls.insert", "reply", 503),
    ("backendError", "zoneOperations.wait", "http", 503),
    ("backendError", "globalOperations.wait", "http", 500),
    ("RESOURCE_OPERATION_RATE_EXCEEDED", "instances.insert", "operation", 403),  # issued again
    ("rateLimitExceeded", "machineTypes.aggregatedList", "http", 403),
    ("backendError", "images.getFromFamily", "http", 502),
]


@pytest.mark.parametrize("code,action,delivery,status", RETRIED)
def test_a_retryable_answer_is_retried_with_backoff_and_the_launch_succeeds(
    gce_server: GceServer, provider: GcpProvider, waits: list[float], code: str, action: str, delivery: str,
    status: int
) -> None:
    fault = gce_server.faults.add(code, action=action, delivery=delivery, status=status, times=2)
    (inst,) = provider.launch(spec(), 1)
    assert fault.hits == 2 and len(waits) == 2 and waits[1] > waits[0] * 0.9 / 2  # backed off
    assert [f"{zone}:{raw['name']}" for zone, raw in instances(gce_server)] == [inst.id]  # one, not two
    assert set(gce_server.added_firewalls) == {"cloudtrain-box-ssh", "cloudtrain-box-deny"} and len(gce_server.disks) == 1
    assert inst.state in (InstanceState.RUNNING, InstanceState.PENDING)


@pytest.mark.parametrize("action", ["instances.delete", "zoneOperations.wait", "firewalls.delete"])
def test_the_delete_at_the_end_of_a_run_survives_a_503(gce_server: GceServer, provider: GcpProvider,
                                                       action: str) -> None:
    (inst,) = provider.launch(spec(), 1)
    gce_server.faults.add("backendError", action=action, delivery="reply", times=1)
    provider.terminate([inst.id])
    assert instances(gce_server) == [] and gce_server.added_firewalls == {} and gce_server.disks == {}


def test_retries_are_bounded_then_the_answer_counts(gce_server: GceServer, provider: GcpProvider,
                                                    waits: list[float]) -> None:
    provider.api.backoff = Backoff(tries=3, sleep=waits.append)
    gce_server.faults.add("rateLimitExceeded", action="instances.insert")
    with pytest.raises(ProviderError, match="rateLimitExceeded.*after 3 tries"):
        provider.launch(spec(), 1)
    assert gce_server.faults.count("instances.insert") == 3 and len(waits) == 2
    assert instances(gce_server) == [] and gce_server.added_firewalls == {}
    # An operation rate limit that persists is the zone's answer: retried, then the next zone.
    gce_server.faults.clear()
    waits.clear()
    gce_server.faults.add("RESOURCE_OPERATION_RATE_EXCEEDED", zones={"us-central1-a"})
    (inst,) = provider.launch(spec(), 1)
    assert inst.zone == "us-central1-b" and gce_server.faults.count("instances.insert", zone="us-central1-a") == 3


@pytest.mark.parametrize("code,times_asked", [
    ("forbidden", 1), ("quotaExceeded", 1), ("insufficientCapacity", 1), ("QUOTA_EXCEEDED", 1)])
def test_answers_that_are_not_hiccups_are_not_retried(gce_server: GceServer, provider: GcpProvider,
                                                      waits: list[float], code: str, times_asked: int) -> None:
    gce_server.faults.add(code, zones={"us-central1-a"}, times=1)
    try:
        provider.launch(spec(zone="us-central1-a"), 1)
    except (CapacityError, CredentialsError):
        pass  # the answer itself is tested above; here only that it was taken at once
    assert gce_server.faults.count("instances.insert") == times_asked and waits == []


def test_the_backoff_doubles_jitters_and_stops_at_its_budget() -> None:
    delays = list(Backoff(first_s=1, max_s=8, tries=10, budget_s=1000).delays())
    assert len(delays) == 9
    assert all(0.5 * cap <= d <= cap for d, cap in zip(delays, [1, 2, 4, 8, 8, 8, 8, 8, 8]))
    assert sum(Backoff(first_s=1, max_s=8, tries=100, budget_s=20).delays()) <= 20


# stop, start, terminate, listing ---------------------------------------------------------------------


def test_stop_start_terminate_and_the_firewall_goes_with_the_last_instance(
    gce_server: GceServer, provider: GcpProvider
) -> None:
    nodes = provider.launch(spec("life"), 2)
    ids = [n.id for n in nodes]
    provider.stop(ids)
    assert {i.state for i in provider.describe(ids)} == {InstanceState.STOPPED}
    assert all(i.public_ip is None for i in provider.describe(ids))
    provider.stop(ids)  # already stopped: nothing to do
    provider.start(ids)
    started = provider.describe(ids)
    assert {i.state for i in started} == {InstanceState.RUNNING}
    assert {i.public_ip for i in started}.isdisjoint({n.public_ip for n in nodes})  # ephemeral IPs
    provider.terminate(ids[:1])
    assert len(instances(gce_server, "life")) == 1 and len(gce_server.added_firewalls) == 3  # still in use
    provider.terminate(ids)
    assert instances(gce_server, "life") == [] and gce_server.added_firewalls == {} and gce_server.disks == {}
    provider.terminate(ids)  # gone is success
    assert [i.state for i in provider.describe(ids)] == [InstanceState.TERMINATED] * 2
    with pytest.raises(ProviderError, match="no such instance"):
        provider.start(ids)


def test_terminating_gone_instances_still_removes_their_clusters_rules(gce_server: GceServer,
                                                                         provider: GcpProvider) -> None:
    (inst,) = provider.launch(spec("reclaimed", spot=True, shutdown_behavior="terminate"), 1)
    gce_server.preempt(inst.zone, inst.id.split(":")[1])  # DELETE action: the instance is gone
    assert gce_server.added_firewalls
    provider.terminate([inst.id])
    assert gce_server.added_firewalls == {}


def test_no_capacity_to_start_again_stays_in_the_zone(gce_server: GceServer, provider: GcpProvider) -> None:
    (inst,) = provider.launch(spec(), 1)
    provider.stop([inst.id])
    gce_server.faults.add("ZONE_RESOURCE_POOL_EXHAUSTED", action="instances.start")
    with pytest.raises(CapacityError, match="no capacity to start") as caught:
        provider.start([inst.id])
    assert "try again later" in (caught.value.hint or "")
    assert [i.state for i in provider.describe([inst.id])] == [InstanceState.STOPPED]


def test_list_tagged_and_resources_by_label_and_owner(gce_server: GceServer, provider: GcpProvider) -> None:
    mine = provider.launch(spec("mine"), 1)
    provider.launch(spec("theirs", owner="someone-else"), 1)
    assert [i.id for i in provider.list_tagged("mine")] == [mine[0].id]
    assert {i.cluster for i in provider.list_tagged()} == {"mine"}
    everyone = GcpProvider(**gce_server.config(), all_owners=True)
    assert {i.cluster for i in everyone.list_tagged()} == {"mine", "theirs"}
    assert [(r.cluster, r.kind, r.id) for r in provider.list_resources()] == [
        ("mine", "firewall", "cloudtrain-mine-deny"), ("mine", "firewall", "cloudtrain-mine-ssh")]
    kept = provider.release_resources("mine")
    assert [(r.id, r.note) for r in kept] == [("cloudtrain-mine-deny", "in use by 1 instance(s)"),
                                              ("cloudtrain-mine-ssh", "in use by 1 instance(s)")]
    provider.terminate([mine[0].id])
    assert provider.list_resources("mine") == [] and provider.release_resources("mine") == []


def test_every_catalog_type_is_sold_by_the_fake_where_the_catalog_says() -> None:
    offers = [o for o in default_catalog().offers if o.cloud == "gcp"]
    assert {o.region for o in offers} == {"us-central1", "us-east1", "us-east4", "us-west1", "europe-west4"}
    for offer in offers:
        machine = build.parse_instance_type(offer.instance_type)
        cpus, memory, built_in, count = MACHINE_TYPES[machine.machine_type]
        gpu = machine.accelerator or built_in
        assert (cpus, memory / 1024) == (offer.vcpus, offer.memory_gib), offer
        assert (gpu is not None) == bool(offer.accelerator), offer
        if gpu:
            assert (machine.count or count) == offer.accelerator_count, offer
            zones = [z for z in ACCELERATORS[gpu][2] if z.startswith(offer.region + "-")]
            assert zones, f"{offer.instance_type} has no zone in {offer.region}"
        if offer.price is not None and offer.spot_price is not None:  # unpriced rows are never planned
            assert offer.spot_price < offer.price, offer
        assert build.instance_type_name(machine.machine_type, [(machine.accelerator, machine.count)]
                                        if machine.accelerator else []) == offer.instance_type


def test_mark_alive_renews_the_label_with_its_fingerprint(gce_server: GceServer, provider: GcpProvider) -> None:
    from cloudtrain.providers.base import TAG_ALIVE, MarksAlive, supports

    assert supports(provider, MarksAlive)
    (inst,) = provider.launch(spec(tags={TAG_ALIVE: "1000"}), 1)
    assert provider.describe([inst.id])[0].alive_at == 1000.0
    provider.mark_alive([inst.id], 2_000_000_000)
    (listed,) = provider.list_tagged("box")
    assert listed.alive_at == 2_000_000_000.0 and listed.cluster == "box"  # the other labels kept
    provider.stop([inst.id])
    provider.mark_alive([inst.id], 2_000_000_100)  # stopped: nothing runs there to vouch for
    assert provider.describe([inst.id])[0].alive_at == 2_000_000_000.0
