"""`cloudtrain gc` on every cloud's fake: what state lost is found by tag, priced, and removed;
what is not ours (no tags, only a look-alike name) is never touched.

For each cloud: a cluster made by `up`, then the state database deleted (another laptop, a wiped
home); besides it, resources made behind cloudtrain's back with the real SDK against the fake:
some carrying our tags (as a crashed launch would leave them), some only looking like ours. `gc`
lists the tagged ones with an hourly cost (the instance at its catalog price, a loose disk at its
size x the storage price, an Azure public IP at its listed hourly price) and exits 1; `gc --yes`
removes them; the look-alikes are still there; `gc` then finds nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cloudtrain.catalog import default_catalog
from cloudtrain.cost import disk_hourly
from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER, owner_id
from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import FakeCloud

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

VOLUME_GB = 20
# Azure's listed price of a Standard static IPv4 public IP (azure.microsoft.com/pricing/details/ip-addresses).
AZURE_PUBLIC_IP_HOURLY = 0.005


@dataclass
class Planted:
    """What a test made behind cloudtrain's back: `tagged` (kind, id) are ours to collect, with the
    hourly price each should be shown at; `untagged` must survive; `exists` says which ids still do."""

    tagged: dict[tuple[str, str], float]
    untagged: list[str]
    exists: Callable[[list[str]], set[str]]
    remove_untagged: Callable[[], None] = lambda: None  # for fakes that outlive the test


def _tags(cluster: str) -> dict[str, str]:
    return {TAG_CLUSTER: cluster, TAG_OWNER: owner_id()}


def plant_aws(cloud: Any, orphan: str, stranger: str) -> Planted:
    """A key pair, a security group and a loose volume with our tags; the same three without."""
    ec2 = cloud.ec2()
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    def make(cluster: str, tags: dict[str, str]) -> dict[str, str]:
        spec = (lambda kind: [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
                if tags else [])
        ec2.import_key_pair(KeyName=f"cloudtrain-{cluster}", PublicKeyMaterial=public,
                            TagSpecifications=spec("key-pair"))
        group = ec2.create_security_group(GroupName=f"cloudtrain-{cluster}", VpcId=vpc, Description="gc test",
                                          TagSpecifications=spec("security-group"))["GroupId"]
        volume = ec2.create_volume(Size=VOLUME_GB, AvailabilityZone=f"{cloud.region}a",
                                   TagSpecifications=spec("volume"))["VolumeId"]
        return {"key-pair": f"cloudtrain-{cluster}", "security-group": group, "volume": volume}

    ours, theirs = make(orphan, _tags(orphan)), make(stranger, {})

    def exists(ids: list[str]) -> set[str]:
        keys = {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
        groups = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
        volumes = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
        return set(ids) & (keys | groups | volumes)

    def remove_untagged() -> None:
        # moto lives for the whole session: leave it as we found it.
        ec2.delete_key_pair(KeyName=theirs["key-pair"])
        ec2.delete_security_group(GroupId=theirs["security-group"])
        ec2.delete_volume(VolumeId=theirs["volume"])

    prices = {"key-pair": 0.0, "security-group": 0.0, "volume": disk_hourly("aws", VOLUME_GB)}
    return Planted({(kind, ident): prices[kind] for kind, ident in ours.items()}, list(theirs.values()), exists,
                   remove_untagged)


def plant_gcp(cloud: Any, orphan: str, stranger: str) -> Planted:
    """A firewall rule claimed for our cluster and owner (rules carry no labels: the description is
    the tag), and one of the same shape whose description claims nothing; a disk labelled for our
    cluster and owner that no instance uses (what an instance deleted without its disk leaves),
    and one named like an instance's disk without labels."""
    from google.cloud import compute_v1

    project = cloud.server.project
    firewalls, disks = cloud.server.client("firewalls"), cloud.server.client("disks")
    zone = f"{cloud.region}-a"

    def make(name: str, description: str) -> str:
        rule = compute_v1.Firewall(name=name, network="global/networks/default", direction="INGRESS",
                                   description=description, source_ranges=[cloud.allowed_cidr],
                                   allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])])
        operation = firewalls.insert_unary(project=project, firewall_resource=rule)
        cloud.server.client("global_operations").wait(project=project, operation=operation.name)
        return name

    def make_disk(name: str, labels: dict[str, str]) -> str:
        disk = compute_v1.Disk(name=name, size_gb=VOLUME_GB, type_=f"zones/{zone}/diskTypes/pd-balanced",
                               labels=labels)
        operation = disks.insert_unary(project=project, zone=zone, disk_resource=disk)
        done = cloud.server.client("zone_operations").wait(project=project, zone=zone, operation=operation.name)
        assert not done.error.errors, done
        return f"{zone}:{name}"  # how gc names a disk: its zone and name, like an instance

    ours = make(f"cloudtrain-{orphan}-ssh", f"{TAG_CLUSTER}={orphan} {TAG_OWNER}={owner_id()}: SSH from one address")
    theirs = make(f"cloudtrain-{stranger}-ssh", "made by hand: SSH from one address")
    our_disk = make_disk(f"{orphan}-0-d15c", _tags(orphan))
    their_disk = make_disk(f"{stranger}-0-d15c", {})

    def exists(ids: list[str]) -> set[str]:
        with cloud.server.lock:
            present = set(cloud.server.firewalls) | {f"{z}:{n}" for z, n in cloud.server.disks}
        return set(ids) & present

    return Planted({("firewall", ours): 0.0, ("disk", our_disk): disk_hourly("gcp", VOLUME_GB)},
                   [theirs, their_disk], exists)


def plant_azure(cloud: Any, orphan: str, stranger: str) -> Planted:
    """A resource group tagged for our cluster and owner holding what a launch killed before its
    VM leaves billed (a Standard static public IP) and a managed disk; and a group named like ours,
    without tags, holding a public IP."""
    from azure.mgmt.compute.models import CreationData, Disk, DiskSku
    from azure.mgmt.network.models import PublicIPAddress, PublicIPAddressSku
    from azure.mgmt.resource.resources.models import ResourceGroup

    groups = cloud.client("resource").resource_groups
    network, compute = cloud.client("network"), cloud.client("compute")

    def make(name: str, tags: dict[str, str]) -> str:
        groups.create_or_update(name, ResourceGroup(location=cloud.region, tags=tags or None))
        return name

    def make_ip(group: str, name: str, tags: dict[str, str]) -> str:
        network.public_ip_addresses.begin_create_or_update(group, name, PublicIPAddress(
            location=cloud.region, tags=tags or None, sku=PublicIPAddressSku(name="Standard"),
            public_ip_allocation_method="Static", public_ip_address_version="IPv4")).result()
        return f"{group}:{name}"  # how gc names what is in a group, like a VM

    def make_disk(group: str, name: str, tags: dict[str, str]) -> str:
        compute.disks.begin_create_or_update(group, name, Disk(
            location=cloud.region, tags=tags or None, sku=DiskSku(name="StandardSSD_LRS"),
            creation_data=CreationData(create_option="Empty"), disk_size_gb=VOLUME_GB)).result()
        return f"{group}:{name}"

    ours = make(f"cloudtrain-{orphan}-{cloud.region}", _tags(orphan))
    our_ip = make_ip(ours, f"{orphan}-0-ip", _tags(orphan))
    our_disk = make_disk(ours, f"{orphan}-0-osdisk", _tags(orphan))
    theirs = make(f"cloudtrain-{stranger}-{cloud.region}", {})
    their_ip = make_ip(theirs, f"{stranger}-0-ip", {})

    def exists(ids: list[str]) -> set[str]:
        present = {g["name"] for g in cloud.server.find("Microsoft.Resources/resourceGroups")}
        for kind in ("Microsoft.Network/publicIPAddresses", "Microsoft.Compute/disks"):
            present |= {f"{item['id'].split('/')[4]}:{item['name']}" for item in cloud.server.find(kind)}
        return set(ids) & present

    return Planted({("resource-group", ours): 0.0, ("public-ip", our_ip): AZURE_PUBLIC_IP_HOURLY,
                    ("disk", our_disk): disk_hourly("azure", VOLUME_GB)}, [theirs, their_ip], exists)


CLOUDS = {
    "aws": ("boto3", plant_aws),
    "gcp": ("google.cloud.compute_v1", plant_gcp),
    "azure": ("azure.mgmt.resource", plant_azure),
}


def gc_json(cloud: FakeCloud, *args: str) -> tuple[int, dict[str, Any]]:
    result = cloud.cli("gc", "--cloud", cloud.name, "--json", *args)
    assert result.stdout.strip(), result.output
    return result.returncode, json.loads(result.stdout)


@pytest.mark.parametrize("name", list(CLOUDS))
def test_gc_finds_prices_and_removes_only_what_is_tagged(fake_cloud: Callable[[str], FakeCloud], name: str) -> None:
    module, plant = CLOUDS[name]
    pytest.importorskip(module)
    cloud = fake_cloud(name)
    up = cloud.up(cloud.recipe(run="true"))
    assert up.ok, up.output
    assert cloud.cli("gc", "--cloud", name).stdout.strip() == "nothing leaked"

    # State is lost; the cloud still holds the cluster, plus things made behind cloudtrain's back.
    for file in ("state.db", "state.db-wal", "state.db-shm"):
        (cloud.home / file).unlink(missing_ok=True)
    # `up` again now would launch a second cluster beside it (GCP) or overwrite it (Azure's PUT):
    # refused in one line before any create call (issue 23.9).
    before = cloud.leftovers()
    again = cloud.up(cloud.recipe(run="true"))
    assert again.returncode == 2 and "already has its machines" in again.stderr, again.output
    assert len(again.stderr.strip().splitlines()) == 1 and cloud.leftovers() == before
    (cloud.home / "state.db").unlink(missing_ok=True)
    orphan, stranger = cloud.new_cluster("orphan"), cloud.new_cluster("stranger")
    planted = plant(cloud, orphan, stranger)
    try:
        check_gc(cloud, name, orphan, stranger, planted)
    finally:
        planted.remove_untagged()


def check_gc(cloud: FakeCloud, name: str, orphan: str, stranger: str, planted: Planted) -> None:
    assert planted.exists(planted.untagged) == set(planted.untagged)

    # Just launched: the launch's own liveness mark is fresh, so it is someone's live work (another
    # state of this owner), shown with its evidence and left alone (tests/e2e/test_gc_live_e2e.py: --yes).
    code, first = gc_json(cloud)
    (held,) = [leak for leak in first["live"] if leak["cluster"] == cloud.cluster and leak["kind"] == "instance"]
    assert held["live"] and held["evidence"].startswith("alive ") and cloud.cluster not in {
        leak["cluster"] for leak in first["leaks"] if leak["kind"] == "instance"}
    table = cloud.cli("gc", "--cloud", name)
    assert f"in use elsewhere, left alone: {name} {cloud.cluster}" in table.stdout, table.output
    cloud.age_marks(seconds_ago=3 * 3600)  # then nobody holds it for hours: a leak

    code, found = gc_json(cloud)
    assert code == 1, found
    leaks = {(leak["cluster"], leak["kind"]): leak for leak in found["leaks"]}
    (instance,) = leaks[(cloud.cluster, "instance")]["items"]
    assert leaks[(cloud.cluster, "instance")]["reason"] == "cluster not in state"
    # The instance at the catalog's on-demand price for where the plan put it (spot is never dearer).
    catalog_price = default_catalog().price(name, instance["region"], cloud.recipe_resources()["instance_type"])
    assert catalog_price is not None and instance["hourly_usd"] == pytest.approx(catalog_price)
    # What `up` made besides the instance (key pair, firewall, group): free, and listed.
    assert all(item["hourly_usd"] == 0.0 for item in leaks[(cloud.cluster, "resources")]["items"])
    shown = {(item["kind"], item["id"]): item["hourly_usd"] for item in leaks[(orphan, "resources")]["items"]}
    assert shown == pytest.approx(planted.tagged)
    # Every cloud's plant holds something billed (a volume, a disk, a public IP): the leak is not free.
    orphan_hourly = leaks[(orphan, "resources")]["hourly_usd"]
    assert orphan_hourly > 0 and orphan_hourly == pytest.approx(sum(planted.tagged.values()))
    listed = json.dumps(found)
    assert stranger not in listed and not any(ident in listed for ident in planted.untagged)
    everything = [item["hourly_usd"] for leak in found["leaks"] for item in leak["items"]]
    assert found["unknown_price"] == 0 and found["hourly_usd"] == pytest.approx(sum(everything))

    # The table says the same to a person: a cost per row and the total.
    table = cloud.cli("gc", "--cloud", name)
    assert table.returncode == 1, table.output
    row = next(line for line in table.stdout.splitlines() if instance["id"] in line)
    assert f"${catalog_price:.4f}" in row and "cluster not in state; last alive 3.0 h ago" in row
    assert re.search(rf"^leaks cost about \${found['hourly_usd']:.4f}/h$", table.stdout, re.MULTILINE), table.stdout

    removed = cloud.cli("gc", "--cloud", name, "--yes")
    assert removed.ok, removed.output
    assert f"{name}: terminated {instance['id']} ({cloud.cluster})" in removed.stdout
    assert planted.exists([ident for _, ident in planted.tagged]) == set()
    assert planted.exists(planted.untagged) == set(planted.untagged)

    after = cloud.cli("gc", "--cloud", name)
    assert after.ok and after.stdout.strip() == "nothing leaked", after.output
    code, empty = gc_json(cloud)
    assert code == 0 and empty["leaks"] == [] and empty["hourly_usd"] == 0
    assert [line for line in cloud.leftovers() if cloud.cluster in line or orphan in line] == []
