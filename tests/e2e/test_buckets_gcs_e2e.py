"""GCS bucket data and results through the real CLI on the fake GCP (docs/data.md).

Compute Engine is the kit's fake, the VM an sshd VM, GCS the kit's wire fake (testing/gcs.py,
XML objects and JSON bucket IAM). The VM's copy (obstore) gets its token only from the metadata
fake, which GCS takes as the service account the fake GCE recorded on the running VM; what that
account may do is what the bucket-level IAM bindings cloudtrain wrote from the recipe allow.
Nothing of cloudtrain is mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from cloudtrain.testing import sshd
from cloudtrain.testing.gcp import DEFAULT_SERVICE_ACCOUNT, GcpCloud
from cloudtrain.testing.gcs import OWNER, GcsBuckets
from tests.lazy import requires

pytestmark = requires("google.cloud.compute_v1", "obstore")

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# The copy's logic at scale, proven here once for every store (it is the same code on each):
# more objects than one listing page, 500 MB. The S3 and Blob e2e prove their identity and store
# with a small dataset.
FILES = 2000
TOTAL = 500 * 1000 * 1000  # bytes: >= 500 MB, random heads on zero bodies (GcsBuckets.fill)
MEMBER = f"serviceAccount:{DEFAULT_SERVICE_ACCOUNT}"


def bucket_recipe(cloud: GcpCloud, data: list[dict], **fields: object) -> Path:
    path = cloud.recipe(None, name=cloud.cluster, data=data, **fields)
    assert yaml.safe_load(path.read_text())["data"] == data
    return path


def ours(gcs: GcsBuckets, bucket: str, cluster: str) -> list[dict]:
    return [b for b in gcs.bindings(bucket) if (b.get("condition") or {}).get("title") == f"cloudtrain-{cluster}"]


def test_gcs_dataset_copied_incrementally_results_uploaded_and_access_denied_in_one_line(
        gcp_cloud: GcpCloud, gcs_buckets: GcsBuckets) -> None:
    cloud, gcs = gcp_cloud, gcs_buckets
    cloud.env.update({**gcs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    suffix = cloud.cluster[-8:].lower().strip("-")
    data_bucket, out_bucket, other_bucket = (gcs.create(f"{kind}-{suffix}") for kind in ("ds", "res", "other"))
    sizes = gcs.fill(data_bucket, "train", files=FILES, total_bytes=TOTAL)
    gcs.server.put(data_bucket, "elsewhere/secret.bin", b"outside the prefix")
    gcs.server.put(other_bucket, "x/a.bin", b"not yours")
    recipe = bucket_recipe(cloud, [{"source": f"gs://{data_bucket}/train", "target": "data"}],
                           run="mkdir -p out && find data -type f | wc -l > out/count.txt", results=["out"],
                           upload=f"gs://{out_bucket}/runs")

    first = cloud.run(recipe, "--keep")
    assert first.ok, first.output[-4000:]
    assert f"with the VM's service account {DEFAULT_SERVICE_ACCOUNT}" in first.output
    assert f"{FILES} objects, 0 unchanged; copying {FILES} ({TOTAL / 1e6:.1f} MB)" in first.output
    assert f"copied {FILES} files ({TOTAL / 1e6:.1f} MB)" in first.output and f"MD5 {FILES}" in first.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)
    record = first.run_json
    assert record["upload"] == f"gs://{out_bucket}/runs/{record['run_id']}"
    assert gcs.names(out_bucket) == [f"runs/{record['run_id']}/out/count.txt"]
    # The VM runs as the account, with a storage scope; its bindings are exactly the recipe's.
    ((_, inst),) = cloud.instances()
    assert inst["serviceAccounts"][0]["email"] == DEFAULT_SERVICE_ACCOUNT
    assert inst["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/devstorage.read_write"]
    (reader,) = ours(gcs, data_bucket, cloud.cluster)
    assert reader["role"] == "roles/storage.objectViewer" and reader["members"] == [MEMBER]
    assert f'resource.name.startsWith("projects/_/buckets/{data_bucket}/objects/train/")' in \
        reader["condition"]["expression"]
    (writer,) = ours(gcs, out_bucket, cloud.cluster)
    assert writer["role"] == "roles/storage.objectCreator"
    assert ours(gcs, other_bucket, cloud.cluster) == []
    # Every object request came with the VM's token (from the metadata fake), never the user's.
    decisions = [d for d in gcs.server.decisions if d.permission.startswith("storage.objects.")]
    assert decisions and {d.principal for d in decisions} == {MEMBER} and all(d.allowed for d in decisions)
    assert [r for r in cloud.metadata.seen("gce") if r.status == 200]
    # Home from the bucket on request, with the user's own credentials.
    (first.run_dir / "out" / "count.txt").unlink()
    fetched = cloud.cli("collect", cloud.cluster, record["run_id"], "--from-bucket")
    assert fetched.ok, fetched.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)
    assert [d for d in gcs.server.decisions if d.principal == OWNER]

    changed = sorted(sizes)[:3]
    for key in changed:
        gcs.server.put(data_bucket, key, b"new " + key.encode())
    second = cloud.run(recipe, "--keep")
    assert second.ok, second.output[-4000:]
    assert f"{FILES} objects, {FILES - 3} unchanged; copying 3" in second.output

    # The same cluster, a recipe naming another bucket: the bindings move to exactly that one.
    other = bucket_recipe(cloud, [{"source": f"gs://{other_bucket}/x", "target": "data2"}], run="true")
    moved = cloud.run(other, "--keep")
    assert moved.ok, moved.output[-4000:]
    assert "copied 1 files" in moved.output
    assert ours(gcs, data_bucket, cloud.cluster) == [] and ours(gcs, out_bucket, cloud.cluster) == []
    assert [b["role"] for b in ours(gcs, other_bucket, cloud.cluster)] == ["roles/storage.objectViewer"]
    ((_, inst),) = cloud.instances()  # the VM's metadata names where its bindings are, for `down`
    assert {"key": "cloudtrain-buckets", "value": other_bucket} in inst["metadata"]["items"]

    # An IAM deny policy on the bucket (it wins over the binding): GCS refuses, one line says so.
    gcs.deny(other_bucket)
    denied = cloud.run(other, "--keep")
    assert not denied.ok
    lines = [line for line in denied.output.splitlines() if "access denied" in line]
    assert lines and (f"access denied: gs://{other_bucket} refuses storage.objects.list to the VM's service account "
                      f"{DEFAULT_SERVICE_ACCOUNT}") in lines[0], denied.output[-3000:]
    assert [d for d in gcs.server.denied() if d.permission == "storage.objects.list" and d.principal == MEMBER]

    down = cloud.down(cloud.cluster)
    assert down.ok, down.output
    for bucket in (data_bucket, out_bucket, other_bucket):
        assert ours(gcs, bucket, cloud.cluster) == [], bucket
    assert cloud.leftovers() == []


def test_gc_finds_and_removes_bucket_bindings_of_clusters_not_in_state(
        gcp_cloud: GcpCloud, gcs_buckets: GcsBuckets) -> None:
    """State lost: `gc` finds the cluster's binding by its condition (title and description, the
    bindings' tags) beside its VM, and an orphan's binding (a launch killed before its VM); `--yes`
    removes exactly those; a look-alike binding that claims no owner is never touched."""
    import json

    cloud, gcs = gcp_cloud, gcs_buckets
    cloud.env.update({**gcs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    bucket = gcs.create(f"gc-{cloud.cluster[-8:].lower().strip('-')}")
    gcs.server.put(bucket, "d/a.bin", b"a")
    up = cloud.up(bucket_recipe(cloud, [{"source": f"gs://{bucket}/d", "target": "data"}], run="true"))
    assert up.ok, up.output[-3000:]
    (mine,) = ours(gcs, bucket, cloud.cluster)
    orphan, stranger = cloud.new_cluster("orphan"), cloud.new_cluster("stranger")
    planted = json.loads(json.dumps(mine).replace(cloud.cluster, orphan))
    look_alike = {**mine, "condition": {**mine["condition"], "title": f"cloudtrain-{stranger}",
                                        "description": "made by hand"}}
    with gcs.server.lock:
        gcs.server.buckets[bucket].bindings += [planted, look_alike]
    for file in ("state.db", "state.db-wal", "state.db-shm"):
        (cloud.home / file).unlink(missing_ok=True)
    cloud.age_marks()  # and nobody has held the cluster for hours: its machines are a leak now

    listed = cloud.cli("gc", "--cloud", "gcp", "--json")
    assert listed.returncode == 1, listed.output
    leaks = {(leak["cluster"], leak["kind"]): leak for leak in json.loads(listed.stdout)["leaks"]}
    bindings = {(c, i["id"], i["hourly_usd"]) for (c, _), leak in leaks.items() for i in leak["items"]
                if i["kind"] == "bucket-binding"}
    assert bindings == {(cloud.cluster, bucket, 0.0), (orphan, bucket, 0.0)}
    assert stranger not in listed.stdout

    removed = cloud.cli("gc", "--cloud", "gcp", "--yes")
    assert removed.ok, removed.output
    assert ours(gcs, bucket, cloud.cluster) == [] and ours(gcs, bucket, orphan) == []
    assert look_alike in gcs.bindings(bucket)
    after = cloud.cli("gc", "--cloud", "gcp")
    assert after.ok and after.stdout.strip() == "nothing leaked", after.output
