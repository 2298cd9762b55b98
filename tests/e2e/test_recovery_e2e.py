"""Runs that survive preemption (issue 26), through the CLI, against the cloud fakes.

A user `run:` job that checkpoints into $CLOUDTRAIN_CHECKPOINT_DIR is preempted mid-run the way
each cloud does it (EC2: terminated with `Server.SpotInstanceTermination`; Compute Engine: its
instanceTerminationAction; Azure: evicted per evictionPolicy). The run relaunches in another zone
(Azure's regional VMs: another region), resumes from the checkpoint kept on the laptop and ends
with the same result files as an uninterrupted run; the log shows each attempt and the run's cost
is the fakes' own bill (cloudtrain/testing/bill.py) for both machines.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.faults import NodeCommandGate
from cloudtrain.testing.recovery import NOTICE_SAYS, STEPS, TOTAL
from cloudtrain.testing.recovery import ended as _ended
from cloudtrain.testing.recovery import finish as _finish
from cloudtrain.testing.recovery import kept as _kept
from cloudtrain.testing.recovery import placement as _placement
from cloudtrain.testing.recovery import preempt as _preempt
from cloudtrain.testing.recovery import recipe as _recipe
from cloudtrain.testing.recovery import running as _running
from cloudtrain.testing.recovery import start as _start
from cloudtrain.testing.recovery import stop as _stop
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def _follow(cloud: Any, marks: Path) -> subprocess.Popen:
    """`cloudtrain logs CLUSTER -f` in the background, once the job started, read up to its line
    of step 3 (where the job holds until `go`)."""
    wait_until(lambda: (marks / "starts").exists(), 300, "the job started")
    follower = subprocess.Popen([sys.executable, "-m", "cloudtrain", "logs", cloud.cluster, "-f"],
                                cwd=cloud.root, env={**os.environ, **cloud.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert follower.stdout
    for line in follower.stdout:
        if line.startswith("epoch 3/"):
            break
    return follower


# The AWS leg also proves what the run and `logs -f` say of the loss (the CLI's words are the same
# on every cloud; the cloud's own words for the loss are EC2's here).
@pytest.mark.parametrize("cloud_name", ["aws", "gcp", "azure"])
def test_a_preempted_run_job_resumes_in_another_zone_with_the_same_results(
        fake_cloud: Any, cloud_name: str, tmp_path: Path) -> None:
    cloud = fake_cloud(cloud_name)
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = _recipe(cloud, marks)
    proc = _start(cloud, recipe)
    follower = None
    try:
        if cloud_name == "aws":  # `logs -f` on the run's cluster follows the first attempt's job
            follower = _follow(cloud, marks)
        _kept(cloud, at_least=3)
        first_place, machine = _placement(cloud)
        _preempt(cloud, first_place, machine)
        _, follower_err = follower.communicate(timeout=300) if follower else ("", "")
        out, err = _finish(proc, marks)
    finally:
        (marks / "go").touch()
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
    run_dir, record = _ended(proc, out, err)
    if follower is not None:
        # `logs -f NAME` ends saying so: the attempt it followed, that the run is recovering, and
        # the command that follows the next attempt.
        assert follower.returncode != 0
        last = follower_err.strip().splitlines()[-1]  # the one error line (reconnection notes come before it)
        assert f"stopped following attempt 1 of run {run_dir.name}: preempted" in last, follower_err
        assert f"cloudtrain logs {cloud.cluster} -f` follows the next attempt" in last and "key" not in last, follower_err
        assert "epoch 3/" in (run_dir / "job.log").read_text()
    attempts = record["attempts"]
    assert [(a["number"], a["outcome"]) for a in attempts] == [(1, "preempted"), (2, "succeeded")], attempts
    if cloud_name == "aws":
        # Recovery says what happened once (issue 35.12): the job's phase ends naming the loss, the
        # recover phase alone says why and what comes next (EC2's words for the loss, once).
        both = out + err
        assert both.count(f"{machine} terminated") == 1, both
        assert "<== run FAILED" in out and "the node is gone" in out.split("<== run FAILED", 1)[1].splitlines()[0]
        recover = [line for line in out.splitlines() if line.startswith(("==> recover", "<== recover"))]
        assert len(recover) == 2 and "preempted" in recover[0] and "attempt 2 of up to" in recover[1], recover
        assert "relaunching" not in err and "node gone" not in err, err
    first, second = attempts
    where = "region" if cloud_name == "azure" else "zone"
    assert first[where] == first_place and second[where] != first_place, attempts
    # It resumed from the checkpoint of step 3 (or later: steps reported before the loss was seen).
    assert second["resumed_from_epoch"] >= 3
    starts = (marks / "starts").read_text().split("\n")
    assert starts[0] == "start 0 -" and starts[1] == f"start {second['resumed_from_epoch']} -", starts
    log = (run_dir / "job.log").read_text()
    assert "--- cloudtrain: attempt 1" in log and "--- cloudtrain: attempt 2" in log and "preempted" in log
    assert log.index("resuming at step 0") < log.index("--- cloudtrain: attempt 2") < log.rindex("resuming at step")

    # The same result files as a run that was never interrupted: byte for byte what TRAIN writes
    # when it runs through. That an uninterrupted run writes exactly these bytes is the job's own
    # business, the same on every cloud: one cloud runs it beside.
    result = (run_dir / "outputs" / "result.json").read_text()
    assert result == f'{{"steps": {STEPS}, "total": {TOTAL}}}\n', result
    if cloud_name == "aws":
        (marks / "go").touch()
        plain = cloud.run(_recipe(cloud, marks), "--down", cluster=cloud.new_cluster("plain"))
        assert plain.ok, plain.output
        assert result == (plain.run_dir / "outputs" / "result.json").read_text()

    # Both machines were billed, and the run's cost is what the fake's own bill says they cost.
    assert sum(a["cost_usd"] for a in attempts) == pytest.approx(record["cost_usd"], abs=2e-6)
    billed = cloud.bill.usd(cloud.cluster, until=record["ended_at"])
    hourly = max(a["hourly_price_usd"] for a in attempts)
    assert record["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * hourly / 3600), cloud.bill.instances(cloud.cluster)
    assert len(cloud.bill.instances(cloud.cluster)) == 2
    assert cloud.leftovers() == []


# One cloud: from the notice on (the watchdog TERMs the job, the CLI brings the last checkpoint home,
# takes the node down, resumes there) the pipeline is the same on every cloud. Each cloud's notice,
# read by the watchdog on the node from that cloud's metadata fake, and the same asserts on the
# reason, the resume from the TERM's checkpoint and its time, are proven per cloud by
# tests/e2e/test_recovery_upload_e2e.py::test_on_the_notice_the_node_uploads_its_checkpoint_with_its_own_identity;
# each cloud's notice format by tests/run/test_recover_notice.py::test_each_clouds_notice_is_read_as_its_docs_describe.
@pytest.mark.parametrize("cloud_name", ["aws"])
def test_a_checkpoint_written_after_the_notice_arrives_home_before_the_node_is_gone(
        fake_cloud: Any, cloud_name: str, metadata_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cloud announces the interruption (EC2 IMDS spot/instance-action, GCE instance/preempted,
    Azure Scheduled Events Preempt); the node's watchdog sees it, records it and SIGTERMs the job,
    which writes a last checkpoint that no epoch line announced. The CLI (its cloud watcher slowed
    down, so only the notice can tell it) finds the notice, brings that checkpoint home while the
    machine still runs, then takes it down and relaunches; the second attempt starts from exactly
    that checkpoint."""
    cloud = fake_cloud(cloud_name)
    if cloud_name == "aws":  # (the GCP and Azure fixtures have their VMs' metadata server already)
        cloud.env["CLOUDTRAIN_WATCHDOG_METADATA_URL"] = metadata_server.url
        monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_METADATA_URL", metadata_server.url)
    server = metadata_server if cloud_name == "aws" else cloud.metadata
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = _recipe(cloud, marks, watch_s=300, autostop={"idle_minutes": 30})
    proc = _start(cloud, recipe)
    try:
        _kept(cloud, at_least=3)
        _, machine = _placement(cloud)
        server.interrupt(cloud_name, [machine] if cloud_name == "azure" else None)
        wait_until(lambda: server.notices_served(cloud_name) >= 1, 60, "the watchdog reading the notice")
        server.clear()  # the fake answers every machine: the next one must not see it
        out, err = _finish(proc, marks)
    finally:
        (marks / "go").touch()
    run_dir, record = _ended(proc, out, err)
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), record["attempts"]
    assert "interruption notice" in one["reason"] and NOTICE_SAYS[cloud_name] in one["reason"]
    # The second attempt started from the checkpoint written on SIGTERM (its `final` mark).
    starts = (marks / "starts").read_text().split("\n")
    assert starts[0] == "start 0 -" and starts[1] == "start 3 3", (starts, record["attempts"], err[-4000:])
    assert one["final_checkpoint_at"] is not None and one["final_checkpoint_at"] < two["started_at"]
    if cloud_name == "aws":
        # ... home before the first instance was terminated (EC2 reports when, to the second).
        (gone,) = [i for i in cloud.instances(cloud.cluster) if i["InstanceId"] == machine]
        assert gone["State"]["Name"] == "terminated"
        stamp = gone["StateTransitionReason"].split("(", 1)[1].rstrip(")").rsplit(" ", 1)[0]  # "... GMT" / "... UTC"
        terminated_at = calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
        assert one["final_checkpoint_at"] < terminated_at + 1
    assert "final checkpoint at step 3" in (run_dir / "job.log").read_text()
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["total"] == sum(i * i for i in range(1, STEPS + 1))
    assert cloud.leftovers() == []


# The bundled job's own part of recovery is proven once, by
# test_the_bundled_cnn_told_by_the_notice_saves_where_it_is_and_the_next_attempt_starts_there (its
# checkpoints come home as it trains, the next attempt resumes from them, the history is kept once);
# its resume from per-epoch checkpoints after a hard kill by tests/jobs/test_mnist_cnn.py
# (test_killed_after_epoch_two_resumes_at_three); each cloud's preemption and relaunch elsewhere by
# test_a_preempted_run_job_resumes_in_another_zone_with_the_same_results[aws|gcp|azure].


def test_run_resume_picks_up_a_run_whose_cli_died_while_its_node_was_preempted(aws_cloud: Any, tmp_path: Path) -> None:
    """The CLI is killed mid-run; while no CLI runs the spot node is reclaimed. `run --resume RUN`
    takes the dead cluster down, relaunches and resumes from the checkpoint kept before the CLI died,
    in the same run directory and row; run.json lists both attempts and the cost covers both."""
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe = _recipe(aws_cloud, marks)
    proc = _start(aws_cloud, recipe)
    try:
        kept = _kept(aws_cloud, at_least=3)
        wait_until(lambda: (kept.parent.parent / "attempts.json").exists(), 60, "the attempt recorded")
    finally:
        proc.kill()  # the laptop's CLI dies: no cleanup of any kind
        proc.communicate()
    run_dir = kept.parent.parent
    (machine,) = aws_cloud.instances(aws_cloud.cluster, states=["running"])
    aws_cloud.preempt(machine["InstanceId"])
    try:
        resumed = aws_cloud.cli("run", str(recipe), "--resume", run_dir.name, "--down", timeout=600)
    finally:
        (marks / "go").touch()
    assert resumed.ok, resumed.output
    assert resumed.run_dir == run_dir
    record = json.loads((run_dir / "run.json").read_text())
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("lost", "succeeded") and "run --resume" in one["reason"]
    assert (marks / "starts").read_text().split("\n")[:2] == ["start 0 -", "start 3 -"]
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["total"] == sum(i * i for i in range(1, STEPS + 1))
    billed = aws_cloud.bill.usd(aws_cloud.cluster, until=record["ended_at"])
    assert record["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * one["hourly_price_usd"] / 3600)
    assert aws_cloud.leftovers() == []


def test_a_node_preempted_while_it_boots_is_relaunched_without_waiting_out_the_ssh_retries(
        aws_cloud: Any, tmp_path: Path) -> None:
    """The machine is taken back before its sshd ever answered. Depending on the moment, the launch
    sees it terminated while it waits for it to run or right after (LaunchLostError: it used to fail
    the run, no cluster having been handed over), or the run's connect is waiting in its retry loop
    (here up to 15 minutes, past this test's timeout) and holds no node yet: the cloud watcher sees
    the machine gone and ends that wait (remote/gone.py). Either way the next attempt starts."""
    cloud = aws_cloud
    cloud.configure(ssh={"connect_retries_s": 900})
    cloud.machines.hold_boots(1)
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").touch()  # no hold mid-run: the loss is the boot's
    proc = _start(cloud, _recipe(cloud, marks))
    try:
        (raw,) = wait_until(lambda: cloud.instances(cloud.cluster, states=["running"]), 300, "the first machine")
        iid = raw["InstanceId"]
        wait_until(lambda: iid in cloud.machines and not cloud.machines.vm(iid).running, 60,
                   "its machine up, its sshd not yet (booting)")
        cloud.preempt(raw["InstanceId"])
        out, err = _finish(proc, marks)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    run_dir = Path(out.strip().splitlines()[-1])
    one, two = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), (one, two)
    assert "terminated" in one["reason"], one  # what the cloud said, not a connect that gave up on its own
    assert (marks / "starts").read_text() == "start 0 -\n"  # the job ran once, on the second machine
    assert json.loads((run_dir / "outputs" / "result.json").read_text())["steps"] == STEPS
    assert cloud.leftovers() == []


# When in the attempt the loss comes (setup here, collect below) is the controller's business, the
# same on every cloud: one cloud proves it. How each cloud's loss is seen and where it relaunches
# is proven per cloud by test_a_preempted_run_job_resumes_in_another_zone_with_the_same_results.
@pytest.mark.parametrize("cloud_name", ["aws"])
def test_a_node_preempted_during_setup_is_relaunched_and_setup_runs_again(
        fake_cloud: Any, cloud_name: str, tmp_path: Path) -> None:
    """The loss comes while `setup` runs (before any checkpoint): the next attempt, in another zone
    (Azure: region), runs setup again and the job from the start."""
    cloud = fake_cloud(cloud_name)
    marks = tmp_path / "marks"
    marks.mkdir()
    setup = f'echo setup >> "{marks}/setups"; if [ ! -f "{marks}/go" ]; then while [ ! -f "{marks}/go" ]; do sleep 0.1; done; fi'
    recipe = _recipe(cloud, marks, setup=setup)
    proc = _start(cloud, recipe)
    try:
        wait_until(lambda: (marks / "setups").exists(), 300, "setup running")
        where, machine = _placement(cloud)
        _preempt(cloud, where, machine)
        wait_until(lambda: (now := _running(cloud)) is not None and now[0] != where, 120, "the relaunch elsewhere")
        (marks / "go").touch()  # the second attempt's setup goes through
        out, err = _finish(proc, marks)
    finally:
        (marks / "go").touch()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    run_dir = Path(out.strip().splitlines()[-1])
    one, two = json.loads((run_dir / "run.json").read_text())["attempts"]
    key = "region" if cloud_name == "azure" else "zone"
    assert (one["outcome"], two["outcome"], one[key]) == ("preempted", "succeeded", where) and two[key] != where
    assert (marks / "setups").read_text().split() == ["setup", "setup"]
    assert (marks / "starts").read_text().split("\n")[0] == "start 0 -"  # the job ran once, from the start
    assert cloud.leftovers() == []


def test_the_bundled_cnn_told_by_the_notice_saves_where_it_is_and_the_next_attempt_starts_there(
        fake_cloud: Any, metadata_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """EC2's spot/instance-action: the watchdog SIGTERMs the bundled CNN, which saves the step it
    reached (or, TERMed in an epoch's last step, that epoch) and exits; the CLI brings that checkpoint
    home before the machine goes, and the next attempt resumes exactly there: no work lost."""
    cloud = fake_cloud("aws")
    cloud.env["CLOUDTRAIN_WATCHDOG_METADATA_URL"] = metadata_server.url
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_METADATA_URL", metadata_server.url)
    # 40 steps an epoch (1.3-3 s each): the TERM lands inside an epoch; 24 of them keep the first
    # attempt training for 30 s or more, past the first kept checkpoint and the watchdog's 5 s
    # notice tick, without a long second attempt.
    epochs = 24
    recipe = cloud.recipe(
        job={"name": "mnist_cnn", "params": {"epochs": epochs, "data": "bundled", "no_placement_log": True,
                                             "limit_train": 2560, "limit_test": 256, "batch_size": 64}},
        resources={"spot": True}, recover={"max_restarts": 1, "watch_s": 300}, autostop={"idle_minutes": 30})
    proc = _start(cloud, recipe)
    try:
        _kept(cloud, timeout=600)
        metadata_server.interrupt("aws", None)
        wait_until(lambda: metadata_server.notices_served("aws") >= 1, 60, "the watchdog reading the notice")
        metadata_server.clear()  # the fake answers every machine: the next one must not see it
        out, err = proc.communicate(timeout=600)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    run_dir = Path(out.strip().splitlines()[-1])
    one, two = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded") and one["final_checkpoint_at"] is not None
    log = (run_dir / "job.log").read_text()
    saved = re.search(r"SIGTERM: (?:checkpoint saved at step (\d+) of epoch (\d+)|stopping after epoch (\d+))", log)
    assert saved, log[-3000:]
    if saved.group(1):
        assert f"resuming from the checkpoint at step {saved.group(1)} of epoch {saved.group(2)} of {epochs}" in log
    else:
        assert f"resuming from the checkpoint after epoch {saved.group(3)} of {epochs}" in log
    metrics = json.loads((run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == epochs
    assert len(json.loads((run_dir / "outputs" / "train_state.json").read_text())["history"]) == epochs
    assert cloud.leftovers() == []


@pytest.mark.parametrize("cloud_name", ["aws"])  # one cloud: see the setup test above
def test_a_node_preempted_while_its_results_are_collected_is_relaunched_and_collected_again(
        fake_cloud: Any, cloud_name: str, tmp_path: Path) -> None:
    """The job succeeded; while collect copies its results (the node's `tar` of them parked at a
    gate of the test kit) the spot node is preempted. That is a loss like any other: the next
    attempt, in another zone, resumes from the job's last checkpoint (it only writes its results
    again) and collect runs again; the run ends with the files of an uninterrupted run."""
    cloud = fake_cloud(cloud_name)
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").touch()  # the job runs through: the loss comes after it
    proc = _start(cloud, _recipe(cloud, marks))
    gate = None
    try:
        first_place, machine, vm = wait_until(lambda: _running(cloud), 300, "the first machine")
        # Collect's copy of the results: `tar --no-recursion ... -cf -` (the checkpoint puller's has neither).
        gate = NodeCommandGate.install(vm.bin_dir, "tar", ["--no-recursion", "-cf"], tmp_path / "gate")
        wait_until(lambda: gate.held, 300, "collect copying the results")
        _kept(cloud, at_least=STEPS)  # the job's last checkpoint is home (its puller has its own connection)
        _preempt(cloud, first_place, machine)
        out, err = _finish(proc, marks)
    finally:
        _stop(proc, gate)
    run_dir, record = _ended(proc, out, err)
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), record["attempts"]
    assert "while collecting the results" in one["reason"], one
    assert json.loads((run_dir / "attempts.json").read_text())[0]["reason"] == one["reason"]
    assert one["zone"] == first_place and two["zone"] != first_place, record["attempts"]
    # The second job started from the first one's last checkpoint: it only wrote its results again.
    assert (marks / "starts").read_text().split("\n")[:2] == ["start 0 -", f"start {STEPS} -"]
    assert two["resumed_from_epoch"] == STEPS
    # An uninterrupted run of this job ends with exactly this file (the first test of this module).
    assert json.loads((run_dir / "outputs" / "result.json").read_text()) == {
        "steps": STEPS, "total": sum(i * i for i in range(1, STEPS + 1))}
    assert record["status"] == "succeeded" and record["collect_error"] is None
    assert "outputs/result.json" in record["results"]
    billed = cloud.bill.usd(cloud.cluster, until=record["ended_at"])
    hourly = max(a["hourly_price_usd"] for a in record["attempts"])
    assert record["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * hourly / 3600), cloud.bill.instances(cloud.cluster)
    assert len(cloud.bill.instances(cloud.cluster)) == 2
    assert cloud.leftovers() == []
