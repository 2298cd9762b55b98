"""The node keeps its own liveness mark (issue 34.1): with no CLI holding the cluster (a detached
job, the laptop closed), the watchdog renews the instance's `cloudtrain-alive` label (GCP) or tag
(Azure) with the machine's own identity while a job runs, so `gc --yes` from another state leaves
the machine alone; once the job is over and the node idles, nobody renews it and the mark ages.

The marks are made old through the cloud's API first (`age_marks`: as if the launch were hours ago),
so a fresh mark can only be the node's. The renewal is every CLOUDTRAIN_WATCHDOG_MARK_S (0.5 s here,
300 s for real). Against the fake Compute Engine and the fake ARM, with their metadata servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from tests.conftest import cli_as
from tests.lazy import requires
from tests.watchdog.conftest import decisions, wait_until

if not sshd.sshd_available():
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

MARK_S = 0.5
AGED_S = 3 * 3600


def quick_marks(cloud: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", "0.25")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing stops the node in these tests
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_MARK_S", str(MARK_S))
    for name, value in cloud.watchdog_env().items():
        monkeypatch.setenv(name, value)


def elsewhere(cloud: Any, home: Path, *args: str) -> subprocess.CompletedProcess:
    """`cloudtrain ARGS` under another CLOUDTRAIN_HOME with the same config and owner."""
    env = {**os.environ, **cloud.env, "CLOUDTRAIN_HOME": str(home)}
    return cli_as(env, *args, timeout=300)


def keeps_and_then_ages(cloud: Any, tmp_path: Path, mark_of: Callable[[], int | None], log: Path) -> None:
    """A detached job: the node renews the aged mark, gc --yes from elsewhere leaves it; the job
    ended: the mark, aged again, stays old and gc from elsewhere lists the machine as a leak."""
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    cloud.age_marks(seconds_ago=AGED_S)  # the launch's and the CLI's marks: hours old now
    wait_until(lambda: (mark_of() or 0) > time.time() - 30, 60, "the node to renew its mark")
    first = mark_of() or 0
    wait_until(lambda: (mark_of() or 0) > first, 30, "the node to renew its mark again")
    other = tmp_path / "other-home"
    gc = elsewhere(cloud, other, "gc", "--cloud", cloud.name, "--yes")
    assert f"in use elsewhere, left alone: {cloud.name} {cloud.cluster}" in gc.stdout, gc.stdout + gc.stderr
    assert "terminated" not in gc.stdout and "deleted" not in gc.stdout, gc.stdout
    assert any(d == "mark" and detail.startswith("alive: cloudtrain-alive=") for d, detail in decisions(log))

    cancel = cloud.cli("cancel", cloud.cluster)
    assert cancel.ok, cancel.output
    seen = len(decisions(log))
    wait_until(lambda: any(d == "idle" for d, _ in decisions(log)[seen:]), 60, "the node to idle")
    cloud.age_marks(seconds_ago=AGED_S)
    aged = mark_of()
    assert aged is not None and aged < time.time() - AGED_S + 60
    time.sleep(5 * MARK_S)  # five renewals' worth of idling: nobody marks
    assert mark_of() == aged
    listed = json.loads(elsewhere(cloud, other, "gc", "--cloud", cloud.name, "--json").stdout)
    mine = [leak for leak in listed["leaks"] if leak["cluster"] == cloud.cluster and leak["kind"] == "instance"]
    assert mine and mine[0]["evidence"] == "last alive 3.0 h ago" and not mine[0]["live"], listed
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []


@requires("google.cloud.compute_v1")
def test_gcp_node_renews_its_label_with_its_service_account_while_a_detached_job_runs(
        gcp_cloud: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cloudtrain.testing.gcp import DEFAULT_SERVICE_ACCOUNT

    quick_marks(gcp_cloud, monkeypatch)
    # down: the VM runs as a service account with the compute scope (its delete needs it); a VM
    # that only stops carries no credentials and is marked by the CLI alone (test below).
    assert gcp_cloud.up(gcp_cloud.recipe(run="true", autostop={"idle_minutes": 60, "down": True})).ok
    ((zone, inst),) = gcp_cloud.instances(gcp_cloud.cluster)
    home = gcp_cloud.vm(zone, inst["name"]).home_dir / ".cloudtrain" / gcp_cloud.cluster
    mark = json.loads((home / "watchdog.json").read_text())["mark"]
    assert mark["kind"] == "http-mark" and mark["url"].endswith(f"/zones/{zone}/instances/{inst['name']}/setLabels")

    def label() -> int | None:
        found = gcp_cloud.server.instance(zone, inst["name"])
        value = (found or {}).get("labels", {}).get("cloudtrain-alive")
        return int(value) if value else None

    keeps_and_then_ages(gcp_cloud, tmp_path, label, home / "watchdog.log")
    node_calls = [r for r in gcp_cloud.faults.seen("instances.setLabels") if r.bearer == gcp_cloud.metadata.token_for("gce")]
    assert node_calls and all(r.caller == DEFAULT_SERVICE_ACCOUNT for r in node_calls)


@requires("google.cloud.compute_v1")
def test_gcp_node_without_credentials_marks_nothing_and_says_so(gcp_cloud: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    quick_marks(gcp_cloud, monkeypatch)
    assert gcp_cloud.up(gcp_cloud.recipe(run="true", autostop={"idle_minutes": 60})).ok
    ((zone, inst),) = gcp_cloud.instances(gcp_cloud.cluster)
    home = gcp_cloud.vm(zone, inst["name"]).home_dir / ".cloudtrain" / gcp_cloud.cluster
    assert json.loads((home / "watchdog.json").read_text())["mark"]["kind"] == "none"
    job = gcp_cloud.cli("exec", gcp_cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    log = home / "watchdog.log"
    wait_until(lambda: sum(d == "busy" for d, _ in decisions(log)) >= 6, 60, "the node to see the job")
    assert not any(d == "mark" for d, _ in decisions(log))
    assert gcp_cloud.metadata.seen("gce") == []  # no token asked: the VM has no account
    assert any("no liveness mark" in detail for d, detail in decisions(log) if d == "start")
    assert gcp_cloud.down().ok


@requires("azure.identity")
def test_azure_node_renews_its_tag_with_its_managed_identity_while_a_detached_job_runs(
        azure_cloud: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    quick_marks(azure_cloud, monkeypatch)
    assert azure_cloud.up(azure_cloud.recipe(run="true", autostop={"idle_minutes": 60})).ok
    group = f"cloudtrain-{azure_cloud.cluster}-{azure_cloud.region}"
    (vm,) = azure_cloud.server.find("Microsoft.Compute/virtualMachines", group=group)
    home = azure_cloud.machines.vm(vm["id"].lower()).home_dir / ".cloudtrain" / azure_cloud.cluster
    mark = json.loads((home / "watchdog.json").read_text())["mark"]
    assert (mark["kind"], mark["method"], mark["field"]) == ("http-mark", "PATCH", "tags")

    def tag() -> int | None:
        (found,) = azure_cloud.server.find("Microsoft.Compute/virtualMachines", group=group)
        value = (found.get("tags") or {}).get("cloudtrain-alive")
        return int(value) if value else None

    keeps_and_then_ages(azure_cloud, tmp_path, tag, home / "watchdog.log")
    with azure_cloud.faults.lock:
        patches = [r for r in azure_cloud.faults.requests if r.managed_identity and r.method == "PATCH"]
    assert patches and all(r.caller for r in patches)  # allowed by the identity's role on its group
