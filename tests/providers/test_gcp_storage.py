"""The gcp provider's bucket identity against the fake Compute Engine and the GCS fake (real SDK,
google-auth's AuthorizedSession, HTTP): which account and scopes a VM with gs:// buckets runs as,
the bindings written before it exists (roles, conditions, tags), refusals in one line, and the
bindings' end with the cluster. The CLI flows are in tests/e2e/test_buckets_gcs_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from cloudtrain.buckets.grants import grants_for
from cloudtrain.errors import ProviderError, UsageError
from cloudtrain.providers.base import InstanceSpec
from cloudtrain.testing.gcp import DEFAULT_SERVICE_ACCOUNT, GceServer
from cloudtrain.testing.gcs import GcsBuckets

from cloudtrain.providers.gcp import GcpProvider, build
from cloudtrain.providers.gcp.api import Backoff
from cloudtrain.providers.gcp.storage import binding_for
from tests.lazy import requires

pytestmark = [pytest.mark.quick, requires("google.cloud.compute_v1")]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheGcpStorageTests test"
MEMBER = f"serviceAccount:{DEFAULT_SERVICE_ACCOUNT}"


@pytest.fixture
def provider(gce_server: GceServer, gcs_buckets: GcsBuckets, monkeypatch: pytest.MonkeyPatch) -> GcpProvider:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_buckets.server.url)
    made = GcpProvider(**gce_server.config(region="us-central1"))
    made.api.backoff = Backoff(sleep=lambda _: None)
    return made


def spec(gce_server: GceServer, data: list[str], upload: str | None = None, **kwargs: Any) -> InstanceSpec:
    image = gce_server.create_image("kit-image", labels={"cloudtrain-ssh-user": "kituser"})
    return InstanceSpec(cluster="box", instance_type="e2-standard-2", region="us-central1", image=image,
                        ssh_public_key=KEY, owner="me", allowed_cidr="203.0.113.7/32",
                        buckets=grants_for(data, upload), **kwargs)


def ours(gcs: GcsBuckets, bucket: str) -> list[dict]:
    return [b for b in gcs.bindings(bucket) if (b.get("condition") or {}).get("title") == "cloudtrain-box"]


def test_binding_is_the_role_for_the_member_confined_to_the_prefix_and_tagged() -> None:
    (read, write) = grants_for(["gs://dsx/train"], "gs://out/runs")
    reader = binding_for(read, "box", "me", MEMBER)
    assert reader["role"] == "roles/storage.objectViewer" and reader["members"] == [MEMBER]
    assert reader["condition"] == {
        "title": "cloudtrain-box",
        "description": "cloudtrain-cluster=box cloudtrain-owner=me: the nodes' access to the recipe's buckets",
        "expression": 'resource.name == "projects/_/buckets/dsx" || '
                      'resource.name.startsWith("projects/_/buckets/dsx/objects/train/")'}
    writer = binding_for(write, "box", "me", MEMBER)
    assert writer["role"] == "roles/storage.objectCreator"
    assert writer["condition"]["expression"] == 'resource.name.startsWith("projects/_/buckets/out/objects/runs/")'


def test_launch_binds_before_the_vm_and_terminate_unbinds(provider: GcpProvider, gce_server: GceServer,
                                                          gcs_buckets: GcsBuckets) -> None:
    gcs = gcs_buckets
    for name in ("dsx", "out", "untouched"):
        gcs.create(name)
    (instance,) = provider.launch(spec(gce_server, ["gs://dsx/train"], "gs://out/runs"), 1)
    zone, name = build.parse_instance_id(instance.id)
    raw = gce_server.instance(zone, name)
    assert raw["serviceAccounts"] == [{"email": DEFAULT_SERVICE_ACCOUNT,
                                       "scopes": ["https://www.googleapis.com/auth/devstorage.read_write"]}]
    assert {"key": "cloudtrain-buckets", "value": "dsx out"} in raw["metadata"]["items"]
    assert [b["role"] for b in ours(gcs, "dsx")] == ["roles/storage.objectViewer"]
    assert [b["role"] for b in ours(gcs, "out")] == ["roles/storage.objectCreator"]
    assert ours(gcs, "untouched") == []
    assert provider.bucket_identity("box") == (f"the VM's service account {DEFAULT_SERVICE_ACCOUNT} (metadata "
                                               "server; no user credentials on the VM)")
    provider.terminate([instance.id])
    assert ours(gcs, "dsx") == [] and ours(gcs, "out") == []
    assert gcs.bindings("dsx")  # the bucket's own bindings stay


def test_read_only_data_gets_the_read_only_scope_and_a_watchdog_keeps_compute(
        provider: GcpProvider, gce_server: GceServer) -> None:
    reads = spec(gce_server, ["gs://dsx/x"])
    assert provider.scopes_for(reads) == ["https://www.googleapis.com/auth/devstorage.read_only"]
    both = spec(gce_server, ["gs://dsx/x"], watchdog="delete")
    assert provider.scopes_for(both) == [build.COMPUTE_SCOPE, "https://www.googleapis.com/auth/devstorage.read_only"]
    assert provider.account_for(spec(gce_server, [])) == build.NO_SERVICE_ACCOUNT


def test_refusals_are_one_line_and_leave_nothing(provider: GcpProvider, gce_server: GceServer,
                                                 gcs_buckets: GcsBuckets) -> None:
    gcs = gcs_buckets
    gcs.create("dsx")
    gcs.create("legacy", uniform=False)
    with pytest.raises(ProviderError) as caught:
        provider.launch(spec(gce_server, ["gs://dsx/x", "gs://legacy/y"]), 1)
    assert "setting the IAM policy of gs://legacy" in caught.value.one_line()
    assert "uniform bucket-level access" in (caught.value.hint or "")
    assert gce_server.find_instances() == [] and ours(gcs, "dsx") == []  # the first bucket's binding went too
    nobody = GcpProvider(**gce_server.config(region="us-central1"), service_account=build.NO_SERVICE_ACCOUNT)
    with pytest.raises(UsageError, match=r"gs://dsx/x: the VMs have no identity to read it with"):
        nobody.launch(spec(gce_server, ["gs://dsx/x"]), 1)
    with pytest.raises(ProviderError, match="GCS reading the IAM policy of gs://missing: HTTP 404"):
        provider.launch(spec(gce_server, ["gs://missing/x"]), 1)


def test_plan_says_the_vms_account_reaches_the_recipes_buckets(provider: GcpProvider) -> None:
    said = provider.vm_identity(False, buckets=True)
    assert said.startswith("the project's default compute service account with a devstorage scope and IAM bindings "
                           "on exactly the recipe's gs:// buckets")
    assert "compute scope" not in said and "compute scope" in provider.vm_identity(True, buckets=True)
    assert provider.vm_identity(False).startswith("no service account (no feature needs one)")
