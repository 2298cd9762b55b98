"""The watchdog on GCP, end to end: `cloudtrain up` against the fake Compute Engine, every instance an
sshd VM, and the CLI gone while the VM decides by itself.

Stop: a guest OS shutdown, which Compute Engine turns into a stop (TERMINATED). An sshd VM cannot
power off, so its shutdown command is the stand-in `python -m cloudtrain.testing.metadata
gce-shutdown`, which stops the instance through the fake as Compute Engine does when a guest powers
off (with the kit's own key: the hypervisor needs no credentials of the VM). Delete (`down`): an
`instances.delete` of the VM itself with its service account's token, from the fake metadata server
(`gcp_cloud.metadata`, which checks the `Metadata-Flavor: Google` header), which the fake takes as
the VM's account, with the scope the launch gave it. The fake then powers the VM off (its sessions,
jobs and watchdog end). `gcp_cloud.watchdog_env()` sets both up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.deadline import deadline_seconds
from cloudtrain.testing import sshd
from cloudtrain.testing.gcp import (
    DEFAULT_SERVICE_ACCOUNT,
    SERVICE_ACCOUNT,
    GceRequest,
    GcpCloud,
)
from tests.watchdog.conftest import (
    autostop_cli,
    decisions,
    idle_period_now,
    logged_in,
    wait_busy_beyond_idle,
    wait_until,
)
from tests.lazy import requires

pytestmark = requires("google.cloud.compute_v1")

if not sshd.sshd_available():
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# Short, so the waits on them are short: a busy run spans ticks_covering(IDLE_S, TICK_S) ticks.
TICK_S = 0.25
IDLE_S = 1.5
# How long after the activity ends the instance must be stopped or deleted (a bound on a hung test).
ACT_WITHIN_S = IDLE_S + 30
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"


@pytest.fixture
def cloud(gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> GcpCloud:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", str(TICK_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")
    for name, value in gcp_cloud.watchdog_env().items():  # METADATA_URL (fake metadata server), SHUTDOWN
        monkeypatch.setenv(name, value)
    return gcp_cloud


def the_instance(cloud: GcpCloud) -> tuple[str, dict[str, Any]]:
    (found,) = cloud.instances(cloud.cluster)
    return found


def status(cloud: GcpCloud, zone: str, name: str) -> str | None:
    """The instance's status in Compute Engine (None once deleted); reading it also finishes due operations."""
    inst = cloud.server.instance(zone, name)
    return None if inst is None else str(inst["status"])


def node_file(cloud: GcpCloud, zone: str, name: str, file: str) -> Path:
    return cloud.vm(zone, name).home_dir / ".cloudtrain" / cloud.cluster / file


def asked(cloud: GcpCloud, action: str) -> list[GceRequest]:
    return cloud.faults.seen(action)


def up(cloud: GcpCloud, **fields: Any) -> tuple[str, dict[str, Any]]:
    result = cloud.up(cloud.recipe(run="echo hi", **fields))
    assert result.ok, result.output
    assert "watchdog: " in result.stdout  # started; persistence is off in tests, on purpose: nothing warned
    assert "watchdog started detached" not in result.stderr + result.stdout
    zone, inst = the_instance(cloud)
    # A VM runs as the project's default compute service account, with the compute scope only, when
    # its watchdog may delete it (autostop.down); otherwise as none: a stop needs no credentials.
    autostop = fields.get("autostop") or {}
    expected = [{"email": DEFAULT_SERVICE_ACCOUNT, "scopes": [COMPUTE_SCOPE]}] if autostop.get("down") else None
    assert inst.get("serviceAccounts") == expected
    return zone, inst


def assert_stopped_by_its_os_shutdown(cloud: GcpCloud, zone: str, name: str) -> None:
    """One instances.stop, the stand-in's (the kit's key, as the hypervisor); no token was needed,
    nothing was deleted, and Compute Engine stopped nothing by itself (maxRunDuration)."""
    (stop,) = asked(cloud, "instances.stop")
    assert (stop.zone, stop.name, stop.caller) == (zone, name, SERVICE_ACCOUNT)
    assert cloud.metadata.seen("gce") == [] and asked(cloud, "instances.delete") == []
    assert cloud.server.terminations == []


def finish(cloud: GcpCloud) -> None:
    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []


def test_idle_vm_stops_itself_once_the_ssh_session_ends(cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the user logs in
    zone, inst = up(cloud, autostop={"idle_minutes": 1})
    action = json.loads(node_file(cloud, zone, inst["name"], "watchdog.json").read_text())["action"]
    assert {k: v for k, v in action.items() if k != "identity"} == {"kind": "shutdown", "effect": "stop"}
    machine = cloud.vm(zone, inst["name"])
    log = node_file(cloud, zone, inst["name"], "watchdog.log")
    # A user logged in: an SSH session of its own, no job (wait_for: jobs_and_ssh, the default).
    with logged_in(machine, cloud.machines.factory.client_key.private_path):
        idle_period_now(cloud, monkeypatch, IDLE_S)
        wait_busy_beyond_idle(log, IDLE_S, TICK_S, "1 ssh session(s)", after_config=True)
        assert status(cloud, zone, inst["name"]) == "RUNNING"
    wait_until(lambda: status(cloud, zone, inst["name"]) == "TERMINATED", timeout=ACT_WITHIN_S,
               what="the instance to stop itself")
    assert not machine.running
    assert_stopped_by_its_os_shutdown(cloud, zone, inst["name"])
    assert any(d == "stop" and detail.startswith("autostop: idle") for d, detail in decisions(log))
    refreshed = cloud.cli("status", cloud.cluster, "--refresh", "--json")
    assert refreshed.ok, refreshed.output
    assert json.loads(refreshed.stdout)["clusters"][0]["status"] == "stopped"
    finish(cloud)


def test_with_down_a_running_job_keeps_it_until_the_job_ends_then_it_deletes_itself(
    cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may act before the job runs
    zone, inst = up(cloud, autostop={"idle_minutes": 60, "down": True})
    name = inst["name"]
    action = json.loads(node_file(cloud, zone, name, "watchdog.json").read_text())["action"]
    assert action == {
        "kind": "http", "effect": "delete", "method": "DELETE",
        "url": f"{cloud.server.url}/compute/v1/projects/{cloud.server.project}/zones/{zone}/instances/{name}",
        "token": {"url": "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token",
                  "headers": {"Metadata-Flavor": "Google"}, "field": "access_token"},
        "ok": [200], "gone_ok": True}
    machine = cloud.vm(zone, name)
    log = node_file(cloud, zone, name, "watchdog.log")
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    # Live: the idle period short now, jobs only (this test's own SSH calls must not count).
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    live = autostop_cli(cloud, cloud.cluster, "-i", "1", "--down", "--wait-for", "jobs")
    assert live.returncode == 0, live.stdout + live.stderr
    wait_busy_beyond_idle(log, IDLE_S, TICK_S, "job(s) running")
    assert status(cloud, zone, name) == "RUNNING"
    cancel = cloud.cli("cancel", cloud.cluster)
    assert cancel.ok, cancel.output
    wait_until(lambda: status(cloud, zone, name) is None, timeout=ACT_WITHIN_S, what="the instance to delete itself")
    assert not machine.running
    assert any(d == "delete" and detail.startswith("autostop: idle") for d, detail in decisions(log))
    # The token came from the metadata server, asked for the way it requires ...
    tokens = cloud.metadata.seen("gce")
    assert tokens and all(r.status == 200 and r.headers["metadata-flavor"] == "Google" for r in tokens)
    # ... and the DELETE carried it: Compute Engine took it as the VM's own service account.
    (delete,) = asked(cloud, "instances.delete")
    assert (delete.zone, delete.name) == (zone, name)
    assert (delete.bearer, delete.caller) == (cloud.metadata.token_for("gce"), DEFAULT_SERVICE_ACCOUNT)
    assert asked(cloud, "instances.stop") == [] and cloud.server.terminations == []
    finish(cloud)


def test_budget_deadline_stops_it_under_a_running_job(cloud: GcpCloud) -> None:
    max_hours = round(20 / 3600, 6)  # about 20 s of running time, counted from the launch
    zone, inst = up(cloud, budget={"max_hours": max_hours}, autostop=False)  # only the budget may act
    # The cloud-side backstop is there too (the budget and its 30 s grace): the watchdog must come first.
    assert inst["scheduling"]["maxRunDuration"] == {"seconds": str(deadline_seconds(max_hours * 3600))}
    job = cloud.cli("exec", cloud.cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    log = node_file(cloud, zone, inst["name"], "watchdog.log")
    wait_until(lambda: status(cloud, zone, inst["name"]) == "TERMINATED", timeout=120,
               what="the budget to stop the instance")
    (line,) = [detail for d, detail in decisions(log) if d == "stop" and detail.startswith("budget")]
    assert "1 job(s) still running" in line and f"max_hours {max_hours:g}" in line
    assert_stopped_by_its_os_shutdown(cloud, zone, inst["name"])
    finish(cloud)


def test_without_a_service_account_down_is_refused_at_up_and_nothing_is_left(cloud: GcpCloud) -> None:
    cloud.configure(gcp={"service_account": "none"})  # no credentials on the VMs
    result = cloud.up(cloud.recipe(run="echo hi", autostop={"idle_minutes": 1, "down": True}))
    assert result.returncode != 0, result.output
    refusal = [line for line in result.stderr.splitlines() if "cannot delete itself" in line]
    assert len(refusal) == 1 and "no service account with the compute scope" in refusal[0], result.output
    (insert,) = asked(cloud, "instances.insert")
    assert "serviceAccounts" not in insert.body
    assert cloud.metadata.seen("gce") == []
    assert cloud.leftovers() == []
