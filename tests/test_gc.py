"""`cloudtrain gc` finds leaks by tag after local state is lost, and removes them with --yes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cloudtrain.catalog import Catalog, Offer
from cloudtrain.cluster.gc import Pricer
from cloudtrain.cost import disk_hourly, disk_price
from cloudtrain.providers.aws import AwsProvider
from cloudtrain.providers.base import (
    TAG_CLUSTER,
    TAG_OWNER,
    ClusterResource,
    Instance,
    InstanceSpec,
    InstanceState,
    owner_id,
)
from cloudtrain.testing.aws import MotoServer
from tests.conftest import cloudtrain

if TYPE_CHECKING:
    from cloudtrain.testing.azure import ArmServer
    from cloudtrain.testing.gcp import GceServer

REGION = "us-east-1"


def test_local_node_leaked_after_state_loss(tmp_path: Path, cloudtrain_home: Path) -> None:
    (tmp_path / "r.yaml").write_text("name: leaky\nrun: 'true'\n")
    assert cloudtrain("up", str(tmp_path / "r.yaml")).returncode == 0
    assert cloudtrain("gc", "--cloud", "local").stdout.strip() == "nothing leaked"
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (cloudtrain_home / name).unlink(missing_ok=True)
    found = cloudtrain("gc", "--cloud", "local")
    assert found.returncode == 1 and "leaky" in found.stdout and "cluster not in state" in found.stdout
    removed = cloudtrain("gc", "--cloud", "local", "--yes")
    assert removed.returncode == 0 and "terminated local-leaky-0" in removed.stdout
    assert not list((cloudtrain_home / "local").iterdir())
    assert cloudtrain("gc", "--cloud", "local").stdout.strip() == "nothing leaked"


def test_aws_instance_and_orphan_key_pair_found_by_tag(moto_server: MotoServer, tmp_path: Path,
                                                       monkeypatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"aws: {{region: {REGION}}}\nssh: {{allowed_cidr: 203.0.113.7/32}}\n")
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    ec2 = moto_server.client("ec2", REGION)
    leaked = f"gc-{uuid.uuid4().hex[:8]}"
    orphan = f"gc-{uuid.uuid4().hex[:8]}"
    from cloudtrain.remote.keys import cluster_key

    # An instance launched by a cloudtrain whose state is gone (another laptop, a wiped home).
    AwsProvider(region=REGION, regions=(REGION,)).launch(InstanceSpec(
        cluster=leaked, owner=owner_id(), instance_type="t3.medium", region=REGION, image=moto_server.ami(REGION),
        ssh_public_key=cluster_key(leaked).public_openssh, allowed_cidr="203.0.113.7/32"), 1)
    # A key pair whose instances are long gone.
    ec2.import_key_pair(KeyName=f"cloudtrain-{orphan}", PublicKeyMaterial=cluster_key(orphan).public_openssh.encode(),
                        TagSpecifications=[{"ResourceType": "key-pair", "Tags": [
                            {"Key": TAG_CLUSTER, "Value": orphan}, {"Key": TAG_OWNER, "Value": owner_id()}]}])

    found = cloudtrain("gc", "--cloud", "aws")
    assert found.returncode == 1, found.stdout + found.stderr
    rows = found.stdout.splitlines()
    # t3.medium in us-east-1, on demand: the bundled catalog's $0.0416/h; a key pair costs nothing.
    assert any(leaked in row and "instance" in row and "$0.0416" in row for row in rows)
    assert any(orphan in row and "key-pair" in row and "$0 " in row for row in rows)
    assert "leaks cost about $0.0416/h" in rows

    removed = cloudtrain("gc", "--cloud", "aws", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    live = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [leaked]},
                                           {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert not live["Reservations"]
    keys = ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [leaked, orphan]}])["KeyPairs"]
    assert keys == []
    again = cloudtrain("gc", "--cloud", "aws")
    assert leaked not in again.stdout and orphan not in again.stdout


def _launch(provider: AwsProvider, moto_server: MotoServer, cluster: str, instance_type: str, **spec) -> str:
    from cloudtrain.remote.keys import cluster_key

    (inst,) = provider.launch(InstanceSpec(
        cluster=cluster, owner=owner_id(), instance_type=instance_type, region=REGION, image=moto_server.ami(REGION),
        ssh_public_key=cluster_key(cluster).public_openssh, allowed_cidr="203.0.113.7/32", **spec), 1)
    return inst.id


def test_aws_leaks_priced_by_market_state_and_disks(moto_server: MotoServer, tmp_path: Path, monkeypatch) -> None:
    """Spot at the spot price, a stopped instance at its disks' storage price, a type the catalog
    does not know as "price unknown" (left out of the total, and said so), all in one --json."""
    config = tmp_path / "config.yaml"
    config.write_text(f"aws: {{region: {REGION}}}\nssh: {{allowed_cidr: 203.0.113.7/32}}\n")
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    provider = AwsProvider(region=REGION, regions=(REGION,))
    spot = _launch(provider, moto_server, f"gc-{uuid.uuid4().hex[:8]}", "t3.medium", spot=True)
    stopped = _launch(provider, moto_server, f"gc-{uuid.uuid4().hex[:8]}", "m5.large", disk_gb=30)
    provider.stop([stopped])
    odd = _launch(provider, moto_server, f"gc-{uuid.uuid4().hex[:8]}", "t2.nano")

    found = cloudtrain("gc", "--cloud", "aws", "--json")
    assert found.returncode == 1, found.stdout + found.stderr
    document = json.loads(found.stdout)
    items = {i["id"]: i for leak in document["leaks"] for i in leak["items"]}
    assert items[spot]["hourly_usd"] == pytest.approx(0.0125) and "spot" in items[spot]["detail"]
    assert items[stopped]["hourly_usd"] == pytest.approx(disk_hourly("aws", 30))
    assert items[stopped]["detail"] == "m5.large stopped: 30 GB of disks"
    assert items[odd]["hourly_usd"] is None and items[odd]["price"].startswith("price unknown")
    assert document["unknown_price"] >= 1
    known = [i["hourly_usd"] for i in items.values() if i["hourly_usd"] is not None]
    assert document["hourly_usd"] == pytest.approx(sum(known))

    table = cloudtrain("gc", "--cloud", "aws")
    row = next(line for line in table.stdout.splitlines() if odd in line)
    assert "price unknown" in row
    assert "item(s) of unknown price" in table.stdout.splitlines()[-2]

    removed = cloudtrain("gc", "--cloud", "aws", "--yes", "--json")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert any(spot in line for line in json.loads(removed.stdout)["removed"])
    assert json.loads(cloudtrain("gc", "--cloud", "aws", "--json").stdout)["leaks"] == []


def test_prices_come_from_the_catalog_and_the_storage_table() -> None:
    catalog = Catalog(offers=[Offer("aws", "r1", None, "big", "T4", 1, 8, 32, 2.0, 0.5)])
    pricer = Pricer("aws", catalog, priced=True)

    def inst(state: InstanceState, **fields) -> Instance:
        return Instance("i-1", "c", state, **{"instance_type": "big", "region": "r1", **fields})

    assert pricer.instance(inst(InstanceState.RUNNING, spot=False)).hourly_usd == 2.0
    assert pricer.instance(inst(InstanceState.RUNNING, spot=True)).hourly_usd == 0.5
    # Market not reported: the on-demand price, an upper bound, and it says so.
    unknown_market = pricer.instance(inst(InstanceState.RUNNING))
    assert unknown_market.hourly_usd == 2.0 and "upper bound" in unknown_market.price
    assert pricer.instance(inst(InstanceState.STOPPED, disk_gb=50)).hourly_usd == pytest.approx(disk_hourly("aws", 50))
    for missing in (inst(InstanceState.RUNNING, instance_type="small"), inst(InstanceState.RUNNING, region="r2"),
                    inst(InstanceState.UNKNOWN), inst(InstanceState.RUNNING, instance_type=None)):
        assert pricer.instance(missing).hourly_usd is None and pricer.instance(missing).price.startswith("price unknown")

    def res(kind: str, **fields) -> ClusterResource:
        return ClusterResource("aws", "c", kind, "x", "r1", **fields)

    assert [pricer.resource(res(k)).hourly_usd for k in ("key-pair", "security-group", "firewall", "resource-group")] \
        == [0.0] * 4
    assert pricer.resource(res("volume", size_gb=10)).hourly_usd == pytest.approx(disk_hourly("aws", 10))
    assert pricer.resource(res("static-ip", hourly_usd=0.005)).hourly_usd == 0.005
    assert pricer.resource(res("static-ip")).hourly_usd is None
    assert pricer.resource(res("volume")).hourly_usd is None  # a volume of unknown size
    # A cloud the storage table lacks: no disk price, never $0 (a loose disk or a stopped instance).
    assert disk_price("elsewhere") is None
    other = Pricer("elsewhere", catalog, priced=True)
    assert other.resource(ClusterResource("elsewhere", "c", "disk", "d", size_gb=10)).hourly_usd is None
    assert other.instance(inst(InstanceState.STOPPED, disk_gb=10)).hourly_usd is None
    # A billed kind of which the provider gave no price: unknown, not free.
    assert pricer.resource(res("public-ip")).hourly_usd is None
    # Machines that are the user's own are not billed.
    assert Pricer("mine", catalog, priced=False).instance(inst(InstanceState.RUNNING)).hourly_usd == 0.0


# The providers' side, against their fakes: what counts as a leftover, and what release removes.

GCP_ZONE = "us-central1-a"


def _gcp_disk(gce_server: GceServer, name: str, labels: dict[str, str], size_gb: int = 20) -> str:
    from google.cloud import compute_v1

    operation = gce_server.client("disks").insert_unary(
        project=gce_server.project, zone=GCP_ZONE,
        disk_resource=compute_v1.Disk(name=name, size_gb=size_gb, labels=labels))
    done = gce_server.client("zone_operations").wait(project=gce_server.project, zone=GCP_ZONE,
                                                      operation=operation.name)
    assert not done.error.errors, done
    return name


def test_gcp_lists_and_deletes_only_our_loose_disks(gce_server: GceServer) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from google.api_core import exceptions as api_exceptions

    from cloudtrain.providers.gcp import GcpProvider
    from cloudtrain.remote.keys import cluster_key

    provider = GcpProvider(**gce_server.config(region="us-central1"))
    (inst,) = provider.launch(InstanceSpec(
        cluster="box", owner=owner_id(), instance_type="e2-standard-2", region="us-central1",
        ssh_public_key=cluster_key("box").public_openssh, allowed_cidr="203.0.113.7/32"), 1)
    ours = {TAG_CLUSTER: "box", TAG_OWNER: owner_id()}
    _gcp_disk(gce_server, "box-left", ours, size_gb=30)
    _gcp_disk(gce_server, "box-unlabelled", {})
    _gcp_disk(gce_server, "box-cluster-only", {TAG_CLUSTER: "box"})
    _gcp_disk(gce_server, "box-someone-else", {TAG_CLUSTER: "box", TAG_OWNER: "someone-else"})

    # The instance's own boot disk carries our labels but is in use: not a leftover.
    disks = [r for r in provider.list_resources() if r.kind == "disk"]
    assert [(r.cluster, r.id, r.region, r.size_gb) for r in disks] == [
        ("box", f"{GCP_ZONE}:box-left", "us-central1", 30.0)]
    # While the cluster has an instance, the disk is kept (a launch may be about to use it), noted.
    kept = provider.release_resources("box")
    assert ("disk", f"{GCP_ZONE}:box-left", "the cluster still has 1 instance(s)") in [
        (k.kind, k.id, k.note) for k in kept]
    # Compute Engine refuses to delete a disk in use, and says by what.
    with pytest.raises(api_exceptions.BadRequest, match="already being used by"):
        gce_server.client("disks").delete(project=gce_server.project, zone=inst.zone, disk=inst.id.split(":")[1])

    provider.terminate([inst.id])  # the instance, its boot disk (autoDelete), then the cluster's resources
    with gce_server.lock:
        left = sorted(name for _, name in gce_server.disks)
    assert left == ["box-cluster-only", "box-someone-else", "box-unlabelled"]
    assert provider.list_resources("box") == [] and provider.release_resources("box") == []


def test_azure_lists_billed_items_of_groups_without_vms_and_releases_them_with_it(arm_server: ArmServer) -> None:
    pytest.importorskip("azure.mgmt.network")
    from azure.mgmt.compute.models import CreationData, Disk, DiskSku
    from azure.mgmt.network.models import PublicIPAddress, PublicIPAddressSku
    from azure.mgmt.resource.resources.models import ResourceGroup

    from cloudtrain.providers.azure import AzureProvider
    from cloudtrain.remote.keys import cluster_key

    provider = AzureProvider(**arm_server.config(region="eastus"), polling_interval=0)
    provider.launch(InstanceSpec(cluster="live", owner=owner_id(), instance_type="Standard_D2s_v5", region="eastus",
                                 ssh_public_key=cluster_key("live").public_openssh, allowed_cidr="203.0.113.7/32"), 1)
    network, compute = arm_server.client("network"), arm_server.client("compute")
    group = "cloudtrain-dead-eastus"  # what a launch killed before its VM leaves
    arm_server.client("resource").resource_groups.create_or_update(
        group, ResourceGroup(location="eastus", tags={TAG_CLUSTER: "dead", TAG_OWNER: owner_id()}))
    network.public_ip_addresses.begin_create_or_update(group, "dead-0-ip", PublicIPAddress(
        location="eastus", sku=PublicIPAddressSku(name="Standard"), public_ip_allocation_method="Static",
        public_ip_address_version="IPv4")).result()
    network.public_ip_addresses.begin_create_or_update(group, "dead-odd-ip", PublicIPAddress(
        location="eastus", sku=PublicIPAddressSku(name="Standard"), public_ip_allocation_method="Static",
        public_ip_address_version="IPv6")).result()
    compute.disks.begin_create_or_update(group, "dead-0-osdisk", Disk(
        location="eastus", sku=DiskSku(name="StandardSSD_LRS"), creation_data=CreationData(create_option="Empty"),
        disk_size_gb=64)).result()

    found = {(r.cluster, r.kind, r.id): r for r in provider.list_resources()}
    # The live cluster's group holds a VM: its IP and disk are its VM's, not leftovers.
    assert sorted(found) == [
        ("dead", "disk", f"{group}:dead-0-osdisk"), ("dead", "public-ip", f"{group}:dead-0-ip"),
        ("dead", "public-ip", f"{group}:dead-odd-ip"), ("dead", "resource-group", group),
        ("live", "resource-group", "cloudtrain-live-eastus")]
    # Azure's listed price of a Standard static IPv4 address (azure.microsoft.com/pricing/details/ip-addresses);
    # an IPv6 one is not in the price table: unknown, never $0.
    assert found[("dead", "public-ip", f"{group}:dead-0-ip")].hourly_usd == 0.005
    assert found[("dead", "public-ip", f"{group}:dead-odd-ip")].hourly_usd is None
    assert found[("dead", "disk", f"{group}:dead-0-osdisk")].size_gb == 64.0
    pricer = Pricer("azure", Catalog(offers=[]), priced=True)
    assert pricer.resource(found[("dead", "disk", f"{group}:dead-0-osdisk")]).hourly_usd == pytest.approx(
        disk_hourly("azure", 64))

    # Released once, with its group: the IPs and the disk are not deleted on their own.
    assert provider.release_resources("dead") == []
    assert arm_server.faults.count("group.delete") == 1
    assert arm_server.faults.count("ip.delete") == 0 and arm_server.faults.count("disk.delete") == 0
    assert not arm_server.find("Microsoft.Network/publicIPAddresses", group=group)
    assert not arm_server.find("Microsoft.Compute/disks", group=group)
    assert [(r.cluster, r.kind) for r in provider.list_resources()] == [("live", "resource-group")]


@pytest.mark.parametrize(("args", "code", "lines"), [
    (["--cloud", "local"], 0, ["nothing leaked"]),
    (["--cloud", "aws"], 1, ["nothing was checked", "NOT CHECKED: aws ("]),
    (["--cloud", "local", "--cloud", "aws"], 1, ["nothing leaked in local", "NOT CHECKED: aws ("]),
])
def test_a_cloud_that_could_not_be_checked_is_never_reported_clean(
    moto_server: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int,
    lines: list[str],
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("aws: {profile: no-such-profile}\n")  # unusable credentials, no network needed
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    found = cloudtrain("gc", *args)
    assert found.returncode == code, found.stdout + found.stderr
    out = found.stdout.splitlines()
    assert len(out) == len(lines) and all(line.startswith(want) for line, want in zip(out, lines)), found.stdout

    as_json = cloudtrain("gc", *args, "--json")
    assert as_json.returncode == code
    document = json.loads(as_json.stdout)
    assert document["complete"] is (code == 0)
    assert [s["cloud"] for s in document["skipped"]] == (["aws"] if code else [])
    assert document["checked"] == [c for c in args if c not in ("--cloud", "aws")]


def test_clouds_never_set_up_are_said_so_and_do_not_fail_gc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only AWS used here, so gc must not exit 1 forever for GCP and Azure (issue 35.12): a cloud
    with nothing configured is "not set up" (exit 0); named with --cloud, it is one gc could not check."""
    from cloudtrain.testing.aws import isolate_aws_env

    isolate_aws_env(monkeypatch, tmp_path, {"AWS_EC2_METADATA_DISABLED": "true"})
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws, no gcloud ADC file
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(tmp_path / "none.yaml"))
    found = cloudtrain("gc")
    assert found.returncode == 0, found.stdout + found.stderr
    assert "not set up here (no credentials): aws, gcp, azure" in found.stdout
    document = json.loads(cloudtrain("gc", "--json").stdout)
    assert document["not_set_up"] == ["aws", "gcp", "azure"] and document["skipped"] == [] and document["complete"]
    named = cloudtrain("gc", "--cloud", "gcp")
    assert named.returncode == 1 and "NOT CHECKED: gcp" in named.stdout, named.stdout
