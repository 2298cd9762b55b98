"""templates/bucket_copy.py on a "node" with the EC2 identity: moto's S3 behind the authorizer,
role credentials from the instance metadata fake, the role made by cloudtrain's AWS provider."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import paths
from cloudtrain.buckets.grants import grants_for
from cloudtrain.testing.buckets import S3Buckets, s3_action

COPY = str(paths.templates_dir() / "bucket_copy.py")


@pytest.mark.parametrize("method, key, query, action", [
    ("GET", "", {"list-type": "2", "prefix": "a/"}, "ListBucket"),
    ("GET", "", {"location": ""}, "GetBucketLocation"),
    ("GET", "a/b", {}, "GetObject"),
    ("HEAD", "a/b", {}, "GetObject"),
    ("PUT", "a/b", {}, "PutObject"),
    ("POST", "a/b", {"uploads": ""}, "PutObject"),
    ("DELETE", "a/b", {"uploadId": "x"}, "AbortMultipartUpload"),
    ("DELETE", "a/b", {}, "DeleteObject"),
])
def test_s3_actions(method: str, key: str, query: dict, action: str) -> None:
    assert s3_action(method, key, query) == action


@pytest.fixture
def node(s3_buckets: S3Buckets, tmp_path: Path) -> dict:
    """A running instance with cloudtrain's role for read on data-bkt/train and write on out-bkt/runs."""
    from cloudtrain.providers.aws import AwsProvider
    from cloudtrain.providers.aws.identity import ensure_node_role
    from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER

    cluster = f"nc-{tmp_path.name[-12:].lower().replace('_', '-')}"
    for bucket in ("data-bkt", "out-bkt", "other-bkt"):
        s3_buckets.create(bucket)
    s3_buckets.fill("data-bkt", "train", files=40, total_bytes=4_000_000)
    s3_buckets.client().put_object(Bucket="other-bkt", Key="x/secret.bin", Body=b"no")
    provider = AwsProvider("us-east-1", all_owners=True)
    grants = grants_for(["s3://data-bkt/train"], "s3://out-bkt/runs")
    profile = ensure_node_role(provider.api, "us-east-1", cluster, {TAG_CLUSTER: cluster, TAG_OWNER: "t"}, grants)
    ec2 = s3_buckets.server.client("ec2")
    image = s3_buckets.server.ami()
    # As cloudtrain launches it: waiting out the new profile's propagation to EC2 (the fake models it).
    from cloudtrain.providers.aws.identity import with_new_profile

    instance = with_new_profile(provider.api, "us-east-1", profile, "run_instances", ImageId=image, MinCount=1,
                                MaxCount=1, InstanceType="t3.micro",
                                IamInstanceProfile={"Name": profile})["Instances"][0]["InstanceId"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CLOUDTRAIN_BUCKET_IDENTITY": "instance",
           "CLOUDTRAIN_BUCKET_WHO": "role " + profile, "CLOUDTRAIN_S3_ENDPOINT": s3_buckets.server.url,
           # The user's keys are in the environment: the node's copy must not use them.
           "AWS_ACCESS_KEY_ID": "AKIACLOUDTRAINTEST00", "AWS_SECRET_ACCESS_KEY": "x",
           **s3_buckets.cli_env()}
    try:
        yield {"env": env, "dir": tmp_path}
    finally:
        ec2.terminate_instances(InstanceIds=[instance])
        provider.release_resources(cluster)


def copy(node: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, COPY, *args], env=node["env"], capture_output=True, text=True, timeout=120)


def test_reads_its_bucket_with_the_role_incrementally(node: dict, s3_buckets: S3Buckets) -> None:
    dest, state = node["dir"] / "data", str(node["dir"] / "state.json")
    first = copy(node, "get", "s3://data-bkt/train", str(dest), "--state", state)
    assert first.returncode == 0, (first.stderr, s3_buckets.authorizer.denied())
    assert "copied 40 files (4.0 MB)" in first.stdout and "MD5 40" in first.stdout
    assert len(list(dest.rglob("*.bin"))) == 40
    assert s3_buckets.authorizer.decisions and all(key.startswith("ASIA") for key, *_ in s3_buckets.authorizer.decisions)
    assert any(r.kind == "ec2" and r.path.endswith("/cloudtrain-" + r.path.rsplit("cloudtrain-", 1)[-1])
               for r in s3_buckets.metadata.requests)
    s3_buckets.client().put_object(Bucket="data-bkt", Key="train/part-000/f00003.bin", Body=b"changed")
    second = copy(node, "get", "s3://data-bkt/train", str(dest), "--state", state)
    assert second.returncode == 0, second.stderr
    assert "copied 1 files" in second.stdout and "39 unchanged" in second.stdout
    assert (dest / "part-000" / "f00003.bin").read_bytes() == b"changed"
    assert json.loads(Path(state).read_text())["url"] == "s3://data-bkt/train"


@pytest.mark.parametrize("args, says", [
    (["get", "s3://other-bkt/x", "D", "--state", "S"], "access denied: s3://other-bkt refuses s3:ListBucket to role"),
    (["put", "s3://data-bkt/train/out", "--base", "B", "f.txt"], "access denied: s3://data-bkt refuses s3:PutObject"),
])
def test_access_denied_is_one_line(node: dict, args: list[str], says: str) -> None:
    base = node["dir"] / "B"
    base.mkdir()
    (base / "f.txt").write_text("result")
    args = [str(node["dir"] / a) if a in ("D", "S", "B") else a for a in args]
    result = copy(node, *args)
    assert result.returncode == 3, result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_uploads_where_the_role_may_write(node: dict, s3_buckets: S3Buckets) -> None:
    base = node["dir"] / "work"
    (base / "outputs").mkdir(parents=True)
    (base / "outputs" / "metrics.json").write_text("{}")
    result = copy(node, "put", "s3://out-bkt/runs/r1", "--base", str(base), "outputs")
    assert result.returncode == 0, result.stderr
    keys = [o["Key"] for o in s3_buckets.client().list_objects_v2(Bucket="out-bkt")["Contents"]]
    assert keys == ["runs/r1/outputs/metrics.json"]
