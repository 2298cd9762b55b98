"""Recovery and the run's bucket upload (`upload:` with `recover:`, docs/recovery.md), through the
CLI, against the cloud fakes and their stores: S3 (moto, the instance role), GCS (the kit's wire
fake, the VM's service account) and Azure Blob (Azurite behind the kit's RBAC front, the VM's
managed identity). The node's copy gets its identity only from the cloud's metadata fake; the
laptop's, where the CLI copies or lists itself, is the user's own configured credentials.

- On the interruption notice the node uploads the checkpoint its TERMed job wrote, and the
  results, and run.json's attempt says what went up; on each cloud this test is also the notice
  test's leg (test_recovery_e2e.py keeps the AWS one, without `upload:`): the reason in the
  cloud's words, the next attempt started from the checkpoint written on TERM.
- The node goes before the CLI has read what the upload on the notice did (`on_notice.json`'s
  rename parked at a gate of the test kit, then the machine preempted): run.json's attempt says
  what the bucket holds under the run's prefix, listed from the laptop (on AWS; the listing and
  the laptop's upload on each store: tests/run/test_recover_bucket_stores.py).
- The node goes during the run's own upload at its end (the upload job's shell parked at a gate,
  then the machine preempted): the results are home, so the laptop finishes the upload, the run
  succeeds, and the last attempt's `final_upload` says what happened. Where the laptop cannot
  either (the bucket is gone), the run fails naming the one line that finishes the upload.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from cloudtrain.testing import recovery as rk
from cloudtrain.testing import sshd
from cloudtrain.testing.faults import NodeCommandGate
from cloudtrain.testing.wait import wait_until
from tests.lazy import requires

pytestmark = requires("obstore")

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


@dataclass
class Store:
    """One test's bucket on the cloud's own store: its upload URL and how the test reads it."""

    url: str  # the recipe's `upload:` (the bucket and a `runs` prefix)
    get: Callable[[str], bytes]  # a key under the bucket -> its bytes
    keys: Callable[[], list[str]]  # every key in the bucket


def _store(cloud: Any, request: pytest.FixtureRequest, metadata: Any, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A new bucket on `cloud`'s store, the CLI's environment pointed at it, the user's own
    credentials for it in the CLI's environment (what the laptop copies or lists with)."""
    suffix = cloud.cluster[-8:].lower().strip("-")
    if cloud.name == "aws":
        s3 = request.getfixturevalue("s3_buckets")
        cloud.env.update(s3.cli_env())
        cloud.env["CLOUDTRAIN_WATCHDOG_METADATA_URL"] = metadata.url
        monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_METADATA_URL", metadata.url)
        bucket = s3.create(f"res-{suffix}")

        def keys() -> list[str]:
            return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", []))
        return Store(f"s3://{bucket}/runs", lambda k: s3.client().get_object(Bucket=bucket, Key=k)["Body"].read(), keys)
    if cloud.name == "gcp":
        gcs = request.getfixturevalue("gcs_buckets")
        cloud.env.update({**gcs.cli_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
        bucket = gcs.create(f"res-{suffix}")

        def gcs_get(key: str) -> bytes:
            with gcs.server.lock:
                return gcs.server.buckets[bucket].objects[key].data
        return Store(f"gs://{bucket}/runs", gcs_get, lambda: gcs.names(bucket))
    import obstore

    blobs = request.getfixturevalue("azure_blobs")
    cloud.env.update({**blobs.cli_env(), **blobs.user_env(), "CLOUDTRAIN_METADATA_URL": cloud.metadata.url})
    container = blobs.create(f"res-{suffix}")
    return Store(f"az://{blobs.account}/{container}/runs",
                 lambda k: bytes(obstore.get(blobs.store()(container), k).bytes()), lambda: blobs.keys(container))


# What each cloud's notice says, as the attempt's reason quotes it.
def _notice(cloud: Any, metadata: Any) -> None:
    """The cloud announces the interruption of the cluster's machine; once a watchdog has read it,
    the fake stops announcing (it answers every machine alike: the next one must not see it)."""
    _, machine = rk.placement(cloud)
    metadata.interrupt(cloud.name, [machine] if cloud.name == "azure" else None)
    wait_until(lambda: metadata.notices_served(cloud.name) >= 1, 60, "the watchdog reading the notice")
    metadata.clear()


def _metadata(cloud: Any, request: pytest.FixtureRequest) -> Any:
    """The metadata server the cluster's watchdog reads notices from (GCP's and Azure's fixtures
    have their VMs' own; on AWS the session's, which the S3 fixture also gives the nodes' role)."""
    return request.getfixturevalue("metadata_server") if cloud.name == "aws" else cloud.metadata


@pytest.mark.parametrize("cloud_name", ["aws", "gcp", "azure"])
def test_on_the_notice_the_node_uploads_its_checkpoint_with_its_own_identity(
        fake_cloud: Any, cloud_name: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """EC2's spot/instance-action, GCE's instance/preempted, Azure's Scheduled Events Preempt: the
    watchdog TERMs the job and starts the upload the CLI left on the node; after the job wrote its
    last checkpoint the node puts it (and whatever results there are) under the run's upload URL with its own identity (the
    instance's IAM role; the VM's service account; its managed identity), and run.json's first
    attempt says what went up."""
    cloud = fake_cloud(cloud_name)
    metadata = _metadata(cloud, request)
    store = _store(cloud, request, metadata, monkeypatch)
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = rk.recipe(cloud, marks, watch_s=300, autostop={"idle_minutes": 30}, upload=store.url)
    proc = rk.start(cloud, recipe)
    try:
        rk.kept(cloud, at_least=3)
        _notice(cloud, metadata)
        out, err = rk.finish(proc, marks)
    finally:
        (marks / "go").touch()
    run_dir, record = rk.ended(proc, out, err)
    run_id = record["run_id"]
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), record["attempts"]
    # The loss was the cloud's own notice, in its words, read by the watchdog on the node; the CLI
    # brought the checkpoint the TERMed job wrote home before the next attempt, which started there
    # (its `final` mark). (This cloud's leg of the no-upload notice test in test_recovery_e2e.py.)
    assert "interruption notice" in one["reason"] and rk.NOTICE_SAYS[cloud_name] in one["reason"], one
    starts = (marks / "starts").read_text().split("\n")
    assert starts[0] == "start 0 -" and starts[1] == "start 3 3", (starts, record["attempts"], err[-4000:])
    assert one["final_checkpoint_at"] is not None and one["final_checkpoint_at"] < two["started_at"]
    assert "final checkpoint at step 3" in (run_dir / "job.log").read_text()
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["total"] == rk.TOTAL
    ckpt = f".cloudtrain-checkpoints/{run_id}"
    on_notice = one["uploaded_on_notice"]
    assert on_notice is not None and on_notice["ok"] and on_notice["exit_code"] == 0, one
    assert on_notice["url"] == f"{store.url}/{run_id}" and on_notice["paths"] == ["outputs", ckpt], on_notice
    assert two["uploaded_on_notice"] is None
    prefix = _prefix(store)
    assert store.get(f"{prefix}/{run_id}/{ckpt}/final") == b"3\n"  # the checkpoint the job wrote on TERM
    assert store.get(f"{prefix}/{run_id}/{ckpt}/state").split()[0] == b"3"
    # The run's own upload at its end: the results of the second attempt.
    assert json.loads(store.get(f"{prefix}/{run_id}/outputs/result.json"))["total"] == rk.TOTAL
    assert cloud.leftovers() == []


def _prefix(store: Store) -> str:
    """The key prefix of the store's upload URL (the part after the bucket or container)."""
    return store.url.split("/", 4 if store.url.startswith("az://") else 3)[-1]


def _run_id(cloud: Any) -> str:
    return wait_until(lambda: next((p.name for p in cloud.runs_dir.iterdir() if p.is_dir()), None), 120,
                      "the run's directory")


def _park_the_upload(cloud: Any, tmp_path: Path) -> tuple[str, str, str, NodeCommandGate]:
    """The first machine running, and the run's own upload step parked on it (its cmd.sh held at a
    NodeCommandGate): (where, machine, run id, the gate)."""
    where, machine, vm = wait_until(lambda: rk.running(cloud), 300, "the first machine")
    run_id = _run_id(cloud)
    cmd = f"{vm.home_dir}/.cloudtrain/{cloud.cluster}/jobs/{run_id}-upload/cmd.sh"
    gate = NodeCommandGate.install(vm.bin_dir, "sh", [cmd], tmp_path / "gate")
    wait_until(lambda: gate.held, 300, "the node's upload starting")
    return where, machine, run_id, gate


# One cloud: the pipeline's part is cloud-agnostic; the laptop's own upload and listing on each store
# (S3, GCS, Blob) is proven by tests/run/test_recover_bucket_stores.py.
@pytest.mark.parametrize("cloud_name", ["aws"])
def test_a_node_preempted_during_the_runs_upload_step_has_its_upload_finished_by_the_laptop(
        fake_cloud: Any, cloud_name: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The job succeeded and its results are home; while node 0 runs the run's own upload (its
    job's shell parked at a gate), the spot machine is preempted. The run does not fail for it:
    the laptop puts the results it collected under the run's upload URL with the user's own
    credentials, and run.json's last attempt says the node went and who finished the upload."""
    cloud = fake_cloud(cloud_name)
    store = _store(cloud, request, _metadata(cloud, request), monkeypatch)
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").touch()  # the job runs through: the loss comes after it
    proc = rk.start(cloud, rk.recipe(cloud, marks, upload=store.url))
    gate = None
    try:
        where, machine, run_id, gate = _park_the_upload(cloud, tmp_path)
        rk.preempt(cloud, where, machine)
        out, err = rk.finish(proc, marks)
    finally:
        rk.stop(proc, gate)
    run_dir, record = rk.ended(proc, out, err)
    assert record["status"] == "succeeded" and record["error"] is None, record
    assert record["upload"] == f"{store.url}/{run_id}"
    (only,) = record["attempts"]  # no relaunch for a copy: the results were home
    assert only["outcome"] == "succeeded", only
    final = only["final_upload"]
    assert final is not None and final["ok"] and final["by"] == "this machine", only
    assert final["url"] == f"{store.url}/{run_id}" and final["paths"] == ["outputs"] and final["finish"] is None
    assert "reports" in final["node_lost"] and final["detected_at"] <= record["ended_at"], final
    assert json.loads(store.get(f"{_prefix(store)}/{run_id}/outputs/result.json")) == {
        "steps": rk.STEPS, "total": rk.TOTAL}
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["total"] == rk.TOTAL
    assert "finishing the upload from this machine" in err
    assert len(cloud.bill.instances(cloud.cluster)) == 1
    assert cloud.leftovers() == []


# One cloud: the pipeline's part is cloud-agnostic; the laptop's own upload and listing on each store
# (S3, GCS, Blob) is proven by tests/run/test_recover_bucket_stores.py.
@pytest.mark.parametrize("cloud_name", ["aws"])
def test_a_node_gone_before_the_cli_read_its_upload_on_notice_leaves_a_listing_of_the_bucket(
        fake_cloud: Any, cloud_name: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the notice the node uploads the TERMed job's checkpoint, but the machine goes before the
    CLI can read `on_notice.json` (its rename parked at a gate, then the machine preempted). The
    bucket has the files; run.json's attempt says so: the run's prefix listed from the laptop."""
    cloud = fake_cloud(cloud_name)
    metadata = _metadata(cloud, request)
    store = _store(cloud, request, metadata, monkeypatch)
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = rk.recipe(cloud, marks, watch_s=300, autostop={"idle_minutes": 30}, upload=store.url)
    proc = rk.start(cloud, recipe)
    gate = None
    try:
        kept = rk.kept(cloud, at_least=3)
        where, machine, vm = wait_until(lambda: rk.running(cloud), 60, "the machine")
        root = f"{vm.home_dir}/.cloudtrain/{cloud.cluster}"
        gate = NodeCommandGate.install(vm.bin_dir, "mv", [f"{root}/.on_notice.json.tmp"], tmp_path / "gate")
        _notice(cloud, metadata)
        wait_until(lambda: gate.held, 120, "the upload on the notice done, its record not yet written")
        # The CLI has brought the final checkpoint home (it reads the upload's record after that).
        wait_until(lambda: next(kept.parent.rglob("final"), None), 120, "the final checkpoint home")
        rk.preempt(cloud, where, machine)
        out, err = rk.finish(proc, marks)
    finally:
        (marks / "go").touch()
        if gate is not None:
            gate.release()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run_dir, record = rk.ended(proc, out, err)
    run_id = record["run_id"]
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), record["attempts"]
    ckpt = f".cloudtrain-checkpoints/{run_id}"
    listed = one["uploaded_on_notice"]
    assert listed is not None and listed["answered"] is False and listed["ok"] is None, one
    assert listed["url"] == f"{store.url}/{run_id}" and "error" not in listed, listed
    paths = {o["path"]: o for o in listed["objects"]}
    assert {f"{ckpt}/final", f"{ckpt}/state"} <= set(paths) and listed["count"] == len(paths), listed
    assert paths[f"{ckpt}/final"]["size"] == 2 and paths[f"{ckpt}/final"]["modified"] <= listed["listed_at"] + 5
    assert store.get(f"{_prefix(store)}/{run_id}/{ckpt}/final") == b"3\n"
    assert "could not be listed" not in err and "listed from this machine" in err
    assert cloud.leftovers() == []


def test_an_upload_the_laptop_cannot_finish_either_fails_the_run_naming_the_line_that_finishes_it(
        fake_cloud: Any, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, but the bucket is deleted while the node's upload is parked: the node is lost and
    the laptop's own upload is refused (no such bucket). The results are home; the run fails for
    the upload, with `final_upload` saying why and the one shell line that finishes it, which, run
    once the bucket is back, does."""
    cloud = fake_cloud("aws")
    store = _store(cloud, request, _metadata(cloud, request), monkeypatch)
    s3 = request.getfixturevalue("s3_buckets")
    bucket = store.url.split("/")[2]
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").touch()
    proc = rk.start(cloud, rk.recipe(cloud, marks, upload=store.url))
    gate = None
    try:
        where, machine, run_id, gate = _park_the_upload(cloud, tmp_path)
        s3.client().delete_bucket(Bucket=bucket)
        rk.preempt(cloud, where, machine)
        out, err = rk.finish(proc, marks)
    finally:
        rk.stop(proc, gate)
    run_dir, record = rk.ended(proc, out, err, 1)
    assert record["status"] == "failed" and f"upload {store.url}/{run_id} not done" in record["error"], record
    (only,) = record["attempts"]
    final = only["final_upload"]
    assert final is not None and not final["ok"] and final["exit_code"] == 4 and "not found" in final["error"], final
    assert final["finish"] and final["finish"] in record["error"] and final["finish"] in out + err
    # The results are home, and the line finishes the upload once the bucket is there again.
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["total"] == rk.TOTAL
    assert cloud.leftovers() == []
    s3.create(bucket)
    done = subprocess.run(["sh", "-c", final["finish"]], env={**os.environ, **cloud.env}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(store.get(f"{_prefix(store)}/{run_id}/outputs/result.json"))["total"] == rk.TOTAL

