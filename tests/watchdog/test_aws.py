"""The watchdog on AWS, end to end: `cloudtrain up` against moto, every instance an sshd VM, and the
CLI gone while the VM decides by itself.

An sshd VM cannot power off, so its shutdown command is a stand-in doing what EC2 does when an
instance's OS shuts down (cloudtrain.testing.metadata ec2-shutdown): it reads the instance's
InstanceInitiatedShutdownBehavior and calls StopInstances or TerminateInstances for its own id.
The aws_cloud fake then powers the VM off (its sessions, jobs and watchdog end). So these tests
check the launch's shutdown behaviour and a live `autostop --down` too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing.aws import AwsCloud
from tests.watchdog.conftest import (
    autostop_cli,
    decisions,
    idle_period_now,
    logged_in,
    wait_busy_beyond_idle,
    wait_until,
)

# Short, so the waits on them are short: a busy run spans ticks_covering(IDLE_S, TICK_S) ticks.
TICK_S = 0.25
IDLE_S = 1.5


@pytest.fixture
def cloud(aws_cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> AwsCloud:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", str(TICK_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_SHUTDOWN", f"{sys.executable} -m cloudtrain.testing.metadata ec2-shutdown "
                                                       f"--endpoint {aws_cloud.server.url} --region {aws_cloud.region}")
    return aws_cloud


def the_instance(cloud: AwsCloud) -> dict[str, Any]:
    (instance,) = cloud.instances(cloud.cluster)
    return instance


def state(cloud: AwsCloud) -> str:
    return str(the_instance(cloud)["State"]["Name"])


def shutdown_behavior(cloud: AwsCloud) -> str:
    answer = cloud.server.client("ec2", cloud.region, internal=True).describe_instance_attribute(
        InstanceId=the_instance(cloud)["InstanceId"], Attribute="instanceInitiatedShutdownBehavior")
    return str(answer["InstanceInitiatedShutdownBehavior"]["Value"])


def watchdog_log(cloud: AwsCloud) -> Path:
    vm = cloud.machines.vm(the_instance(cloud)["InstanceId"])
    return vm.home_dir / ".cloudtrain" / cloud.cluster / "watchdog.log"


def up(cloud: AwsCloud, **fields: Any) -> None:
    result = cloud.up(cloud.recipe(run="echo hi", **fields))
    assert result.ok, result.output
    assert "watchdog: " in result.stdout  # started; persistence is off in tests, on purpose: nothing warned
    assert "watchdog started detached" not in result.stderr + result.stdout


def finish(cloud: AwsCloud) -> None:
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []


def test_idle_instance_stops_itself_once_the_ssh_session_ends(cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the user logs in
    up(cloud, autostop={"idle_minutes": 1})
    assert shutdown_behavior(cloud) == "stop"  # launched so that an OS shutdown stops it
    vm = cloud.machines.vm(the_instance(cloud)["InstanceId"])
    # A user logged in: an SSH session of its own, no job.
    with logged_in(vm, cloud.machines.factory.client_key.private_path):
        idle_period_now(cloud, monkeypatch, IDLE_S)
        wait_busy_beyond_idle(watchdog_log(cloud), IDLE_S, TICK_S, "1 ssh session(s)", after_config=True)
        assert state(cloud) == "running"
    wait_until(lambda: state(cloud) == "stopped", what="the instance to stop itself")
    log = decisions(watchdog_log(cloud))
    assert any(d == "stop" and detail.startswith("autostop: idle") for d, detail in log)
    finish(cloud)


def test_with_down_a_running_job_keeps_it_until_the_job_ends_then_it_terminates(
    cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the job runs
    up(cloud, autostop={"idle_minutes": 60, "down": True})
    assert shutdown_behavior(cloud) == "terminate"  # launched so that an OS shutdown terminates it
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    # A live change reaches the instance, not only the node, both ways: stop, then down again.
    kept = autostop_cli(cloud, cloud.cluster, "-i", "60")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert shutdown_behavior(cloud) == "stop"
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    live = autostop_cli(cloud, cloud.cluster, "-i", "1", "--down")
    assert live.returncode == 0, live.stdout + live.stderr
    assert shutdown_behavior(cloud) == "terminate"
    wait_busy_beyond_idle(watchdog_log(cloud), IDLE_S, TICK_S, "job(s) running")
    assert state(cloud) == "running"
    cancel = cloud.cli("cancel", cloud.cluster)
    assert cancel.ok, cancel.output
    wait_until(lambda: state(cloud) == "terminated", what="the instance to terminate itself")
    assert any(d == "delete" and detail.startswith("autostop: idle") for d, detail in decisions(watchdog_log(cloud)))
    finish(cloud)


def test_run_after_the_watchdog_stopped_the_cluster_starts_it_again(cloud: AwsCloud,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The longer idle period this test always had: the restarted node must not stop itself in a gap
    # between the run's steps (jobs only count while they run).
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3")
    # State still says `up` (nobody told this laptop); the run must not hang on a stopped machine.
    recipe = cloud.recipe(run="echo again", autostop={"idle_minutes": 1, "wait_for": "jobs"})
    result = cloud.up(recipe)
    assert result.ok, result.output
    wait_until(lambda: state(cloud) == "stopped", what="the instance to stop itself")
    again = cloud.run(recipe)
    assert again.ok, again.output
    assert "was stopped while cloudtrain was away" in again.output and "again" in again.output
    # Left as the run found it: stopped (the run started it, so it stops it again).
    wait_until(lambda: state(cloud) == "stopped", what="the run to stop the cluster again")
    status = cloud.cli("status", cloud.cluster, "--json")
    assert status.ok and '"stopped"' in status.stdout, status.output
    finish(cloud)


def test_a_job_whose_gpus_idle_stops_the_instance_and_a_busy_gpu_never_does(
    cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """autostop.gpu_util_below (issue 39.2) through `cloudtrain up`, with nvidia-smi scripted on the
    VM's PATH: a job with a GPU at 50% keeps it up past the idle period; every GPU under the
    threshold stops it while the job still runs. That a hung or failing sampler keeps a node busy
    is the node program's rule, the same on every cloud: tests/watchdog/test_gpu_rule.py."""
    from tests.watchdog.conftest import FakeGpus

    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the job runs
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_GPU_SAMPLE_S", str(TICK_S))
    autostop = {"idle_minutes": 1, "wait_for": "jobs", "gpu_util_below": 10}  # this test's SSH calls: no activity
    recipe = cloud.recipe(run="echo hi", autostop=autostop)
    assert cloud.up(recipe).ok
    gpus = FakeGpus(cloud.machines.vm(the_instance(cloud)["InstanceId"]).bin_dir, tmp_path / "gpus")
    gpus.set("50 0")
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    again = cloud.up(recipe)  # the recipe's settings again, with the short idle period: one round trip
    assert again.ok, again.output
    log = watchdog_log(cloud)
    wait_busy_beyond_idle(log, IDLE_S, TICK_S, "gpu 50%,0% (not all < 10%)", after_config=True)
    assert state(cloud) == "running"
    gpus.set("0 0")
    wait_until(lambda: state(cloud) == "stopped", timeout=IDLE_S + 60, what="the instance to stop itself")
    (stop,) = [detail for d, detail in decisions(log) if d == "stop" and "->" in detail]
    assert stop.startswith("autostop: idle")
    # Idle while the job still ran: the GPUs said so.
    assert any(d == "idle" and "jobs running 1," in detail and "gpu 0%,0% < 10%" in detail for d, detail in decisions(log))
    finish(cloud)
