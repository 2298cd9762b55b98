"""`cloudtrain gc` finds leaks by tag after local state is lost, and removes them with --yes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from cloudtrain.catalog import Catalog, Offer
from cloudtrain.cluster.gc import Pricer
from cloudtrain.cost import disk_hourly
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
    # A cloud the storage table lacks: no disk price, never $0.
    other = Pricer("elsewhere", catalog, priced=True)
    assert other.resource(ClusterResource("elsewhere", "c", "disk", "d", size_gb=10)).hourly_usd is None
    # Machines that are the user's own are not billed.
    assert Pricer("mine", catalog, priced=False).instance(inst(InstanceState.RUNNING)).hourly_usd == 0.0
