"""Cleanup that cannot be skipped (issue 22.9): INT (Ctrl-C), TERM (`kill`) and HUP (a closed
terminal) at each phase of `run`, and a second signal during teardown, against moto with sshd VMs.
Each time: nothing that the teardown policy says should go is left running (the fake's own bill
says so), run.json is written and says interrupted, the run directory is the last line printed,
and the exit code is 130.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

JOB = 'touch "$HOME/job-started"; sleep 600'


def _start(cloud: AwsCloud) -> subprocess.Popen:
    args = ["run", str(cloud.recipe(run=JOB)), "--cluster", cloud.cluster, "--runs-dir", str(cloud.runs_dir)]
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], env={**os.environ, **cloud.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _job_started(cloud: AwsCloud) -> bool:
    for instance in cloud.instances(cloud.cluster):
        if instance["InstanceId"] in cloud.machines and (cloud.machines.vm(instance["InstanceId"]).home_dir
                                                         / "job-started").exists():
            return True
    return False


def _assert_cleaned_up(cloud: AwsCloud, proc: subprocess.Popen, out: str, err: str) -> None:
    assert proc.returncode == 130, out + err
    last = out.strip().splitlines()[-1]
    run_dir = Path(last)
    assert run_dir.is_dir() and run_dir.parent == cloud.runs_dir, out
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted", record
    assert record["teardown"] == "down", record  # the run made the cluster: it goes
    assert cloud.bill.running(cloud.cluster) == [], "a VM the run made is still billing"
    clusters = json.loads(cloud.cli("status", "--json").stdout)["clusters"]
    assert cloud.cluster not in [c["name"] for c in clusters]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_signal_while_the_job_runs(aws_cloud: AwsCloud, signum: int) -> None:
    proc = _start(aws_cloud)
    try:
        wait_until(lambda: _job_started(aws_cloud), 300, "the job to start")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _assert_cleaned_up(aws_cloud, proc, out, err)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["INT", "HUP"])
def test_a_second_signal_during_teardown_is_reported_not_obeyed(aws_cloud: AwsCloud, signum: int) -> None:
    """The first signal starts the cleanup; the second arrives while TerminateInstances is in
    flight: it is reported, and the terminate still happens."""
    gate = aws_cloud.faults.hold("TerminateInstances")
    proc = _start(aws_cloud)
    try:
        wait_until(lambda: _job_started(aws_cloud), 300, "the job to start")
        proc.send_signal(signum)
        assert gate.wait_held(300), "teardown never reached TerminateInstances"
        # More signals while the terminate is held: the shield stays up until teardown is done, so
        # whenever the handler runs, they are recorded, not obeyed.
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signum)
        gate.release()
        out, err = proc.communicate(timeout=300)
    finally:
        gate.release()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _assert_cleaned_up(aws_cloud, proc, out, err)
    assert "cleaning up, please wait" in err
