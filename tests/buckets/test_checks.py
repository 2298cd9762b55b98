"""Bucket problems found before anything exists: `cloudtrain validate` (the real CLI), one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [
    ("aws", "data: [{source: 's3://Bad_Bucket/x', target: d}]", 2, ":3: data.0.source: 's3://Bad_Bucket/x': bucket names"),
    ("aws", "data: [{source: 'ftp://host/x', target: d}]", 2, "unknown store 'ftp'"),
    ("aws", "upload: 'az://acct'", 2, "upload: 'az://acct': az:// URLs name the storage account and the container"),
    ("aws", "data: [{source: 'gs://good-bkt/x', target: d}]", 2,
     ":3: data.0.source: gs://good-bkt/x: cloud aws cannot give its machines an identity for gs:// buckets"),
    ("gcp", "data: [{source: 's3://good-bkt/x', target: d}]", 2, "cloud gcp cannot give its machines an identity"),
    ("gcp", "data: [{source: 'gs://good-bkt/x', target: d}]\nupload: 'gs://out-bkt/runs'", 0, ": ok"),
    ("aws", "data: [{source: 's3://good-bkt/x', target: d}]\nupload: 's3://out-bkt/runs'", 0, ": ok"),
    ("local", "data: [{source: 'gs://good-bkt/x', target: d}]\nupload: 'az://acct01/cont/p'", 0, ": ok"),
    ("azure", "data: [{source: 'az://acct01/cont/p', target: d}]\nupload: 'az://acct01/out/runs'", 0, ": ok"),
    ("azure", "data: [{source: 's3://good-bkt/x', target: d}]", 2,
     "cloud azure cannot give its machines an identity for s3:// buckets (it can for: az://)"),
]


@pytest.mark.parametrize("cloud, body, code, says", CASES)
def test_validate(tmp_path: Path, cloud: str, body: str, code: int, says: str) -> None:
    machine = {"aws": ", instance_type: t3.medium", "gcp": ", instance_type: n1-standard-4", "local": "",
               "azure": ", instance_type: Standard_D2s_v5"}[cloud]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: bk\nresources: {{cloud: {cloud}{machine}}}\n{body}\nrun: 'true'\n")
    env = {"HOME": str(tmp_path), "CLOUDTRAIN_HOME": str(tmp_path / "ct"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "validate", str(recipe)], capture_output=True,
                          text=True, env=env, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out
    assert says in out
    if code:
        assert len(proc.stderr.strip().splitlines()) == 1, out


def test_a_malformed_propagation_override_is_refused_before_anything_exists(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: bk\nresources: {cloud: aws, instance_type: t3.medium}\n"
                      "data: [{source: 's3://bkt-data/x', target: d}]\nrun: 'true'\n")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CLOUDTRAIN_HOME": str(tmp_path / "ct"),
           "CLOUDTRAIN_GRANT_PROPAGATION_S": "soon"}
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "validate", str(recipe)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CLOUDTRAIN_GRANT_PROPAGATION_S='soon' is not a number of seconds" in proc.stderr
