"""The watchdog through the real CLI on `cloud: local`: a node is a directory here, its "stop" is the
local provider's (jobs ended, node marked stopped; `down`: the directory removed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.testing.cloud import LocalCloud
from tests.watchdog.conftest import (
    autostop_cli,
    decisions,
    wait_busy_beyond_idle,
    wait_until,
)

TICK_S = 0.2
IDLE_S = 1.0


@pytest.fixture
def fast_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    # Test-only knobs (docs/watchdog.md): seconds instead of minutes; no systemd unit or crontab line.
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_TICK_S", str(TICK_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")


def node_home(cloud: LocalCloud, cluster: str) -> Path:
    return cloud.home / "local" / f"local-{cluster}-0"


def node_state(cloud: LocalCloud, cluster: str) -> str | None:
    meta = node_home(cloud, cluster) / "instance.json"
    return json.loads(meta.read_text())["state"] if meta.exists() else None


def watchdog_log(cloud: LocalCloud, cluster: str) -> Path:
    return node_home(cloud, cluster) / ".cloudtrain" / cluster / "watchdog.log"


def test_idle_local_cluster_stops_itself_once_its_job_ends(local_cloud: LocalCloud, fast_watchdog: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = local_cloud.cluster
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")  # nothing may stop it before the job runs
    up = local_cloud.up(local_cloud.recipe(run="echo hi", autostop={"idle_minutes": 60}))
    assert up.ok, up.output
    assert "watchdog: autostop after 60 min idle (stop; waits for jobs and SSH sessions) on 1 node(s)" in up.stdout + up.stderr
    job = local_cloud.cli("exec", cluster, "--detach", "--", "sleep", "300")
    assert job.ok, job.output
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    live = autostop_cli(local_cloud, cluster, "-i", "1")
    assert live.returncode == 0, live.stdout + live.stderr
    log = watchdog_log(local_cloud, cluster)
    wait_busy_beyond_idle(log, IDLE_S, TICK_S, "job(s) running")
    assert node_state(local_cloud, cluster) == "running"

    cancel = local_cloud.cli("cancel", cluster)
    assert cancel.ok, cancel.output
    wait_until(lambda: node_state(local_cloud, cluster) == "stopped", what="the node to stop")
    status = json.loads(local_cloud.cli("status", "--refresh", "--json").stdout)
    assert [c["status"] for c in status["clusters"] if c["name"] == cluster] == ["stopped"]

    shown = local_cloud.cli("logs", cluster, "--watchdog")
    assert shown.ok, shown.output
    lines = shown.stdout.splitlines()
    assert any(" start " in line for line in lines) and any(" busy " in line for line in lines)
    assert any(" stop autostop: idle" in line for line in lines)
    assert lines[-1].split(" ", 2)[1] == "exit"  # the local machine stays up: the watchdog ends
    down = local_cloud.down()
    assert down.ok, down.output
    assert local_cloud.leftovers() == []


def test_autostop_changes_a_running_cluster_live(local_cloud: LocalCloud, fast_watchdog: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = local_cloud.cluster
    # A generous budget only: the watchdog runs, but nothing stops the node for an hour.
    up = local_cloud.up(local_cloud.recipe(run="echo hi", budget={"max_hours": 1}))
    assert up.ok, up.output
    log = watchdog_log(local_cloud, cluster)
    wait_until(lambda: any(d == "idle" and "autostop off" in detail for d, detail in decisions(log)),
               what="a budget-only decision")

    bad = autostop_cli(local_cloud, cluster)
    assert bad.returncode == 2 and "how long may the cluster be idle" in bad.stderr, bad.stderr
    # The GPU rule and the delete-after-stop, live too: what the node's watchdog now enforces.
    # (With the fixture's 1 s idle the idle node would stop itself before the next step: an hour.)
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")
    armed = autostop_cli(local_cloud, cluster, "-i", "90", "--wait-for", "jobs", "--gpu-util-below", "10",
                         "--delete-after-stopped-days", "7")
    assert armed.returncode == 0, armed.stdout + armed.stderr
    said = armed.stdout + armed.stderr
    assert "a GPU is at 10% or more" in said and "deleted 7 day(s) after the stop" in said, said
    node_config = json.loads((node_home(local_cloud, cluster) / ".cloudtrain" / cluster / "watchdog.json").read_text())
    assert node_config["autostop"]["gpu_util_below"] == 10 and node_config["autostop"]["delete_after_stopped_days"] == 7
    refused = autostop_cli(local_cloud, cluster, "-i", "1", "--wait-for", "none", "--gpu-util-below", "10")
    assert refused.returncode == 2 and "--gpu-util-below judges running jobs" in refused.stderr, refused.stderr
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(IDLE_S))
    live = autostop_cli(local_cloud, cluster, "-i", "1", "--down")
    assert live.returncode == 0, live.stdout + live.stderr
    assert "autostop after 1s idle (delete" in live.stdout + live.stderr
    # `down` for a local node: its jobs ended and its directory removed, by the node itself.
    wait_until(lambda: not node_home(local_cloud, cluster).exists(), what="the node to delete itself")
    status = json.loads(local_cloud.cli("status", "--refresh", "--json").stdout)
    assert [c["status"] for c in status["clusters"] if c["name"] == cluster] == ["terminated"]
    assert local_cloud.down().ok
    assert local_cloud.leftovers() == []


def test_autostop_cancel_leaves_the_cluster_up(local_cloud: LocalCloud, fast_watchdog: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = local_cloud.cluster
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", "3600")
    up = local_cloud.up(local_cloud.recipe(run="echo hi", autostop={"idle_minutes": 60}))
    assert up.ok, up.output
    cancel = autostop_cli(local_cloud, cluster, "--cancel")
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    log = watchdog_log(local_cloud, cluster)
    wait_until(lambda: decisions(log) and decisions(log)[-1][0] == "exit", what="the watchdog to end")
    assert node_state(local_cloud, cluster) == "running"


def test_the_budget_stops_the_node_under_a_running_job(local_cloud: LocalCloud, fast_watchdog: None) -> None:
    cluster = local_cloud.cluster
    # 0.002 h: about 7 s of running time, counted from the launch; the job would take minutes.
    recipe = local_cloud.recipe(run="sleep 120", budget={"max_hours": 0.002})
    run = local_cloud.run(recipe, "--keep")
    assert not run.ok and run.run_json["exit_code"] == 143, run.output  # the job was ended under it
    # The node's stop ends its jobs first and marks the node stopped after: the run may see its job
    # end while the node still reads "stopping" (as a cloud VM does for a while).
    wait_until(lambda: node_state(local_cloud, cluster) == "stopped", what="the node to stop")
    (line,) = [detail for d, detail in decisions(watchdog_log(local_cloud, cluster))
               if d == "stop" and detail.startswith("budget")]
    assert "1 job(s) still running" in line and "max_hours 0.002" in line
    assert local_cloud.down().ok
