"""The bucket steps' pieces: which mounts the laptop syncs, whose identity, the node's script."""

from __future__ import annotations

import sys
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.buckets.steps import (
    copy_in_script, grant_wait_s, identity_of, node_env, upload_script, without_buckets,
)
from cloudtrain.buckets.url import parse_bucket_url
from cloudtrain.errors import UsageError
from cloudtrain.providers.base import Traits
from cloudtrain.recipe import load_recipe


def test_the_laptop_syncs_local_mounts_only(tmp_path: Path) -> None:
    (tmp_path / "labels.csv").write_text("x")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: bk\nresources: {cloud: local}\nrun: 'true'\ndata:\n"
                      "  - {source: 's3://bkt-a/train', target: data}\n  - {source: labels.csv, target: l.csv}\n")
    loaded = load_recipe(recipe, env={})
    assert loaded.data_sources == (tmp_path / "labels.csv",)
    assert [m.source for m in without_buckets(loaded).recipe.data] == ["labels.csv"]


@pytest.mark.parametrize("caps, described, identity, says", [
    (Traits(remote=True, priced=True, owns_machines=True), lambda c: f"role of {c}", "instance", "role of c1"),
    (Traits(remote=True, priced=True, owns_machines=True), None, "instance", "the VM's own identity"),
    (Traits(remote=True, priced=False), None, "configured", "configured on the node"),
    (Traits(remote=False, priced=False), None, "configured", "no cloud identity"),
])
def test_identity(caps: Traits, described, identity: str, says: str) -> None:  # noqa: ANN001
    provider = SimpleNamespace(traits=caps, **({"bucket_identity": described} if described else {}))
    got, who = identity_of(provider, "c1")
    assert got == identity and says in who


def test_node_env_passes_endpoints_not_credentials() -> None:
    env = node_env("instance", "role", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIA...",
                                        "CLOUDTRAIN_METADATA_URL": "http://127.0.0.1:8"})
    assert env == {"CLOUDTRAIN_BUCKET_IDENTITY": "instance", "CLOUDTRAIN_BUCKET_WHO": "role",
                   "CLOUDTRAIN_S3_ENDPOINT": "http://127.0.0.1:9", "CLOUDTRAIN_METADATA_URL": "http://127.0.0.1:8"}
    assert node_env("configured", "x", {"AWS_ENDPOINT_URL_S3": "http://a:1", "AWS_ENDPOINT_URL": "http://b:2"})[
        "CLOUDTRAIN_S3_ENDPOINT"] == "http://a:1"


@pytest.mark.parametrize(("cloud", "environ", "wait"), [
    ("aws", {}, 60.0),  # IAM: seconds, rarely a minute
    ("gcp", {}, 420.0),  # "in some cases 7 minutes or more"
    ("azure", {}, 600.0),  # RBAC: "up to 10 minutes"
    ("ssh", {}, 0.0),  # the node's configured credentials: nothing is granted
    ("azure", {"CLOUDTRAIN_GRANT_PROPAGATION_S": "20"}, 20.0),
    ("gcp", {"CLOUDTRAIN_GRANT_PROPAGATION_S": "0"}, 0.0),
])
def test_a_first_copy_waits_out_the_clouds_iam_propagation(cloud: str, environ: dict, wait: float) -> None:
    from cloudtrain.providers import provider_class

    assert grant_wait_s(provider_class(cloud), environ) == wait
    env = node_env("instance", "x", {}, grant_wait=wait)
    assert env.get("CLOUDTRAIN_BUCKET_GRANT_WAIT_S") == (f"{wait:g}" if wait else None)
    assert "CLOUDTRAIN_BUCKET_GRANT_WAIT_S" not in node_env("configured", "x", {}, grant_wait=wait)


def test_a_bad_propagation_override_is_one_line() -> None:
    with pytest.raises(UsageError, match="CLOUDTRAIN_GRANT_PROPAGATION_S='soon' is not a number of seconds"):
        grant_wait_s(object(), {"CLOUDTRAIN_GRANT_PROPAGATION_S": "soon"})


def _run(script: str, python: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "CLOUDTRAIN_PYTHON": python, "CLOUDTRAIN_RUNTIME": str(cwd / "rt")}
    return subprocess.run(["sh", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_an_interpreter_of_yours_gets_no_install(tmp_path: Path) -> None:
    # A Python of the user's own without obstore: a fresh venv (no pip, no packages) stands for it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "theirs")], check=True)
    python = str(tmp_path / "theirs" / "bin" / "python")
    script = copy_in_script([(parse_bucket_url("s3://bkt-a/p"), "data")], {})
    result = _run(script, python, tmp_path)
    assert result.returncode == 6
    assert f"obstore is not installed for {python}: pip install 'cloudtrain[buckets]'" in result.stderr


def test_upload_of_no_results_is_said_not_failed(tmp_path: Path) -> None:
    script = upload_script(parse_bucket_url("s3://bkt-a/runs/r1"), ["outputs", "missing"], {})
    result = _run(script, sys.executable, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "upload s3://bkt-a/runs/r1: no results to upload" in result.stdout
