"""The test kit's Azure Blob store (cloudtrain/testing/blob.py): Azurite behind a front that
enforces the fake ARM's Storage Blob Data role assignments for managed-identity tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from cloudtrain.testing.azure import SUBSCRIPTION, ArmServer
from cloudtrain.testing.blob import DENIED_MESSAGE, AzureBlobs, BlobCall, blob_call, error_body
from cloudtrain.testing.metadata import MetadataServer

from tests.testing.test_azure_fake import Arm
from tests.lazy import requires

pytestmark = requires("azure.mgmt.authorization", "obstore")

READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
COPY = Path(__file__).resolve().parents[2] / "templates" / "bucket_copy.py"


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/acct/data", {"restype": "container", "comp": "list", "prefix": "train/"},
     BlobCall("acct", "data", "", "read")),                                        # List Blobs
    ("GET", "/acct/data/train/a.bin", {}, BlobCall("acct", "data", "train/a.bin", "read")),  # Get Blob
    ("HEAD", "/acct/data/train/a.bin", {}, BlobCall("acct", "data", "train/a.bin", "read")),  # Get Blob Properties
    ("PUT", "/acct/out/r/x.txt", {}, BlobCall("acct", "out", "r/x.txt", "write")),  # Put Blob
    ("PUT", "/acct/out/big", {"comp": "block", "blockid": "AA=="}, BlobCall("acct", "out", "big", "write")),
    ("PUT", "/acct/out/big", {"comp": "blocklist"}, BlobCall("acct", "out", "big", "write")),
    ("DELETE", "/acct/out/r/x.txt", {}, BlobCall("acct", "out", "r/x.txt", "delete")),
    ("GET", "/acct", {"comp": "list"}, BlobCall("acct", "", "", "read")),           # List Containers
])
def test_each_request_needs_the_data_operation_of_its_role(method: str, path: str, query: dict[str, str],
                                                          expected: BlobCall) -> None:
    assert blob_call(method, path, query) == expected


def test_the_refusal_body_is_blob_storages_xml_error() -> None:
    body = error_body("AuthorizationPermissionMismatch", DENIED_MESSAGE).decode()
    assert body.startswith('<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthorizationPermissionMismatch</Code>')
    assert f"<Message>{DENIED_MESSAGE}\nRequestId:" in body and "\nTime:" in body


def _grant(arm: Arm, scope: str, principal: str, role: str) -> str:
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    name = str(uuid.uuid4())
    arm.authorization.role_assignments.create(scope, name, RoleAssignmentCreateParameters(
        role_definition_id=f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/{role}",
        principal_id=principal, principal_type="ServicePrincipal"))
    return name


def _node_copy(blobs: AzureBlobs, metadata: MetadataServer, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """templates/bucket_copy.py as a node runs it: the managed identity only (the user's account
    key in the environment is dropped by the copy)."""
    env = {**os.environ, **blobs.cli_env(), **blobs.user_env(), "CLOUDTRAIN_BUCKET_IDENTITY": "instance",
           "CLOUDTRAIN_BUCKET_WHO": "the VM's managed identity", "CLOUDTRAIN_METADATA_URL": metadata.url}
    return subprocess.run([sys.executable, str(COPY), *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp)


def test_a_managed_identity_reads_and_writes_only_where_its_roles_say(
        arm_server: ArmServer, azure_blobs: AzureBlobs, metadata_server: MetadataServer, tmp_path: Path) -> None:
    arm, blobs = Arm(arm_server), azure_blobs
    arm_server.rbac_propagation_s = 0  # the roles' table here; their delay: the next test
    arm_server.accept_identity_token(metadata_server.token_for("imds"))
    for container in ("data", "out", "other"):
        blobs.create(container)
    blobs.put("data", "train/a.bin", b"A" * 1000)
    blobs.put("other", "x/b.bin", b"not yours")
    arm.group("cluster")
    vm = arm.vm("cluster", "vm0")
    containers = f"{blobs.account_id}/blobServices/default/containers"

    # No role: the node's list is refused with Blob Storage's 403, in one line naming the permission.
    denied = _node_copy(blobs, metadata_server, tmp_path, "get", f"az://{blobs.account}/data/train", "in",
                        "--state", "s.json")
    assert denied.returncode == 3, denied.stderr
    assert denied.stderr.strip().splitlines() == [
        f"bucket copy: access denied: az://{blobs.account}/data refuses "
        "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read to the VM's managed identity "
        "(AuthorizationPermissionMismatch)"]
    # Reader on the container: reads it, and nothing else; cannot write there.
    _grant(arm, f"{containers}/data", vm.identity.principal_id, READER)
    copied = _node_copy(blobs, metadata_server, tmp_path, "get", f"az://{blobs.account}/data/train", "in",
                        "--state", "s.json")
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "in" / "a.bin").read_bytes() == b"A" * 1000
    elsewhere = _node_copy(blobs, metadata_server, tmp_path, "get", f"az://{blobs.account}/other/x", "o",
                           "--state", "o.json")
    assert elsewhere.returncode == 3 and "az://cloudtraindata/other refuses" in elsewhere.stderr
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "r.txt").write_text("result")
    refused = _node_copy(blobs, metadata_server, tmp_path, "put", f"az://{blobs.account}/data/runs", "--base", ".",
                         "res")
    assert refused.returncode == 3 and "containers/blobs/write" in refused.stderr
    # Contributor on the upload container: writes there.
    _grant(arm, f"{containers}/out", vm.identity.principal_id, CONTRIBUTOR)
    uploaded = _node_copy(blobs, metadata_server, tmp_path, "put", f"az://{blobs.account}/out/runs", "--base", ".",
                          "res")
    assert uploaded.returncode == 0, uploaded.stderr
    assert blobs.keys("out") == ["runs/res/r.txt"]
    # Every managed-identity request went through the front's check; the refusals were these.
    assert {(c.container, c.operation) for c in blobs.front.denied()} == {
        ("data", "read"), ("other", "read"), ("data", "write")}
    # The metadata fake gave the token, asked for Blob Storage's audience.
    assert {r.query.get("resource") for r in metadata_server.seen("imds")} == {"https://storage.azure.com"}


def test_a_new_role_takes_effect_later_and_a_first_copy_waits_for_it(
        arm_server: ArmServer, azure_blobs: AzureBlobs, metadata_server: MetadataServer, tmp_path: Path) -> None:
    arm, blobs = Arm(arm_server), azure_blobs
    arm_server.rbac_propagation_s = 3.0
    arm_server.accept_identity_token(metadata_server.token_for("imds"))
    blobs.create("data")
    blobs.put("data", "train/a.bin", b"A" * 100)
    arm.group("cluster")
    vm = arm.vm("cluster", "vm0")
    _grant(arm, f"{blobs.account_id}/blobServices/default/containers/data", vm.identity.principal_id, READER)
    source = f"az://{blobs.account}/data/train"
    # Right after the PUT the role is not in effect yet: a copy that does not wait is refused.
    early = _node_copy(blobs, metadata_server, tmp_path, "get", source, "in", "--state", "early.json")
    assert early.returncode == 3 and "refuses" in early.stderr
    # A first copy told to wait out a new grant tries again until the role takes effect.
    waited = subprocess.run(
        [sys.executable, str(COPY), "get", source, "in", "--state", "s.json"], capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
        env={**os.environ, **blobs.cli_env(), "CLOUDTRAIN_BUCKET_IDENTITY": "instance",
             "CLOUDTRAIN_BUCKET_WHO": "the VM's managed identity", "CLOUDTRAIN_METADATA_URL": metadata_server.url,
             "CLOUDTRAIN_BUCKET_GRANT_WAIT_S": "60"})
    assert waited.returncode == 0, waited.stderr
    assert "the store does not let this node in yet" in waited.stdout
    assert (tmp_path / "in" / "a.bin").read_bytes() == b"A" * 100
    # A bucket this node has copied before is denied at once, whatever the wait says.
    arm.authorization.role_assignments.delete(f"{blobs.account_id}/blobServices/default/containers/data",
                                              _only_assignment(arm_server))
    again = subprocess.run(
        [sys.executable, str(COPY), "get", source, "in", "--state", "s.json"], capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
        env={**os.environ, **blobs.cli_env(), "CLOUDTRAIN_BUCKET_IDENTITY": "instance",
             "CLOUDTRAIN_BUCKET_WHO": "the VM's managed identity", "CLOUDTRAIN_METADATA_URL": metadata_server.url,
             "CLOUDTRAIN_BUCKET_GRANT_WAIT_S": "60"})
    assert again.returncode == 3 and "does not let this node in yet" not in again.stdout, again.stdout


def _only_assignment(arm_server: ArmServer) -> str:
    (assignment,) = [r for r in arm_server.resources.values()
                     if r["type"].lower() == "microsoft.authorization/roleassignments"]
    return str(assignment["name"])


def test_tokens_nobody_issued_get_401_and_a_role_in_another_account_gives_nothing(
        arm_server: ArmServer, azure_blobs: AzureBlobs) -> None:
    blobs = azure_blobs
    arm_server.rbac_propagation_s = 0
    blobs.create("data")
    url = f"{blobs.front.url}/{blobs.account}/data?restype=container&comp=list"
    forged = requests.get(url, headers={"Authorization": "Bearer forged", "x-ms-version": "2021-08-06"}, timeout=10)
    assert forged.status_code == 401 and forged.headers["x-ms-error-code"] == "InvalidAuthenticationInfo"
    assert "<Code>InvalidAuthenticationInfo</Code>" in forged.text
    # A known token whose VMs hold a role only on another storage account's container.
    arm = Arm(arm_server)
    arm_server.accept_identity_token("eyJ.kit-token")
    arm.group("cluster")
    vm = arm.vm("cluster", "vm0")
    elsewhere = arm_server.create_storage_account("other-rg", "otheraccount")
    _grant(arm, f"{elsewhere}/blobServices/default/containers/data", vm.identity.principal_id, READER)
    refused = requests.get(url, headers={"Authorization": "Bearer eyJ.kit-token", "x-ms-version": "2021-08-06"},
                           timeout=10)
    assert refused.status_code == 403 and refused.headers["x-ms-error-code"] == "AuthorizationPermissionMismatch"
    # The account scope covers its containers.
    _grant(arm, blobs.account_id, vm.identity.principal_id, READER)
    allowed = requests.get(url, headers={"Authorization": "Bearer eyJ.kit-token", "x-ms-version": "2021-08-06"},
                           timeout=10)
    assert allowed.status_code == 200 and "<EnumerationResults" in allowed.text
