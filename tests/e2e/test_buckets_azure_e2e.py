"""Azure Blob data and results through the real CLI, against a wire-level Blob store (docs/data.md).

ARM is the kit's fake (VMs, managed identities, role assignments); the VMs are sshd VMs; Blob
Storage is Azurite behind the kit's RBAC front (cloudtrain/testing/blob.py), which lets a
managed identity's token do only what its Storage Blob Data role assignments in the fake ARM
allow. The node's token comes only from the fake IMDS (the copy drops every AZURE_* variable of
the test's environment, which holds the service principal). Nothing of cloudtrain is mocked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from cloudtrain.testing import sshd
from cloudtrain.providers.azure.build import vm_principals
from cloudtrain.testing.azure import AzureCloud
from cloudtrain.testing.blob import AzureBlobs

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# What is Azure's here is the node's identity (the cluster's managed identity, its container roles)
# and Blob Storage's own listing and ETags: a small dataset proves them. The copy's logic is the same
# for every store, proven at scale once (2,000 objects, more than a listing page, 500 MB):
# tests/e2e/test_buckets_gcs_e2e.py
# (test_gcs_dataset_copied_incrementally_results_uploaded_and_access_denied_in_one_line).
FILES = 40
TOTAL = 4 * 1000 * 1000  # bytes: sparse bodies behind random heads (AzureBlobs.fill)
READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"


def bucket_recipe(cloud: AzureCloud, name: str, data: list[dict], **fields: object) -> Path:
    path = cloud.recipe(None, name=name, data=data, **fields)
    assert yaml.safe_load(path.read_text())["data"] == data
    return path


def container_roles(cloud: AzureCloud, blobs: AzureBlobs) -> dict[str, tuple[str, str]]:
    """Role assignments on the account's containers: container -> (role GUID, principal)."""
    listed = cloud.client("authorization").role_assignments.list_for_subscription()
    found = {}
    for item in listed:
        if item.scope.lower().startswith(f"{blobs.account_id}/blobServices/default/containers/".lower()):
            found[item.scope.rsplit("/", 1)[-1]] = (item.role_definition_id.rsplit("/", 1)[-1], item.principal_id)
    return found


def test_blob_dataset_copied_incrementally_results_uploaded_and_access_denied_in_one_line(
        azure_cloud: AzureCloud, azure_blobs: AzureBlobs) -> None:
    cloud, blobs = azure_cloud, azure_blobs
    cloud.env.update({**blobs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    data, out, other = (blobs.create(name) for name in ("dataset", "results", "other"))
    sizes = blobs.fill(data, "train", files=FILES, total_bytes=TOTAL)
    blobs.put(other, "x/a.bin", b"not yours")
    account = blobs.account
    recipe = bucket_recipe(
        cloud, cloud.cluster, [{"source": f"az://{account}/{data}/train", "target": "data"}],
        run="mkdir -p out && find data -type f | wc -l > out/count.txt", results=["out"],
        upload=f"az://{account}/{out}/runs")

    first = cloud.run(recipe, "--keep")
    assert first.ok, first.output[-4000:]
    assert "with the VM's managed identity (the cluster's, user-assigned; no user credentials on the VM)" in first.output
    assert f"{FILES} objects, 0 unchanged; copying {FILES} ({TOTAL / 1e6:.1f} MB)" in first.output
    assert f"copied {FILES} files ({TOTAL / 1e6:.1f} MB)" in first.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)
    record = first.run_json
    assert record["upload"] == f"az://{account}/{out}/runs/{record['run_id']}"
    assert blobs.keys(out) == [f"runs/{record['run_id']}/out/count.txt"]
    # The VM's identity holds exactly: Reader on the data container, Contributor on the upload's.
    (vm,) = cloud.client("compute").virtual_machines.list(f"cloudtrain-{cloud.cluster}-eastus")
    (principal,) = vm_principals(vm)
    assert container_roles(cloud, blobs) == {data: (READER, principal), out: (CONTRIBUTOR, principal)}
    # Only managed-identity tokens from the fake IMDS reached the store for the node: refused only
    # while the new roles propagated (FakeArm.rbac_propagation_s), allowed from then on.
    decisions = blobs.front.decisions
    allowed_from = next(i for i, (_, _, ok) in enumerate(decisions) if ok)
    assert all(ok and who == principal for who, _, ok in decisions[allowed_from:])
    assert all(call.operation == "read" and call.container == data for _, call, _ in decisions[:allowed_from])
    assert {r.query.get("resource") for r in cloud.metadata.seen("imds") if r.status == 200} >= {
        "https://storage.azure.com"}
    # Home from the bucket on request, with the user's own credentials (the account key).
    cloud.env.update(blobs.user_env())
    (first.run_dir / "out" / "count.txt").unlink()
    fetched = cloud.cli("collect", cloud.cluster, record["run_id"], "--from-bucket")
    assert fetched.ok, fetched.output
    assert (first.run_dir / "out" / "count.txt").read_text().strip() == str(FILES)

    changed = sorted(sizes)[:3]
    for key in changed:
        blobs.put(data, key, b"new " + key.encode())
    second = cloud.run(recipe, "--keep")
    assert second.ok, second.output[-4000:]
    assert f"{FILES} objects, {FILES - 3} unchanged; copying 3" in second.output

    # `up` of the kept cluster with a recipe naming a container its identity has no role on (`up`
    # keeps the roles the cluster was made with; `run` gives the recipe's): refused by the store,
    # said in one line.
    other_recipe = bucket_recipe(cloud, cloud.cluster, [{"source": f"az://{account}/{other}/x", "target": "d2"}],
                                 run="true")
    denied = cloud.up(other_recipe)
    assert not denied.ok
    lines = [line for line in denied.output.splitlines() if "access denied" in line]
    assert len(lines) == 1, denied.output[-3000:]
    assert (f"access denied: az://{account}/{other} refuses Microsoft.Storage/storageAccounts/blobServices/"
            "containers/blobs/read to the VM's managed identity (the cluster's, user-assigned; no user credentials on the VM) "
            "(AuthorizationPermissionMismatch)") in lines[0]
    # A first copy of a container retries while a new role may still be propagating (Azure RBAC),
    # then says the denial once.
    assert "the store does not let this node in yet" in denied.output
    assert "still denied after" in lines[0]
    # (the first run's data container was refused only while its new role propagated)
    assert {(c.container, c.operation) for c in blobs.front.denied()} <= {(other, "read"), (data, "read")}
    assert (other, "read") in {(c.container, c.operation) for c in blobs.front.denied()}
    # A run gives the cluster's identity exactly the new recipe's container (the others' go).
    moved = cloud.run(other_recipe, "--keep")
    assert moved.ok, moved.output[-4000:]
    assert "copied 1 files" in moved.output
    assert container_roles(cloud, blobs) == {other: (READER, principal)}

    down = cloud.down(cloud.cluster)
    assert down.ok, down.output
    assert container_roles(cloud, blobs) == {}
    assert cloud.leftovers() == []


def test_gc_finds_role_assignments_of_a_cluster_no_longer_in_state(
        azure_cloud: AzureCloud, azure_blobs: AzureBlobs) -> None:
    cloud, blobs = azure_cloud, azure_blobs
    cloud.env.update({**blobs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    data = blobs.create("small")
    blobs.fill(data, "d", files=20, total_bytes=200_000)
    recipe = bucket_recipe(cloud, cloud.cluster, [{"source": f"az://{blobs.account}/{data}/d", "target": "data"}],
                           run="ls data/part-000 | wc -l")
    up = cloud.up(recipe)
    assert up.ok, up.output[-3000:]
    assert "copied 20 files" in up.output
    assert list(container_roles(cloud, blobs)) == [data]
    # State lost: the VM and its group are found by tag, the role assignment by its description.
    for file in ("state.db", "state.db-wal", "state.db-shm"):
        (cloud.home / file).unlink(missing_ok=True)
    cloud.age_marks()  # and nobody has held the cluster for hours: its machines are a leak now
    listed = cloud.cli("gc", "--cloud", "azure", "--json")
    assert listed.returncode == 1, listed.output
    (assignment_id,) = [item["id"] for leak in json.loads(listed.stdout)["leaks"] for item in leak["items"]
                        if item["kind"] == "role-assignment"]
    assert f"/blobServices/default/containers/{data}/providers/Microsoft.Authorization/roleAssignments/" \
        in assignment_id
    removed = cloud.cli("gc", "--cloud", "azure", "--yes")
    assert removed.ok, removed.output
    assert container_roles(cloud, blobs) == {}
    after = cloud.cli("gc", "--cloud", "azure")
    assert after.ok and after.stdout.strip() == "nothing leaked", after.output
    assert cloud.leftovers() == []


def test_an_unknown_account_or_credentials_that_may_not_assign_roles_are_refused_before_any_vm(
        azure_cloud: AzureCloud, azure_blobs: AzureBlobs) -> None:
    cloud, blobs = azure_cloud, azure_blobs
    cloud.env.update({**blobs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    data = blobs.create("refused")
    unknown = bucket_recipe(cloud, cloud.cluster, [{"source": "az://nosuchaccount/data/x", "target": "d"}], run="true")
    result = cloud.up(unknown)
    assert result.returncode == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.output
    assert "az://nosuchaccount: no storage account 'nosuchaccount' in subscription" in result.stderr
    assert cloud.faults.count("vm.create") == 0
    # Contributor may create everything but role assignments (its notActions): refused, one line,
    # before anything billed (the buckets' roles are asked about first, then the watchdog's).
    cloud.server.principal_role = "Contributor"
    recipe = bucket_recipe(cloud, cloud.cluster, [{"source": f"az://{blobs.account}/{data}/x", "target": "d"}],
                           run="true")
    refused = cloud.up(recipe)
    assert refused.returncode == 2, refused.output
    assert len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert "may not assign one in resource group cloudtrain-test-data (Microsoft.Authorization/roleAssignments/" \
        "write)" in refused.stderr
    assert cloud.faults.count("vm.create") == cloud.faults.count("ip.create") == 0
    assert cloud.leftovers() == []
