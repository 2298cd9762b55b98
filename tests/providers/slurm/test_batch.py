"""What a recipe becomes on Slurm: sbatch options, the time limit, the plan, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cloudtrain.errors import CloudtrainError
from cloudtrain.preflight import unsupported
from cloudtrain.providers.slurm.batch import comment, job_name, sbatch_options, submit_script, time_minutes
from cloudtrain.providers.slurm.plan import plan_document, plan_lines
from cloudtrain.recipe import Recipe, load_recipe

LOGIN = {"address": "login.example", "user": "me"}


def recipe(tmp_path: Path, **fields: object) -> Recipe:
    resources = {"cloud": "slurm", "hosts": [LOGIN], **fields.pop("resources", {})}  # type: ignore[dict-item]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "run": "echo hi", "resources": resources, **fields}))
    return load_recipe(path).recipe


@pytest.mark.parametrize("fields,options", [
    ({}, ["--nodes=1"]),
    ({"num_nodes": 4}, ["--nodes=4"]),
    ({"resources": {"slurm": {"partition": "gpu", "account": "lab", "qos": "high"}}},
     ["--nodes=1", "--partition=gpu", "--account=lab", "--qos=high"]),
    ({"resources": {"slurm": {"partition": ""}}}, ["--nodes=1"]),
    ({"resources": {"accelerators": "A100:2"}}, ["--nodes=1", "--gres=gpu:2"]),
    ({"resources": {"slurm": {"cpus_per_node": 8}}}, ["--nodes=1", "--cpus-per-task=8"]),
    ({"budget": {"max_hours": 1.5}}, ["--nodes=1", "--time=90"]),
    ({"budget": {"max_hours": 0.001}}, ["--nodes=1", "--time=1"]),
    ({"budget": {"max_hours": 2}, "resources": {"slurm": {"time_minutes": 30}}}, ["--nodes=1", "--time=30"]),
])
def test_sbatch_options(tmp_path: Path, fields: dict, options: list[str]) -> None:
    assert sbatch_options(recipe(tmp_path, **fields)) == options


@pytest.mark.parametrize("fields,refused", [
    ({"resources": {"slurm": {"partition": "--wrap=evil"}}}, "partition"),
    ({"resources": {"slurm": {"partition": "a b"}}}, "partition"),
    ({"resources": {"slurm": {"time_minutes": 0}}}, "time_minutes"),
    ({"resources": {"slurm": {"nodes": 2}}}, "nodes"),
    ({"resources": {"hosts": [LOGIN, LOGIN]}}, "login node"),
])
def test_refused_at_load(tmp_path: Path, fields: dict, refused: str) -> None:
    with pytest.raises(CloudtrainError, match=refused):
        recipe(tmp_path, **fields)


def test_the_slurm_block_belongs_to_slurm(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "run": "x", "resources": {"cloud": "local", "slurm": {}}}))
    with pytest.raises(CloudtrainError, match="'slurm' only applies"):
        load_recipe(path)


@pytest.mark.parametrize("fields,problem", [
    ({"resources": {"region": "x"}}, "resources.region"),
    ({"resources": {"spot": True}}, "resources.spot"),
    ({"budget": {"max_usd": 5}}, "budget.max_usd"),
    ({"autostop": {"idle_minutes": 5}}, "autostop"),
    ({"budget": {"max_hours": 1}}, None),
    ({"resources": {"accelerators": "V100:1"}}, None),
])
def test_what_preflight_refuses(tmp_path: Path, fields: dict, problem: str | None) -> None:
    found = unsupported(recipe(tmp_path, **fields))
    assert (found[0] if found else None) == problem


def test_the_submit_script_carries_the_settings(tmp_path: Path) -> None:
    r = recipe(tmp_path, num_nodes=2, resources={"slurm": {"partition": "gpu"}}, budget={"max_hours": 1})
    script = submit_script(r, "echo run\n", "echo setup", "run-1-run", "me", "s")
    assert f"CT_NAME={job_name('run-1-run')}" in script and f"CT_COMMENT={comment('me', 's')}" in script
    assert "set -- --nodes=2 --partition=gpu --time=60" in script
    assert "CT_SETUP='echo setup'" in script and "sbatch --parsable" in script
    assert time_minutes(r) == 60


@pytest.mark.parametrize("fields,cost", [
    ({}, "cost: $0"),
    ({"budget": {"max_hours": 2}, "num_nodes": 2,
      "resources": {"accelerators": "A100:4", "slurm": {"gpu_hour_usd": 1.5}}}, "cost: at most $24.00"),
    ({"resources": {"accelerators": "A100:1", "slurm": {"gpu_hour_usd": 1.5}}}, "no time limit"),
])
def test_the_plan_says_where_and_what_it_costs(tmp_path: Path, fields: dict, cost: str) -> None:
    r = recipe(tmp_path, **fields)
    lines = plan_lines(r)
    assert lines[0].startswith("plan: one Slurm batch job") and "me@login.example:22" in lines[0]
    assert any(line.startswith("cost: ") and cost in line for line in lines), lines
    assert plan_document(r)["sbatch"] == sbatch_options(r)


def test_plan_and_validate_through_the_cli(tmp_path: Path) -> None:
    from tests.conftest import cloudtrain

    r = tmp_path / "r.yaml"
    r.write_text(yaml.safe_dump({"name": "s", "run": "x", "num_nodes": 2, "budget": {"max_hours": 1},
                                 "resources": {"cloud": "slurm", "hosts": [LOGIN], "slurm": {"partition": "gpu"}}}))
    plan = cloudtrain("plan", str(r))
    assert plan.returncode == 0 and "sbatch --nodes=2 --partition=gpu --time=60" in plan.stdout, plan.stderr
    assert "cost: $0" in plan.stdout
    valid = cloudtrain("validate", str(r))
    assert valid.returncode == 0 and "cloud slurm, 2 node(s)" in valid.stdout, valid.stderr
    r.write_text(r.read_text().replace("max_hours: 1", "max_usd: 5"))
    refused = cloudtrain("validate", str(r))
    assert refused.returncode == 2 and "budget.max_usd" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2
