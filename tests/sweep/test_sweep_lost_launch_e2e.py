"""A sweep whose CLI died during a VM's create call (issue 34.3): EC2 made the VM, nobody heard, and
its deadline ended it before anyone looked. `sweep resume` runs the trial on a new VM, and the
sweep's spend is the ledger's with the lost launch's VM in it (never $0 for a VM the bill has),
equal to `cost`; the budget left is what the bill leaves, not the lease's worst case."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import MotoServer
from cloudtrain.testing.faults import kill_cli_at
from cloudtrain.testing.wait import wait_until
from tests.conftest import cli_env, cloudtrain
from tests.sweep.conftest import sweep_cli
from tests.sweep.test_sweep_aws_e2e import REGION, _ec2_sweep

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def test_a_launch_whose_answer_was_lost_is_in_the_sweeps_spend_after_resume(
    moto_server: MotoServer, sshd_vm_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _ec2_sweep(moto_server, sshd_vm_factory, tmp_path, monkeypatch, vms=2, values="[3]", parallel=1)
    gate = moto_server.faults.hold("RunInstances", after=True)
    kill_cli_at(gate, ["sweep", "run", str(recipe), "--runs-dir", str(tmp_path / "runs"), "--yes"], cli_env())
    (listed,) = json.loads(sweep_cli("status", "--json").stdout)["sweeps"]
    sweep_id = listed["id"]
    ec2 = moto_server.client("ec2", REGION)

    def instances() -> list[dict]:
        found = ec2.describe_instances(Filters=[{"Name": "tag:cloudtrain-cluster", "Values": [f"sw-{sweep_id}-*"]}])
        return [i for r in found["Reservations"] for i in r["Instances"]]

    wait_until(lambda: len(instances()) == 1, 60, "EC2 to list the VM nobody heard of")
    # Its lease's deadline ends it before anyone looks (here: now, through EC2, as its OS shutdown would).
    ec2.terminate_instances(InstanceIds=[instances()[0]["InstanceId"]])
    wait_until(lambda: instances()[0]["State"]["Name"] == "terminated", 60, "EC2 to end it")
    resumed = sweep_cli("resume", sweep_id, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads(sweep_cli("status", sweep_id, "--json").stdout)
    assert summary["status"] == "done", summary
    assert [t["state"] for t in summary["trials"]] == ["succeeded"], summary["trials"]
    assert {i["State"]["Name"] for i in instances()} == {"terminated"} and len(instances()) == 2
    # The sweep's spend is the ledger's, per incarnation, the lost launch's VM included.
    billed = json.loads(cloudtrain("cost", "--json").stdout)["incarnations"]
    ours = {b["incarnation"]: b["usd"] for b in billed if b["cluster"].startswith(f"sw-{sweep_id}-")}
    assert len(ours) == 2 and all(usd >= 0.0416 * 60 / 3600 - 1e-6 for usd in ours.values()), ours  # one minimum each
    assert abs(summary["spent_usd"] - sum(ours.values())) < 1e-5, (summary["spent_usd"], ours)
    # One number per run (issue 35.11): the leaderboard's trial cost is the run's row in `cost`, and
    # what the sweep spent beyond its trials (boots, idle VMs, minimums) is said, so the rows add up.
    results = Path(summary["results_dir"]) if "results_dir" in summary else next((tmp_path / "runs").rglob("sweep.csv")).parent
    (row,) = list(csv.DictReader((results / "sweep.csv").open()))
    runs = json.loads(cloudtrain("cost", "--json").stdout)["runs"]
    trial_runs = [r for r in runs if r["cluster"].startswith(f"sw-{sweep_id}-")]
    assert float(row["cost_usd"]) == pytest.approx(sum(r["usd"] for r in trial_runs), abs=2e-6), (row, trial_runs)
    assert sum(r["usd"] for r in trial_runs) <= summary["spent_usd"] + 1e-6
    board = (results / "leaderboard.txt").read_text()
    assert "outside trials" in board or float(row["cost_usd"]) == pytest.approx(summary["spent_usd"], abs=1e-4), board
