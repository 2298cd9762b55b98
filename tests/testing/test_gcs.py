"""The GCS fake answers as GCS's XML API reference says (list, get, head, put, delete, errors), its
JSON bucket IAM as the JSON API's reference says, and decides access by the bucket's policy for a
VM's service account (token from the metadata fake) while the kit's own key is the project owner.
Read through raw HTTP (the wire shapes) and through obstore (the client the nodes use)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from cloudtrain.testing.gcp import DEFAULT_SERVICE_ACCOUNT, PROJECT, GceServer
from cloudtrain.testing.gcs import GcsBuckets, condition_allows
from cloudtrain.testing.metadata import MetadataServer

from tests.lazy import Lazy, requires

pytestmark = requires("google.cloud.compute_v1", "obstore")
compute_v1 = Lazy("google.cloud.compute_v1")
obstore = Lazy("obstore")
ZONE = "us-central1-a"
NS = "{http://doc.s3.amazonaws.com/2006-03-01}"


def owner_headers(gce: GceServer) -> dict[str, str]:
    """The kit's own credentials (google-auth's real service-account JWT), as a user's."""
    from google.auth.transport.requests import Request
    from google.oauth2 import service_account

    creds = service_account.Credentials.from_service_account_file(
        str(gce.key_file), scopes=["https://www.googleapis.com/auth/devstorage.full_control"])
    creds.refresh(Request())
    return {"Authorization": f"Bearer {creds.token}"}


@pytest.fixture
def vm_token(gce_server: GceServer, metadata_server: MetadataServer) -> Iterator[str]:
    """A running VM of the fake GCE with the project's default service account and the
    devstorage.read_write scope; the metadata fake's token stands for it."""
    gce_server.accept_metadata_token(metadata_server.token_for("gce"))
    body = {"name": "vm", "machine_type": f"zones/{ZONE}/machineTypes/e2-standard-2",
            "disks": [{"boot": True, "auto_delete": True, "initialize_params": {
                "source_image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
            "network_interfaces": [{"network": "global/networks/default"}],
            "service_accounts": [{"email": "default", "scopes": [
                "https://www.googleapis.com/auth/devstorage.read_write"]}]}
    instances = gce_server.client("instances")
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(body))
    gce_server.client("zone_operations").wait(project=PROJECT, zone=ZONE, operation=op.name)
    yield metadata_server.token_for("gce")


def grant(gcs: GcsBuckets, bucket: str, role: str, member: str, condition: dict | None = None) -> requests.Response:
    url = f"{gcs.server.url}/storage/v1/b/{bucket}/iam"
    headers = owner_headers(gcs.gce)
    policy = requests.get(url, headers=headers, params={"optionsRequestedPolicyVersion": 3}, timeout=10).json()
    binding: dict[str, Any] = {"role": role, "members": [member]}
    if condition:
        binding["condition"] = condition
    policy["bindings"].append(binding)
    policy["version"] = 3
    return requests.put(url, headers=headers, json=policy, timeout=10)


def test_listing_is_gcs_list_bucket_result_with_pages_prefixes_and_continuation(gcs_buckets: GcsBuckets) -> None:
    gcs = gcs_buckets
    gcs.create("data")
    for i in range(5):
        gcs.server.put("data", f"train/{i}.bin", bytes([i]) * (i + 1))
    gcs.server.put("data", "train/sub/x.bin", b"x")
    gcs.server.put("data", "other.txt", b"o")
    headers = owner_headers(gcs.gce)
    first = requests.get(f"{gcs.server.url}/data", params={"list-type": "2", "prefix": "train/", "max-keys": "3"},
                         headers=headers, timeout=10)
    assert first.status_code == 200 and first.headers["Content-Type"].startswith("application/xml")
    root = ET.fromstring(first.content)
    assert root.tag == f"{NS}ListBucketResult"
    assert root.findtext(f"{NS}Name") == "data" and root.findtext(f"{NS}Prefix") == "train/"
    assert root.findtext(f"{NS}KeyCount") == "3" and root.findtext(f"{NS}IsTruncated") == "true"
    contents = root.findall(f"{NS}Contents")
    assert [c.findtext(f"{NS}Key") for c in contents] == ["train/0.bin", "train/1.bin", "train/2.bin"]
    assert contents[1].findtext(f"{NS}ETag") == f'"{hashlib.md5(bytes([1, 1])).hexdigest()}"'
    assert contents[1].findtext(f"{NS}Size") == "2" and contents[1].findtext(f"{NS}StorageClass") == "STANDARD"
    assert contents[1].findtext(f"{NS}LastModified").endswith("Z")
    token = root.findtext(f"{NS}NextContinuationToken")
    rest = ET.fromstring(requests.get(f"{gcs.server.url}/data", headers=headers, timeout=10, params={
        "list-type": "2", "prefix": "train/", "continuation-token": token, "delimiter": "/"}).content)
    assert [c.findtext(f"{NS}Key") for c in rest.findall(f"{NS}Contents")] == ["train/3.bin", "train/4.bin"]
    assert [p.findtext(f"{NS}Prefix") for p in rest.findall(f"{NS}CommonPrefixes")] == ["train/sub/"]
    assert rest.findtext(f"{NS}IsTruncated") == "false" and rest.find(f"{NS}NextContinuationToken") is None


def test_objects_get_head_put_delete_with_etag_hash_range_and_errors(gcs_buckets: GcsBuckets) -> None:
    gcs = gcs_buckets
    gcs.create("data")
    headers = owner_headers(gcs.gce)
    url = f"{gcs.server.url}/data/a/b.txt"
    put = requests.put(url, data=b"hello world", headers=headers, timeout=10)
    md5 = hashlib.md5(b"hello world").hexdigest()
    assert put.status_code == 200 and put.headers["ETag"] == f'"{md5}"'
    assert f"md5={base64.b64encode(bytes.fromhex(md5)).decode()}" in put.headers["x-goog-hash"]
    got = requests.get(url, headers=headers, timeout=10)
    assert got.content == b"hello world" and got.headers["x-goog-generation"] == put.headers["x-goog-generation"]
    assert got.headers["Last-Modified"].endswith("GMT")
    part = requests.get(url, headers={**headers, "Range": "bytes=6-"}, timeout=10)
    assert part.status_code == 206 and part.content == b"world" and part.headers["Content-Range"] == "bytes 6-10/11"
    head = requests.head(url, headers=headers, timeout=10)
    assert head.status_code == 200 and head.headers["Content-Length"] == "11" and head.content == b""
    missing = requests.get(f"{gcs.server.url}/data/nope", headers=headers, timeout=10)
    assert missing.status_code == 404
    assert ET.fromstring(missing.content).findtext("Code") == "NoSuchKey"
    nobucket = requests.get(f"{gcs.server.url}/nobucket", params={"list-type": "2"}, headers=headers, timeout=10)
    assert nobucket.status_code == 404 and ET.fromstring(nobucket.content).findtext("Code") == "NoSuchBucket"
    assert requests.delete(url, headers=headers, timeout=10).status_code == 204
    assert requests.get(url, headers=headers, timeout=10).status_code == 404
    forged = requests.get(url, headers={"Authorization": "Bearer ya29.nobody-issued-this"}, timeout=10)
    assert forged.status_code == 401 and ET.fromstring(forged.content).findtext("Code") == "AuthenticationRequired"
    anonymous = requests.get(f"{gcs.server.url}/data", params={"list-type": "2"}, timeout=10)
    error = ET.fromstring(anonymous.content)
    assert anonymous.status_code == 403 and error.findtext("Code") == "AccessDenied"
    assert error.findtext("Details").startswith("Anonymous caller does not have storage.objects.list access")


def test_a_vms_service_account_gets_exactly_what_the_bucket_policy_grants(
        gcs_buckets: GcsBuckets, vm_token: str) -> None:
    gcs = gcs_buckets
    gcs.create("data")
    gcs.create("results")
    gcs.server.put("data", "train/x.bin", b"x" * 10)
    vm = {"Authorization": f"Bearer {vm_token}"}
    refused = requests.get(f"{gcs.server.url}/data", params={"list-type": "2"}, headers=vm, timeout=10)
    assert refused.status_code == 403
    assert ET.fromstring(refused.content).findtext("Details") == (
        f"{DEFAULT_SERVICE_ACCOUNT} does not have storage.objects.list access to the Google Cloud Storage bucket. "
        "Permission 'storage.objects.list' denied on resource (or it may not exist).")
    member = f"serviceAccount:{DEFAULT_SERVICE_ACCOUNT}"
    assert grant(gcs, "data", "roles/storage.objectViewer", member).status_code == 200
    assert requests.get(f"{gcs.server.url}/data", params={"list-type": "2"}, headers=vm, timeout=10).ok
    assert requests.get(f"{gcs.server.url}/data/train/x.bin", headers=vm, timeout=10).content == b"x" * 10
    assert requests.put(f"{gcs.server.url}/data/train/y.bin", data=b"y", headers=vm, timeout=10).status_code == 403
    # objectCreator under a prefix (a condition): new objects there, nothing elsewhere, no overwrite.
    condition = {"title": "cloudtrain-c1", "expression":
                 'resource.name.startsWith("projects/_/buckets/results/objects/runs/")'}
    assert grant(gcs, "results", "roles/storage.objectCreator", member, condition).status_code == 200
    assert requests.put(f"{gcs.server.url}/results/runs/r1/a.txt", data=b"a", headers=vm, timeout=10).ok
    assert requests.put(f"{gcs.server.url}/results/runs/r1/a.txt", data=b"b", headers=vm, timeout=10).status_code == 403
    assert requests.put(f"{gcs.server.url}/results/elsewhere.txt", data=b"a", headers=vm, timeout=10).status_code == 403
    # The VM may not read or change bucket IAM (JSON API, 403 forbidden).
    iam = requests.get(f"{gcs.server.url}/storage/v1/b/data/iam", headers=vm, timeout=10)
    assert iam.status_code == 403 and iam.json()["error"]["errors"][0]["reason"] == "forbidden"
    assert ("serviceAccount:" + DEFAULT_SERVICE_ACCOUNT, "storage.objects.create",
            "projects/_/buckets/results/objects/elsewhere.txt") in [
        (d.principal, d.permission, d.resource) for d in gcs.server.denied()]


def test_iam_policy_is_versioned_by_etag_and_conditions_need_uniform_access(gcs_buckets: GcsBuckets) -> None:
    gcs = gcs_buckets
    gcs.create("uni")
    gcs.create("fine", uniform=False)
    headers = owner_headers(gcs.gce)
    url = f"{gcs.server.url}/storage/v1/b/uni/iam"
    policy = requests.get(url, headers=headers, timeout=10).json()
    assert policy["kind"] == "storage#policy" and policy["resourceId"] == "projects/_/buckets/uni"
    assert {"role": "roles/storage.legacyBucketOwner", "members": [f"projectEditor:{PROJECT}",
                                                                   f"projectOwner:{PROJECT}"]} in policy["bindings"]
    stale = dict(policy, etag="CAA=")
    assert requests.put(url, headers=headers, json=stale, timeout=10).status_code == 412
    condition = {"title": "t", "expression": 'resource.name == "projects/_/buckets/fine"'}
    refused = grant(gcs, "fine", "roles/storage.objectViewer", "serviceAccount:a@b", condition)
    assert refused.status_code == 400 and "uniform bucket-level access" in refused.json()["error"]["message"]
    assert grant(gcs, "uni", "roles/storage.objectViewer", "serviceAccount:a@b", condition).status_code == 200
    assert requests.get(url, headers=headers, timeout=10).status_code == 400  # version 3 must be asked for
    listed = requests.get(f"{gcs.server.url}/storage/v1/b", params={"project": PROJECT}, headers=headers, timeout=10)
    assert [b["name"] for b in listed.json()["items"]] == ["fine", "uni"]


def test_condition_subset() -> None:
    expr = 'resource.name.startsWith("projects/_/buckets/b/objects/p/") || resource.name == "projects/_/buckets/b"'
    assert condition_allows(expr, "projects/_/buckets/b")
    assert condition_allows(expr, "projects/_/buckets/b/objects/p/x")
    assert not condition_allows(expr, "projects/_/buckets/b/objects/q")
    with pytest.raises(ValueError):
        condition_allows("request.time < timestamp('2020-01-01T00:00:00Z')", "x")


def test_obstore_reads_and_writes_with_the_vms_metadata_token(
        gcs_buckets: GcsBuckets, vm_token: str, metadata_server: MetadataServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' client, unchanged: object_store's GCE instance credentials from the metadata
    fake (GCE_METADATA_HOST), the XML API at `base_url`; 2,500 objects list across pages."""
    from obstore.store import GCSStore

    gcs = gcs_buckets
    gcs.create("data")
    for i in range(2500):
        gcs.server.put("data", f"p/f{i:05d}", b"%d" % i)
    assert grant(gcs, "data", "roles/storage.objectAdmin", f"serviceAccount:{DEFAULT_SERVICE_ACCOUNT}").ok
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", metadata_server.url.removeprefix("http://"))
    store = GCSStore("data", config={"base_url": gcs.server.url})

    async def go() -> tuple[int, bytes, dict]:
        listed = [m async for batch in obstore.list(store, prefix="p", chunk_size=1000) for m in batch]
        body = await (await obstore.get_async(store, "p/f00007")).bytes_async()
        put = await obstore.put_async(store, "out/r.txt", b"result")
        return len(listed), bytes(body), put

    count, body, put = asyncio.run(go())
    assert count == 2500 and body == b"7"
    assert put["e_tag"] == f'"{hashlib.md5(b"result").hexdigest()}"'
    assert gcs.names("data")[-1] == "p/f02499" and "out/r.txt" in gcs.names("data")
    assert [r for r in metadata_server.seen("gce") if r.status == 200]
    assert os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") is None


def test_obstore_uploads_a_large_file_in_parts(gcs_buckets: GcsBuckets, tmp_path) -> None:  # noqa: ANN001
    """A file above obstore's multipart threshold goes up as an XML API multipart upload; the
    object's ETag is then GCS's `"<hash>-<parts>"`, not an MD5, and the bytes are whole."""
    from obstore.store import GCSStore

    gcs = gcs_buckets
    gcs.create("big")
    blob = os.urandom(1024) * (12 * 1024)  # 12 MiB
    path = tmp_path / "ckpt.bin"
    path.write_bytes(blob)
    store = GCSStore("big", config={"base_url": gcs.server.url, "application_credentials": str(gcs.gce.key_file)})

    async def go() -> dict:
        with open(path, "rb") as f:
            return await obstore.put_async(store, "ckpt/ckpt.bin", f)

    put = asyncio.run(go())
    stored = gcs.server.buckets["big"].objects["ckpt/ckpt.bin"]
    assert stored.data == blob and stored.etag.endswith('-3"') and put["e_tag"] == stored.etag
    assert gcs.server.uploads_in_progress() == 0
