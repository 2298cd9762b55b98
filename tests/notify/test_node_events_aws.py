"""The node tells, on the AWS fake (issue 38, "From the node"): a run with a webhook target on
loopback, its CLI SIGKILLed once the job runs; the VM's watchdog stops the idle instance and the
receiver gets one signed watchdog.stopped from the node itself (verified with `standardwebhooks`).
The next command that talks to the watchdog (`up`) records it as delivered by the node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.notify.signing import new_secret
from cloudtrain.testing.aws import AwsCloud
from tests.notify.receiver import receiving
from tests.watchdog.conftest import decisions, wait_until

TICK_S = 0.5
IDLE_S = 3.0


@pytest.fixture
def cloud(aws_cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> AwsCloud:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", str(TICK_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_SHUTDOWN", f"{sys.executable} -m cloudtrain.testing.metadata ec2-shutdown "
                                                       f"--endpoint {aws_cloud.server.url} --region {aws_cloud.region}")
    return aws_cloud


def test_a_closed_laptop_still_hears_the_watchdog_stop_the_idle_vm(cloud: AwsCloud,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_secret()
    monkeypatch.setenv("HOOK_SECRET", secret)
    cloud.env["HOOK_SECRET"] = secret
    with receiving(secret) as receiver:
        recipe = cloud.recipe(run="sleep 3", autostop={"idle_minutes": 1, "wait_for": "jobs"},
                              notify=[{"webhook": receiver.url, "secret": "${HOOK_SECRET}", "name": "ci hook",
                                       "on": ["watchdog.*", "run.*"]}])
        cli = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", cloud.cluster,
                                "--runs-dir", str(cloud.runs_dir)], cwd=str(cloud.root), env={**os.environ, **cloud.env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            def job_running() -> bool:
                instances = cloud.instances(cloud.cluster)
                # The instance is listed a moment before its VM exists in the fake's machines.
                if not instances or instances[0]["InstanceId"] not in cloud.machines:
                    return False
                jobs = cloud.machines.vm(instances[0]["InstanceId"]).home_dir / ".cloudtrain" / cloud.cluster / "jobs"
                return any((job / "pid").exists() for job in jobs.glob("*")) if jobs.is_dir() else False

            wait_until(job_running, timeout=300, what="the run's job to start on the VM")
        finally:
            os.killpg(cli.pid, signal.SIGKILL)  # the laptop is closed: no run end, no CLI anywhere
            cli.wait(30)
        (instance,) = cloud.instances(cloud.cluster)
        wait_until(lambda: cloud.instances(cloud.cluster)[0]["State"]["Name"] == "stopped", timeout=120,
                   what="the watchdog to stop the idle instance")
        node_events = [e for e in receiver.accepted() if e["source"] == "node"]
        laptop_types = [e["type"] for e in receiver.accepted() if e["source"] == "laptop"]
    # The CLI was killed: its only word is run.started, sent within the run's first second or left in
    # the outbox (a busy machine) for the next command; never a run end.
    assert laptop_types in (["run.started"], [])
    (event,) = node_events  # verified with standardwebhooks by the receiver, with the target's secret
    assert event["type"] == "watchdog.stopped" and event["data"]["cloud"] == "aws"
    assert event["data"]["cluster"] == cloud.cluster and event["data"]["instance"] == instance["InstanceId"]
    assert event["data"]["reason"].startswith("autostop: idle")
    (delivery,) = [d for d in receiver.got if d.verified and d.verified["id"] == event["id"]]
    assert delivery.answered == 204 and delivery.headers["user-agent"].startswith("cloudtrain-watchdog")
    log = Path(cloud.machines.vm(instance["InstanceId"]).home_dir / ".cloudtrain" / cloud.cluster / "watchdog.log")
    assert any(d == "notify" and f"watchdog.stopped {event['id']} to ci hook: delivered" in t for d, t in decisions(log))
    assert secret not in log.read_text() and str(receiver.port) not in log.read_text()

    # The next command that talks to the watchdog (this `up` starts the stopped VM again) records it.
    again = cloud.up(recipe)
    assert again.ok, again.output
    listed = cloud.cli("events", "--json")
    assert listed.ok, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    (row,) = [r for r in rows if r["id"] == event["id"]]
    assert row["source"] == "node" and [(d["target"], d["state"]) for d in row["deliveries"]] == [
        ("ci hook", "delivered")]
    assert secret not in listed.stdout
    again = cloud.cli("events", "--retry")  # delivered by the node: never sent again
    assert again.ok and "sent 0" in again.stdout, again.output
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []
