"""Bucket data and results through the real CLI, against wire-level stores (docs/data.md).

AWS: EC2, IAM, STS and S3 are moto's server; the instance is an sshd VM. The node gets its
credentials only from the instance metadata fake, which hands out the credentials of the role in
the instance profile cloudtrain attached (STS AssumeRole on moto); every S3 request signed with
them goes through the test kit's S3Authorizer, so the role's policy, made by cloudtrain from the
recipe, is what decides. Nothing of cloudtrain is mocked.

GCS: tests/e2e/test_buckets_gcs_e2e.py. Azure Blob: tests/e2e/test_buckets_azure_e2e.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.buckets import S3Buckets
from cloudtrain.testing import sshd

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# What is S3's here is the node's identity (the instance profile's role, its policy made from the
# recipe) and S3's own listing and ETags: a small dataset proves them. The copy's logic is the same
# for every store, proven at scale once (2,000 objects, more than a listing page, 500 MB):
# tests/e2e/test_buckets_gcs_e2e.py
# (test_gcs_dataset_copied_incrementally_results_uploaded_and_access_denied_in_one_line).
FILES = 40
TOTAL = 4 * 1000 * 1000  # bytes: sparse bodies behind random heads (S3Buckets.fill)


def bucket_recipe(cloud: AwsCloud, name: str, data: list[dict], **fields: object) -> Path:
    """The kit's recipe, with bucket data sources (which the kit keeps as written)."""
    path = cloud.recipe(None, name=name, data=data, **fields)
    assert yaml.safe_load(path.read_text())["data"] == data
    return path


def test_bucket_dataset_copied_incrementally_results_uploaded_and_access_denied_in_one_line(
        aws_cloud: AwsCloud, s3_buckets: S3Buckets) -> None:
    cloud, s3 = aws_cloud, s3_buckets
    cloud.env.update(s3.cli_env())
    suffix = cloud.cluster[-8:].lower().strip("-")
    data_bucket, out_bucket, other_bucket = (s3.create(f"{kind}-{suffix}") for kind in ("ds", "res", "other"))
    sizes = s3.fill(data_bucket, "train", files=FILES, total_bytes=TOTAL)
    s3.client().put_object(Bucket=other_bucket, Key="x/a.bin", Body=b"not yours")
    recipe = bucket_recipe(
        cloud, cloud.cluster, [{"source": f"s3://{data_bucket}/train", "target": "data"}],
        run="mkdir -p out && find data -type f | wc -l > out/count.txt", results=["out"],
        upload=f"s3://{out_bucket}/runs")

    first = cloud.run(recipe, "--keep")
    assert first.ok, first.output[-4000:]
    role = f"cloudtrain-{cloud.cluster}"
    assert f"with the instance's IAM role {role}" in first.output
    assert f"{FILES} objects, 0 unchanged; copying {FILES} ({TOTAL / 1e6:.1f} MB)" in first.output
    assert f"copied {FILES} files ({TOTAL / 1e6:.1f} MB)" in first.output and f"MD5 {FILES}" in first.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)
    record = first.run_json
    assert record["upload"] == f"s3://{out_bucket}/runs/{record['run_id']}"
    uploaded = s3.client().list_objects_v2(Bucket=out_bucket)["Contents"]
    assert [o["Key"] for o in uploaded] == [f"runs/{record['run_id']}/out/count.txt"]
    # Home from the bucket on request, with the user's own credentials (the node's are the node's).
    (first.run_dir / "out" / "count.txt").unlink()
    fetched = cloud.cli("collect", cloud.cluster, record["run_id"], "--from-bucket")
    assert fetched.ok, fetched.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)
    # Only the role's temporary credentials reached S3, all allowed, all from the metadata fake.
    decisions = s3.authorizer.decisions
    assert decisions and all(key.startswith("ASIA") and ok for key, _, _, ok, _ in decisions)
    assert [r.path for r in s3.metadata.requests if r.kind == "ec2" and r.status == 200 and role in r.path]

    changed = sorted(sizes)[:3]
    for key in changed:
        s3.client().put_object(Bucket=data_bucket, Key=key, Body=b"new " + key.encode())
    second = cloud.run(recipe, "--keep")
    assert second.ok, second.output[-4000:]
    assert f"{FILES} objects, {FILES - 3} unchanged; copying 3" in second.output

    # The same cluster, a recipe naming another bucket: its role now allows exactly that one.
    other = bucket_recipe(cloud, cloud.cluster, [{"source": f"s3://{other_bucket}/x", "target": "data2"}],
                          run="true")
    moved = cloud.run(other, "--keep")
    assert moved.ok, moved.output[-4000:]
    assert "copied 1 files" in moved.output
    policy = s3.server.client("iam").get_role_policy(RoleName=role, PolicyName="cloudtrain-buckets")["PolicyDocument"]
    named = json.dumps(policy)
    assert other_bucket in named and data_bucket not in named and out_bucket not in named

    s3.deny(other_bucket)  # a bucket policy that refuses the role: the store says no
    denied = cloud.run(other, "--keep")
    assert not denied.ok
    lines = [line for line in denied.output.splitlines() if "access denied" in line]
    assert lines and f"access denied: s3://{other_bucket} refuses s3:ListBucket to the instance's IAM role {role}" \
        in lines[0]
    assert ("s3:ListBucket", f"arn:aws:s3:::{other_bucket}", "AccessDenied") in s3.authorizer.denied()

    down = cloud.down(cloud.cluster)
    assert down.ok, down.output
    roles = s3.server.client("iam").list_roles(PathPrefix="/cloudtrain/")["Roles"]
    assert role not in [r["RoleName"] for r in roles]
    assert cloud.leftovers() == []


def test_local_node_uses_the_configured_credentials_and_says_so(local_cloud, s3_buckets: S3Buckets) -> None:  # noqa: ANN001
    """`cloud: local` has no machine identity: the copy uses the store credentials configured where
    it runs (here the test's AWS_* keys, a user's), and the run says so."""
    s3 = s3_buckets
    bucket = s3.create(f"loc-{local_cloud.cluster[-8:].lower().strip('-')}")
    s3.fill(bucket, "d", files=20, total_bytes=200_000)
    recipe = bucket_recipe(local_cloud, local_cloud.cluster, [{"source": f"s3://{bucket}/d", "target": "data"}],
                           run="ls data/part-000 | wc -l")
    up = local_cloud.up(recipe)  # `up` copies too, so `exec` sees the data
    assert up.ok, up.output[-3000:]
    assert "with the store credentials configured on the node (ssh and local nodes have no cloud identity)" \
        in up.output
    assert "copied 20 files" in up.output
    result = local_cloud.run(recipe)
    assert result.ok, result.output[-3000:]
    assert "20 objects, 20 unchanged; copying 0" in result.output
    nothing = local_cloud.cli("collect", local_cloud.cluster, "--from-bucket")
    assert nothing.returncode == 2 and "uploaded nothing: its recipe has no upload:" in nothing.stderr
    assert len(nothing.stderr.strip().splitlines()) == 1, nothing.stderr
    assert s3.authorizer.decisions == []  # long-term user keys: no node identity was involved
