"""The transfer `plan` warns about: a bucket in another region, or in another cloud."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.buckets.egress import egress_for


def own_home(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "CLOUDTRAIN_HOME": str(tmp_path / "ct")}


def mount(source: str, region: str | None, size_gb: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(source=source, region=region, size_gb=size_gb, is_bucket="://" in source)


@pytest.mark.parametrize("source, region, size, cloud, run_region, expected", [
    ("s3://bkt-a/x", "us-west-2", 150, "aws", "us-east-1", ("inter-region", 0.02, 3.0)),
    ("s3://bkt-a/x", "us-east-1", 150, "aws", "us-east-1", None),
    ("s3://bkt-a/x", "us-east-1", 10, "gcp", "us-central1", ("internet", 0.09, 0.9)),
    ("gs://bkt-a/x", "us-central1", None, "gcp", "us-east1", ("inter-region", 0.02, None)),
    ("az://acct01/cont/x", "eastus", 2, "aws", "us-east-1", ("internet", 0.087, 0.17)),
    ("s3://bkt-a/x", None, 150, "aws", "us-east-1", None),  # region unknown: nothing to say
    ("./local", None, None, "aws", "us-east-1", None),
])
def test_egress(source: str, region: str | None, size: float | None, cloud: str, run_region: str,
                expected: tuple | None) -> None:
    found = egress_for(SimpleNamespace(data=[mount(source, region, size)]), cloud, run_region)
    if expected is None:
        assert found == ()
        return
    (crossing,) = found
    assert (crossing.scope, crossing.usd_per_gb, crossing.usd) == expected
    assert crossing.source in crossing.line() and (str(size) in crossing.line() if size else "size_gb" in crossing.line())


def test_plan_warns_with_an_estimate(moto_server, tmp_path: Path) -> None:  # noqa: ANN001
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: bk\nresources: {cloud: aws, instance_type: t3.medium, region: us-east-1}\n"
                      "data: [{source: 's3://far-bkt/x', target: d, region: us-west-2, size_gb: 150}]\nrun: 'true'\n")
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", str(recipe)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=own_home(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert ("s3://far-bkt/x is in us-west-2, the plan runs in us-east-1: inter-region transfer at $0.02/GB, "
            "about $3.00 per full copy of 150 GB") in proc.stderr


def test_region_on_a_local_source_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: bk\nresources: {cloud: local}\ndata: [{source: d, target: d, region: us-east-1}]\n"
                      "run: 'true'\n")
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "validate", str(recipe)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=own_home(tmp_path))
    assert proc.returncode == 2 and "region and size_gb describe a bucket source" in proc.stderr


def test_plan_says_why_it_runs_next_to_the_data(moto_server, tmp_path: Path) -> None:  # noqa: ANN001
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: bk\nresources: {cloud: aws, accelerators: 'T4:1'}\nbudget: {max_hours: 10}\n"
                      "data: [{source: 's3://far-bkt/x', target: d, region: eu-west-1, size_gb: 1000}]\nrun: 'true'\n")
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", str(recipe)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=own_home(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "in aws/eu-west-1" in proc.stdout + proc.stderr
    assert ("next to the data: g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h is cheaper per hour, but copying "
            "the data there costs about $20.00") in proc.stdout
    assert "is in eu-west-1, the plan runs in" not in proc.stderr  # no transfer where it runs
