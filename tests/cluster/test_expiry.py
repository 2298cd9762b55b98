"""Stopped, then deleted (issue 39.3), end to end on the AWS and GCP fakes: `up` with
`autostop: {idle_minutes, delete_after_stopped_days: 7}`, the watchdog stops the idle VM, and
`cloudtrain gc --expired` judges it by the kit's clock (CLOUDTRAIN_NOW, moved 8 days ahead):
listed before, nothing changed without --yes, deleted with its disks with --yes; and a stopped VM
of live work in another CLOUDTRAIN_HOME of the same owner (its liveness mark fresh) is never deleted.

Neither cloud's VM here tags itself (no instance role on EC2; a stop-only GCE VM has no service
account): the days ride on the launch request's tag, and the stop time is the cloud's own
(StateTransitionReason, lastStopTimestamp). The node's own tag (Azure, a GCE VM with the compute
scope) is tests/watchdog/test_expiry_mark.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from tests.lazy import requires
from tests.watchdog.conftest import wait_until

if not sshd.sshd_available():
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

DAYS = 7
LATER_S = 8 * 86400  # the kit's clock, moved past the 7 days


def quick_stops(cloud: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", "0.5")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    for name, value in cloud.watchdog_env().items():
        monkeypatch.setenv(name, value)


def recipe(cloud: Any) -> Path:
    # wait_for: jobs: the CLI's own SSH connections are no activity; the VM stops 3 s after `up`.
    return cloud.recipe(run="true", autostop={"idle_minutes": 1, "wait_for": "jobs",
                                              "delete_after_stopped_days": DAYS})


def gc_expired(cloud: Any, *args: str, at: float, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **cloud.env, "CLOUDTRAIN_NOW": str(at)}
    if home is not None:
        env["CLOUDTRAIN_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "cloudtrain", "gc", "--expired", "--cloud", cloud.name, "--json",
                           *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def mine(answer: subprocess.CompletedProcess, cluster: str) -> dict[str, Any]:
    document = json.loads(answer.stdout)
    (found,) = [e for e in document["expired"] if e["cluster"] == cluster]
    return found


def elsewhere(cloud: Any, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **cloud.env, "CLOUDTRAIN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def mark_alive(cloud: Any, cluster: str, at: float) -> None:
    """The other state's command renewing its liveness mark at `at`, through the cloud's API."""
    from cloudtrain.config import load_config
    from cloudtrain.providers import get_provider

    provider = get_provider(cloud.name, load_config(cloud.config_path))
    provider.mark_alive([i.id for i in provider.list_tagged(cluster)], at)


def expires(cloud: Any, state_of: Any, tags_of: Any) -> None:
    """The common flow, with the cluster in this test's state: stop, listed, kept, deleted."""
    assert cloud.up(recipe(cloud)).ok
    wait_until(lambda: state_of() == "stopped", 120, "the watchdog to stop the idle VM")
    assert tags_of()["cloudtrain-delete-after-stopped-days"] == str(DAYS)
    now = time.time()

    early = gc_expired(cloud, "--yes", at=now + 3600)
    assert early.returncode == 0, early.stdout + early.stderr
    found = mine(early, cloud.cluster)
    assert not found["delete"] and now + (DAYS * 86400) - 300 < found["due"] < now + DAYS * 86400 + 60, found
    assert found["daily_usd"] > 0 and found["tracked"], found  # what its disks cost meanwhile
    assert state_of() == "stopped"

    listed = gc_expired(cloud, at=now + LATER_S)
    assert listed.returncode == 1, listed.stdout + listed.stderr  # due, and no --yes
    assert mine(listed, cloud.cluster)["delete"] and json.loads(listed.stdout)["removed"] == []
    assert state_of() == "stopped" and cloud.leftovers() != []  # nothing changed: it is all still there

    removed = gc_expired(cloud, "--yes", at=now + LATER_S)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert any(f"deleted {cloud.cluster}" in line for line in json.loads(removed.stdout)["removed"]), removed.stdout
    assert cloud.leftovers() == []  # the VM, its disks, its key and firewall, its state row


@requires("moto")
def test_aws_an_idle_stop_expires_and_gc_deletes_it_with_its_disks(aws_cloud: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    quick_stops(aws_cloud, monkeypatch)

    def instance() -> dict[str, Any]:
        (found,) = aws_cloud.instances(aws_cloud.cluster)
        return found

    expires(aws_cloud, lambda: instance()["State"]["Name"],
            lambda: {t["Key"]: t["Value"] for t in instance().get("Tags", [])})
    ec2 = aws_cloud.server.client("ec2", aws_cloud.region, internal=True)
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:cloudtrain-cluster", "Values": [aws_cloud.cluster]}])
    assert volumes["Volumes"] == []


@requires("google.cloud.compute_v1")
def test_gcp_an_idle_stop_expires_and_gc_deletes_it_with_its_disks(gcp_cloud: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    quick_stops(gcp_cloud, monkeypatch)

    def instance() -> dict[str, Any]:
        ((_, found),) = gcp_cloud.instances(gcp_cloud.cluster)
        return found

    expires(gcp_cloud, lambda: {"TERMINATED": "stopped"}.get(instance()["status"], instance()["status"]),
            lambda: instance()["labels"])


@requires("moto")
def test_a_stopped_vm_of_live_work_in_another_home_is_never_deleted(aws_cloud: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    quick_stops(aws_cloud, monkeypatch)
    other = tmp_path / "other-home"
    up = elsewhere(aws_cloud, other, "up", str(recipe(aws_cloud)), "--cluster", aws_cloud.cluster)
    assert up.returncode == 0, up.stdout + up.stderr

    def state() -> str:
        (found,) = aws_cloud.instances(aws_cloud.cluster)
        return str(found["State"]["Name"])

    wait_until(lambda: state() == "stopped", 120, "the watchdog to stop the idle VM")
    later = time.time() + LATER_S
    # Eight days on, a command of the other state holds the cluster: its mark is fresh then.
    mark_alive(aws_cloud, aws_cloud.cluster, later - 60)
    kept = gc_expired(aws_cloud, "--yes", at=later)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    found = mine(kept, aws_cloud.cluster)
    assert not found["delete"] and "live work holds it" in found["why"] and not found["tracked"], found
    assert state() == "stopped"
    # That command ended hours ago: nothing holds it any more, and it goes.
    mark_alive(aws_cloud, aws_cloud.cluster, later - 3 * 3600)
    gone = gc_expired(aws_cloud, "--yes", at=later)
    assert gone.returncode == 0 and mine(gone, aws_cloud.cluster)["delete"], gone.stdout + gone.stderr
    assert aws_cloud.instances(aws_cloud.cluster, states=("pending", "running", "stopping", "stopped")) == []
    down = elsewhere(aws_cloud, other, "down", aws_cloud.cluster)  # the other state forgets it
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws_cloud.leftovers() == []
