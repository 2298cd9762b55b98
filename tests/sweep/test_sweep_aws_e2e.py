"""A 4-trial sweep against the EC2 API (moto's server) whose instances are sshd VMs, 2 at a time.

Wiring as in tests/e2e/test_aws_e2e.py: boto3 talks HTTP to moto, `ssh.proxy_command` sends the
fake public IPs to two pooled loopback sshd VMs that trust moto's key pairs. What we assert about
the cloud we read back from moto through the EC2 API.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.base import TAG_CLUSTER
from cloudtrain.testing import sshd
from cloudtrain.testing.aws import MotoServer
from cloudtrain.testing.wait import wait_until
from tests.conftest import cloudtrain
from tests.sweep.conftest import start_sweep_cli, sweep_cli

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

REGION = "us-east-1"
LIVE = ["pending", "running", "stopping", "stopped"]


def _ec2_sweep(moto_server: MotoServer, sshd_vm_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               vms: int, values: str, parallel: int) -> Path:
    """Config (fake public IPs routed to `vms` pooled sshd VMs) and a grid sweep over X on t3.medium."""
    pool = [sshd_vm_factory.start(pool=True, authorized_keys_command=moto_server.authorized_keys_command(REGION))
            for _ in range(vms)]
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent(f"""\
        ssh:
          proxy_command: {json.dumps(sshd_vm_factory.proxy_command)}
          allowed_cidr: 203.0.113.7/32
          connect_retries_s: 60
        aws:
          region: {REGION}
        """))
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    ami = moto_server.register_image(ssh_user=pool[0].user, region=REGION)
    (tmp_path / "code").mkdir()
    recipe = tmp_path / "sweep-ec2.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: sweep-ec2
        resources: {{cloud: aws, region: {REGION}, instance_type: t3.medium, image: {ami}}}
        workdir: code
        results: [outputs]
        run: |
          mkdir -p outputs
          echo "{{\\"loss\\": $(( (X - 3) * (X - 3) )), \\"host\\": \\"$(hostname)\\"}}" > outputs/metrics.json
        sweep:
          method: grid
          parameters: {{X: {values}}}
          max_parallel: {parallel}
          budget_usd: 1
          metric: loss
          goal: min
          trial_deadline_minutes: 2
          reserve: {{boot_minutes: 3, setup_minutes: 3, collect_minutes: 1, release_minutes: 1}}
        """))
    return recipe


def test_four_trials_two_at_a_time_on_ec2_end_with_nothing_running_though_the_first_releases_fail(
    moto_server: MotoServer, sshd_vm_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 7 too: when `down` failed, the backend told the scheduler the VM was gone (its
    money reused, the VM left billing). Now the VM stays counted to its lease end and the release is
    asked again until EC2 confirms it gone; the sweep's spend is the ledger's, as `cost` says."""
    recipe = _ec2_sweep(moto_server, sshd_vm_factory, tmp_path, monkeypatch, vms=2, values="[1, 2, 3, 4]", parallel=2)
    # A sweep on a priced cloud is approved once, for its budget: no terminal and no --yes, nothing starts.
    refused = sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "hard budget $1" in refused.stderr and "--yes" in refused.stderr
    assert not (tmp_path / "runs").exists()
    # Both VMs are released at the sweep's end, one trial's time apart: every try of each one's first
    # release fails (the backend tries RELEASE_TRIES times, the faults go to the first requests,
    # whichever VM's), the retries work.
    from cloudtrain.sweep.backend import RELEASE_TRIES

    moto_server.faults.add("UnauthorizedOperation", action="TerminateInstances", status=403,
                           times=2 * RELEASE_TRIES)
    proc = sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), "--yes", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "not confirmed gone" in proc.stdout and "counted until its lease end" in proc.stderr, proc.stdout
    assert moto_server.faults.count("TerminateInstances") >= 2 * RELEASE_TRIES + 2
    results = Path(proc.stdout.strip().splitlines()[-1])
    rows = list(csv.DictReader((results / "sweep.csv").open()))
    assert (rows[0]["X"], rows[0]["state"], rows[0]["loss"]) == ("3", "succeeded", "0.0")
    assert {r["state"] for r in rows} == {"succeeded"} and len(rows) == 4

    ec2 = moto_server.client("ec2", REGION)
    sweep_id = results.name.removeprefix("sweep-")
    instances = [i for r in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [TAG_CLUSTER]}])["Reservations"]
                 for i in r["Instances"]]
    # The moto server may be shared with other tests of the session: look at this sweep's clusters only.
    ours = [i for i in instances
            if any(t["Key"] == TAG_CLUSTER and t["Value"].startswith(f"sw-{sweep_id}-") for t in i["Tags"])]
    instances = ours
    clusters = {t["Value"] for i in instances for t in i["Tags"] if t["Key"] == TAG_CLUSTER}
    assert clusters == {f"sw-{sweep_id}-0", f"sw-{sweep_id}-1"}  # two VMs, each reused for a second trial
    assert [i for i in instances if i["State"]["Name"] in LIVE] == []
    for name in clusters:
        tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [name]}]
        assert ec2.describe_key_pairs(Filters=tag)["KeyPairs"] == []
        assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []
    summary = json.loads((results / "sweep.json").read_text())
    assert summary["status"] == "done" and summary["vms_booted"] == 2
    assert 0 < summary["spent_usd"] <= summary["budget_usd"]
    # One ledger: the sweep reports per cluster incarnation exactly what `cloudtrain cost` does, and
    # each VM (much shorter than a minute here) is billed at least EC2's 60 s minimum per start.
    billed = json.loads(cloudtrain("cost", "--json").stdout)["incarnations"]
    ours = {b["incarnation"]: b["usd"] for b in billed if b["cluster"].startswith(f"sw-{sweep_id}-")}
    reported = {i["incarnation"]: i["usd"] for vm in summary["vms"] for i in vm["incarnations"]}
    assert reported.keys() == ours.keys() and len(ours) == 2
    for incarnation, usd in ours.items():
        assert abs(reported[incarnation] - usd) < 1e-6, (incarnation, reported[incarnation], usd)
        assert usd >= 0.0416 * 60 / 3600 - 1e-9  # t3.medium in us-east-1, one 60 s minimum at least
    assert abs(summary["spent_usd"] - sum(ours.values())) < 1e-5
    assert summary["billing_now"] is False
    status = json.loads(sweep_cli("status", sweep_id, "--json").stdout)
    assert abs(status["spent_usd"] - summary["spent_usd"]) < 1e-5
    assert json.loads(cloudtrain("status", "--json").stdout)["clusters"] == []


def test_a_vm_terminated_under_its_trial_is_seen_by_asking_ec2_and_the_trial_runs_again(
    moto_server: MotoServer, sshd_vm_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 7: a VM terminated under a trial was noticed only after the SSH retries (here
    SSH never fails: the node's sshd lives on, as a machine whose answer lags its deletion). The
    backend asks EC2 while the trial runs: the attempt ends preempted and runs again on a new VM."""
    recipe = _ec2_sweep(moto_server, sshd_vm_factory, tmp_path, monkeypatch, vms=2, values="[3]", parallel=1)
    marks = tmp_path / "marks"
    marks.mkdir()
    text = recipe.read_text().replace("  mkdir -p outputs\n", f"""  echo "$CLOUDTRAIN_SWEEP_ATTEMPT" >> {marks}/started
  if [ "$CLOUDTRAIN_SWEEP_ATTEMPT" = 1 ]; then while [ ! -f {marks}/go ]; do sleep 0.2; done; fi
  mkdir -p outputs
""")
    # The sweep's watcher asks EC2 every recover.watch_s (the recipe's; 15 s without): each second here.
    recipe.write_text(text.replace("sweep:\n", "recover: {watch_s: 1}\nsweep:\n", 1))
    proc = start_sweep_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), "--yes", cwd=tmp_path)
    ec2 = moto_server.client("ec2", REGION)
    try:
        started = marks / "started"
        _wait_for(lambda: started.exists() and started.read_text().split() == ["1"], "attempt 1's job")
        # (Its id from its results directory: no second cloudtrain process while this one runs.)
        (results,) = (tmp_path / "runs").glob("sweep-*")
        sweep = {"id": results.name.removeprefix("sweep-")}
        tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [f"sw-{sweep['id']}-0"]},
               {"Name": "instance-state-name", "Values": ["running"]}]
        ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]
        assert len(ids) == 1
        ec2.terminate_instances(InstanceIds=ids)
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            rest = proc.communicate()
            raise AssertionError(f"the sweep did not end: {exc.stdout!r}{rest[0]}\n{exc.stderr!r}{rest[1]}") from None
    finally:
        (marks / "go").touch()  # attempt 1's job, still running on its sshd, ends
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    detail = json.loads(sweep_cli("status", sweep["id"], "--json").stdout)
    assert sorted((a["attempt"], a["state"]) for a in detail["attempts"]) == [(1, "preempted"), (2, "succeeded")]
    billed = json.loads(cloudtrain("cost", "--json").stdout)["incarnations"]
    ours = {b["incarnation"]: b for b in billed if b["cluster"].startswith(f"sw-{sweep['id']}-")}
    # Each figure is rounded to the micro-dollar on its own: a sum of two may differ by one more.
    assert len(ours) == 2 and abs(detail["spent_usd"] - sum(b["usd"] for b in ours.values())) < 2e-6 + 1e-12
    assert json.loads(cloudtrain("status", "--json").stdout)["clusters"] == []


def _wait_for(predicate: Any, what: str, timeout: float = 180.0) -> None:
    wait_until(predicate, timeout, what)
