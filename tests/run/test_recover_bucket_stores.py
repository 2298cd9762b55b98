"""The laptop's own bucket work in a recovering run (run/recover_bucket.py), called directly against
each store's fake with the user's own configured credentials, as the CLI has them: S3 (moto, the
test's keys), GCS (the kit's wire fake, the fake GCE's service-account key) and Azure Blob
(Azurite behind the kit's RBAC front, the account key). No CLI run, sshd or VM: the functions run
the real copy tool (templates/bucket_copy.py) in a subprocess, as run/recover_upload.py has them.

- `put_from_laptop`: the run directory's result paths go under `<upload>/<run-id>/` in the
  layout the node would have uploaded; where the bucket is gone, the answer names the error in
  one line and the one command that finishes the upload, which does once the bucket is back.
- `list_uploaded`: what the bucket holds under the run's prefix, with sizes and times; an empty
  prefix lists nothing; a store that refuses gives an error entry, not an exception.

The CLI's side of both (when they run, what run.json and the terminal say) is in
tests/e2e/test_recovery_upload_e2e.py, on AWS.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.run.recover_bucket import LAPTOP_WHO, FinalUpload, finish_command, list_uploaded, put_from_laptop
from tests.lazy import requires

pytestmark = requires("obstore")

STORES = ["s3", "gcs", "azure"]
RUN_ID = "20240501-120000-ab12"
# What the job left in the run directory (collect brought it home): a result and a nested file.
RESULTS = {"outputs/result.json": json.dumps({"steps": 3, "total": 6}).encode(),
           "outputs/logs/epoch-1/train.log": b"step 1\nstep 2\nstep 3\n"}
LOST = "gcp reports the instance preempted"


@dataclass
class Store:
    """One test's bucket on one store, read and changed with the store's own client (not the copy
    tool under test)."""

    url: str  # the recipe's `upload:` (the bucket and a `runs` prefix)
    get: Callable[[str], bytes]  # a key under the bucket -> its bytes
    put: Callable[[str, bytes], None]
    delete: Callable[[], None]  # the bucket, with whatever it holds
    create: Callable[[], None]  # the bucket again, under the same name


def _store(name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A new bucket on the store, and this process's environment as the CLI's is in
    tests/e2e/test_recovery_upload_e2e.py: the store's address and the user's own credentials."""
    bucket = f"res-{uuid.uuid4().hex[:12]}"  # moto's server is the session's: names must not meet
    if name == "s3":
        s3 = request.getfixturevalue("s3_buckets")  # moto_server: AWS_ENDPOINT_URL and the user's keys
        _setenv(monkeypatch, s3.cli_env())
        client = s3.client()

        def s3_delete() -> None:
            for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
            client.delete_bucket(Bucket=bucket)
        s3.create(bucket)
        return Store(f"s3://{bucket}/runs", lambda k: client.get_object(Bucket=bucket, Key=k)["Body"].read(),
                     lambda k, data: client.put_object(Bucket=bucket, Key=k, Body=data), s3_delete,
                     lambda: s3.create(bucket))
    if name == "gcs":
        # gce_server (under gcs_buckets) puts its service-account key in GOOGLE_APPLICATION_CREDENTIALS:
        # the project owner's, the user's. No metadata server: only a node's identity asks one.
        gcs = request.getfixturevalue("gcs_buckets")
        _setenv(monkeypatch, gcs.cli_env())
        server = gcs.server

        def gcs_get(key: str) -> bytes:
            with server.lock:
                return server.buckets[bucket].objects[key].data

        def gcs_delete() -> None:
            with server.lock:
                del server.buckets[bucket]
        gcs.create(bucket)
        return Store(f"gs://{bucket}/runs", gcs_get, lambda k, data: server.put(bucket, k, data), gcs_delete,
                     lambda: gcs.create(bucket))
    import obstore

    blobs = request.getfixturevalue("azure_blobs")
    _setenv(monkeypatch, {**blobs.cli_env(), **blobs.user_env()})

    def az_delete() -> None:
        # Delete Container, with the account's SAS (the user's); obstore has no container calls.
        url = f"{blobs.front.url}/{blobs.account}/{bucket}?restype=container&{blobs.front.sas}"
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE", headers={
                "x-ms-version": "2021-08-06", "Content-Length": "0"}), timeout=60):
            pass
    blobs.create(bucket)
    return Store(f"az://{blobs.account}/{bucket}/runs",
                 lambda k: bytes(obstore.get(blobs.store()(bucket), k).bytes()),
                 lambda k, data: blobs.put(bucket, k, data), az_delete, lambda: blobs.create(bucket))


def _setenv(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _prefix(store: Store) -> str:
    """The key prefix of the store's upload URL (the part after the bucket or container)."""
    return store.url.split("/", 4 if store.url.startswith("az://") else 3)[-1]


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / RUN_ID
    for rel, data in RESULTS.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_bytes(data)
    return run_dir


def _uploaded(store: Store) -> dict[str, bytes]:
    return {rel: store.get(f"{_prefix(store)}/{RUN_ID}/{rel}") for rel in RESULTS}


@pytest.mark.parametrize("store_name", STORES)
def test_the_laptop_puts_the_results_under_the_runs_prefix_in_the_run_directorys_layout(
        store_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The result paths the run directory holds (a result path it does not hold is skipped, as on a
    node) go under `<upload>/<run-id>/` with their paths relative to the run directory, from this
    machine with the user's credentials; the record says so and has no command left to run."""
    store = _store(store_name, request, monkeypatch)
    run_dir = _run_dir(tmp_path)
    url = f"{store.url}/{RUN_ID}"
    said: list[str] = []
    done = put_from_laptop(url, run_dir, ["outputs", "checkpoints"], LOST, 12.5, said.append)
    assert done == FinalUpload(url, LOST, 12.5, "this machine", True, ("outputs",), 0, None, None), done
    assert _uploaded(store) == RESULTS
    assert said[0] == f"upload {url} from this machine with {LAPTOP_WHO}", said
    assert any(f"upload {url}: uploaded {len(RESULTS)} files" in line for line in said), said


@pytest.mark.parametrize("store_name", STORES)
def test_an_upload_to_a_bucket_that_is_gone_names_the_error_and_the_line_that_finishes_it(
        store_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The bucket was deleted: the store's refusal comes back as a record (exit 4, "not found" in
    one line naming the bucket), not an exception, with the one shell line that finishes the
    upload; run from the run directory once the bucket is there again, that line does."""
    store = _store(store_name, request, monkeypatch)
    run_dir = _run_dir(tmp_path)
    url = f"{store.url}/{RUN_ID}"
    store.delete()
    done = put_from_laptop(url, run_dir, ["outputs"], LOST, 12.5, lambda _: None)
    assert (done.ok, done.by, done.paths, done.exit_code) == (False, "this machine", ("outputs",), 4), done
    bucket_url = store.url.rsplit("/", 1)[0]
    assert done.error and "\n" not in done.error and f"{bucket_url}: not found" in done.error, done.error
    assert done.finish == finish_command(url, run_dir, ["outputs"])
    store.create()
    finished = subprocess.run(["sh", "-c", done.finish], cwd=run_dir, env=dict(os.environ), capture_output=True,
                              text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert _uploaded(store) == RESULTS


@pytest.mark.parametrize("store_name", STORES)
def test_the_laptop_lists_what_the_bucket_holds_under_the_runs_prefix(
        store_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a node put under the run's prefix before it went: each object's path relative to the
    prefix, its size and when it was written, and how many there are; a run whose id merely starts
    with this one's is not this run's. A prefix with nothing lists nothing; a bucket that is not
    there is an error entry in one line, not an exception (run.json records it and the run goes on)."""
    store = _store(store_name, request, monkeypatch)
    ckpt = f".cloudtrain-checkpoints/{RUN_ID}"
    objects = {f"{ckpt}/final": b"3\n", f"{ckpt}/state": b"3 0.25\n",
               "outputs/result.json": RESULTS["outputs/result.json"]}
    before = time.time()
    for rel, data in objects.items():
        store.put(f"{_prefix(store)}/{RUN_ID}/{rel}", data)
    store.put(f"{_prefix(store)}/{RUN_ID}-2/outputs/result.json", b"{}")
    listed = list_uploaded(f"{store.url}/{RUN_ID}")
    after = time.time()
    assert set(listed) == {"objects", "count"}, listed
    assert [o["path"] for o in listed["objects"]] == sorted(objects) and listed["count"] == len(objects), listed
    for entry in listed["objects"]:
        assert set(entry) == {"path", "size", "modified"} and entry["size"] == len(objects[entry["path"]]), entry
        assert before - 5 <= entry["modified"] <= after + 5, (entry, before, after)  # stores keep whole seconds
    assert list_uploaded(f"{store.url}/nothing-{RUN_ID}") == {"objects": [], "count": 0}
    store.delete()
    gone = list_uploaded(f"{store.url}/{RUN_ID}")
    assert set(gone) == {"error"} and "\n" not in gone["error"], gone
    assert f"{store.url.rsplit('/', 1)[0]}: not found" in gone["error"], gone
