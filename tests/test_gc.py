"""`cloudtrain gc` finds leaks by tag after local state is lost, and removes them with --yes."""

from __future__ import annotations

import uuid
from pathlib import Path

from cloudtrain.providers.aws import AwsProvider
from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER, InstanceSpec, owner_id
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
                                                       monkeypatch) -> None:  # noqa: ANN001
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
    assert any(leaked in row and "instance" in row for row in rows)
    assert any(orphan in row and "resources" in row for row in rows)

    removed = cloudtrain("gc", "--cloud", "aws", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    live = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [leaked]},
                                           {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert not live["Reservations"]
    keys = ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [leaked, orphan]}])["KeyPairs"]
    assert keys == []
    again = cloudtrain("gc", "--cloud", "aws")
    assert leaked not in again.stdout and orphan not in again.stdout
