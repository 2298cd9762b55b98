"""A spot run driven from a host the user already has, with the laptop gone (issue 26, docs/driver.md).

The laptop starts `cloudtrain run RECIPE --driver HOST` without any AWS credentials of its own and
the command returns; HOST is a kit sshd VM whose own login profile points its own cloudtrain (this
checkout's) at the AWS fake (cloudtrain/testing/driver.py). The job is the recovery e2e's
(cloudtrain/testing/recovery.py: checkpoints every step, waits after step 3 until released). With
no laptop process left, the node is preempted in the fake: the driver host's `cloudtrain run` relaunches in another zone, the job
resumes from the checkpoint kept on that host and finishes; `cloudtrain driver fetch` brings home a
run directory with the result files of an uninterrupted run and a cost equal to the fake's own bill.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.run.driver import DriverRecord
from cloudtrain.testing import sshd
from cloudtrain.testing.driver import DriverHostVM, driver_host
from cloudtrain.testing.wait import wait_until
from cloudtrain.testing.recovery import STEPS, TOTAL, kept_epoch, placement, recipe

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

LAPTOP_KEEPS = ("HOME", "CLOUDTRAIN_HOME", "CLOUDTRAIN_CONFIG", "CLOUDTRAIN_WATCHDOG_PERSIST")


def _host(aws_cloud: Any, factory: Any) -> DriverHostVM:
    """The fake cloud's endpoint and keys in the host's own profile, the fixture's config as its own."""
    env = {k: v for k, v in aws_cloud.env.items() if k not in LAPTOP_KEEPS}
    return driver_host(factory, env=env, config={k: v for k, v in aws_cloud.config.items() if k != "runs_dir"},
                       address="build-box")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _stop_driver(record: DriverRecord | None) -> None:
    """Teardown: a driven run still going (a failed assertion) is ended as `driver cancel` would,
    SIGTERM, so it takes its cluster down; KILLed if it has not ended in 120 s."""
    if record is None or not _alive(record.pid):
        return
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while _alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(record.pid):
        os.kill(record.pid, signal.SIGKILL)


def _drive(aws_cloud: Any, factory: Any, host: DriverHostVM, recipe_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Any:
    """`run --driver` from a laptop without any AWS credentials: the driver host's are the ones that launch."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    aws_cloud.env = {k: v for k, v in aws_cloud.env.items() if not k.startswith("AWS_")}
    return aws_cloud.cli("run", str(recipe_path), "--cluster", aws_cloud.cluster, "--runs-dir", str(aws_cloud.runs_dir),
                         "--driver", host.label, "--driver-key", str(factory.client_key.private_path),
                         "--down", "-y", timeout=600)


def _checkpoint_at_step_3(remote_run: Path) -> None:
    kept = remote_run / "checkpoint" / "cloudtrain-checkpoint.json"
    drive = remote_run.parent.parent

    def there(at_least: int) -> bool:
        if (drive / "exit_code").exists():  # the driven run ended: say why now, not after the wait
            raise AssertionError(f"the driven run ended (exit {(drive / 'exit_code').read_text().strip()}):\n"
                                 + (drive / "driver.log").read_text()[-4000:])
        epoch = kept_epoch(kept)
        return epoch is not None and epoch >= at_least

    wait_until(lambda: there(0), 300, "a checkpoint kept on the driver host")
    wait_until(lambda: there(3), 120, "the checkpoint of step 3 on the driver host")


def test_a_driven_spot_run_recovers_with_the_laptop_gone(aws_cloud: Any, sshd_vm_factory: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    host = _host(aws_cloud, sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    recipe_path = recipe(aws_cloud, marks)
    record: DriverRecord | None = None
    try:
        started = _drive(aws_cloud, sshd_vm_factory, host, recipe_path, monkeypatch)
        # The laptop's CLI has exited (cli() waited for it), having started the run.
        assert started.ok, started.output
        run_id = Path(started.stdout.strip().splitlines()[-1]).name
        record = DriverRecord.read(aws_cloud.runs_dir, run_id)
        assert _alive(record.pid)
        remote_run = Path(record.remote_run_dir)

        # The checkpoint of step 3 is kept on the driver host, then the node is preempted.
        _checkpoint_at_step_3(remote_run)
        first_zone, machine = placement(aws_cloud)
        aws_cloud.preempt(machine)

        followed = aws_cloud.cli("driver", "log", run_id, "-f", "--runs-dir", str(aws_cloud.runs_dir), timeout=600)
        assert followed.ok, followed.output
        status = aws_cloud.cli("driver", "status", run_id, "--runs-dir", str(aws_cloud.runs_dir))
        assert status.ok and "ended (exit code 0)" in status.stdout and "preempted" in status.stdout, status.output
        fetched = aws_cloud.cli("driver", "fetch", run_id, "--runs-dir", str(aws_cloud.runs_dir))
        assert fetched.ok, fetched.output
    finally:
        (marks / "go").touch()
        _stop_driver(record)
    run_dir = aws_cloud.runs_dir / run_id
    assert Path(fetched.stdout.strip().splitlines()[-1]) == run_dir
    run = json.loads((run_dir / "run.json").read_text())
    attempts = run["attempts"]
    assert [(a["number"], a["outcome"]) for a in attempts] == [(1, "preempted"), (2, "succeeded")], attempts
    assert attempts[0]["zone"] == first_zone and attempts[1]["zone"] != first_zone, attempts
    assert attempts[1]["resumed_from_epoch"] >= 3
    log = (run_dir / "job.log").read_text()
    assert "--- cloudtrain: attempt 1" in log and "--- cloudtrain: attempt 2" in log
    # The layout of a run the laptop drove, plus driver.json.
    for name in ("run.json", "job.log", "attempts.json", "outputs/result.json", "driver.json"):
        assert (run_dir / name).is_file(), name

    # The same result files as an uninterrupted run (driven by the laptop, with its credentials back).
    for name, value in aws_cloud.server.env().items():
        monkeypatch.setenv(name, value)
        aws_cloud.env[name] = value
    plain = aws_cloud.run(recipe(aws_cloud, marks), "--down", cluster=aws_cloud.new_cluster("plain"))
    assert plain.ok, plain.output
    assert sorted(p.relative_to(run_dir / "outputs") for p in (run_dir / "outputs").rglob("*")) == \
        sorted(p.relative_to(plain.run_dir / "outputs") for p in (plain.run_dir / "outputs").rglob("*"))
    assert (run_dir / "outputs" / "result.json").read_text() == (plain.run_dir / "outputs" / "result.json").read_text()
    assert json.loads((run_dir / "outputs" / "result.json").read_text()) == {
        "steps": STEPS, "total": TOTAL}

    # Both machines billed; the run's cost is the fake's own bill for them.
    billed = aws_cloud.bill.usd(aws_cloud.cluster, until=run["ended_at"])
    hourly = max(a["hourly_price_usd"] for a in attempts)
    assert run["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * hourly / 3600), aws_cloud.bill.instances(aws_cloud.cluster)
    assert len(aws_cloud.bill.instances(aws_cloud.cluster)) == 2

    # The laptop's state never held the driven cluster; nothing is left running or billing.
    laptop = json.loads(aws_cloud.cli("status", "--json").stdout)
    assert aws_cloud.cluster not in {c["name"] for c in laptop["clusters"]}
    assert aws_cloud.bill.running() == []
    assert aws_cloud.leftovers() == []
    assert not _alive(record.pid)


def test_driver_cancel_takes_the_driven_cluster_down(aws_cloud: Any, sshd_vm_factory: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`cloudtrain driver cancel` SIGTERMs the host's `cloudtrain run`, which takes it as Ctrl-C: the
    job ends, the logs come home (to the host), the spot machine is terminated; nothing bills."""
    host = _host(aws_cloud, sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    record: DriverRecord | None = None
    credentials = {k: v for k, v in aws_cloud.env.items() if k.startswith("AWS_")}  # for the laptop's gc
    try:
        started = _drive(aws_cloud, sshd_vm_factory, host, recipe(aws_cloud, marks), monkeypatch)
        assert started.ok, started.output
        record = DriverRecord.read(aws_cloud.runs_dir, Path(started.stdout.strip().splitlines()[-1]).name)
        _checkpoint_at_step_3(Path(record.remote_run_dir))  # the job is parked after step 3
        assert len(aws_cloud.instances(aws_cloud.cluster, states=["running"])) == 1
        # The laptop's gc finds the driven cluster by its tags (the laptop's state does not know it:
        # the host's does) and says whose it is; `gc --yes` leaves the live run alone.
        without = aws_cloud.env
        aws_cloud.env = {**without, **credentials}
        try:
            found = aws_cloud.cli("gc", "--cloud", "aws", "--json", "--all-owners", "--yes",
                                  "--runs-dir", str(aws_cloud.runs_dir))
        finally:
            aws_cloud.env = without
        document = json.loads(found.stdout)
        # Its machine carries a fresh liveness mark (the host's run holds it): in use elsewhere, with
        # its key pair and security group, and whose run it is.
        driven = [leak for leak in document["live"] if leak["cluster"] == aws_cloud.cluster]
        assert {leak["kind"] for leak in driven} == {"instance", "resources"}, found.output
        assert {leak["driven_run"] for leak in driven} == {record.run_id}, found.output
        assert not [leak for leak in document["leaks"] if leak["cluster"] == aws_cloud.cluster], found.output
        assert len(aws_cloud.instances(aws_cloud.cluster, states=["running"])) == 1
        cancelled = aws_cloud.cli("driver", "cancel", record.run_id, "--runs-dir", str(aws_cloud.runs_dir))
        assert cancelled.ok and "ended (exit code 130)" in cancelled.stdout, cancelled.output
    finally:
        (marks / "go").touch()
        _stop_driver(record)
    assert not _alive(record.pid)
    assert aws_cloud.bill.running() == [] and aws_cloud.leftovers() == []
    fetched = aws_cloud.cli("driver", "fetch", record.run_id, "--runs-dir", str(aws_cloud.runs_dir))
    assert fetched.ok, fetched.output
    run = json.loads((aws_cloud.runs_dir / record.run_id / "run.json").read_text())
    assert run["status"] == "interrupted" and run["teardown"].startswith("down"), run


def test_a_driver_killed_mid_run_is_resumed_from_the_laptop(aws_cloud: Any, sshd_vm_factory: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver host's `cloudtrain run` is SIGKILLed (no cleanup of any kind) and, while nothing
    drives the run, its spot node is preempted: the same as a dead laptop CLI. `cloudtrain driver
    resume RUN` starts `run --resume` there: the dead cluster is taken down, the run relaunches and
    resumes from the checkpoint kept on the host, in the same run directory."""
    host = _host(aws_cloud, sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    record: DriverRecord | None = None
    credentials = {k: v for k, v in aws_cloud.env.items() if k.startswith("AWS_")}  # for the laptop's gc
    try:
        started = _drive(aws_cloud, sshd_vm_factory, host, recipe(aws_cloud, marks), monkeypatch)
        assert started.ok, started.output
        record = DriverRecord.read(aws_cloud.runs_dir, Path(started.stdout.strip().splitlines()[-1]).name)
        _checkpoint_at_step_3(Path(record.remote_run_dir))
        os.kill(record.pid, signal.SIGKILL)
        wait_until(lambda: not _alive(record.pid), 30, "the killed driver process to be gone")
        (machine,) = aws_cloud.instances(aws_cloud.cluster, states=["running"])
        aws_cloud.preempt(machine["InstanceId"])
        status = aws_cloud.cli("driver", "status", record.run_id, "--runs-dir", str(aws_cloud.runs_dir))
        assert status.ok and "exit code 137" in status.stdout and "driver resume" in status.stderr, status.output
        resumed = aws_cloud.cli("driver", "resume", record.run_id, "--runs-dir", str(aws_cloud.runs_dir), timeout=600)
        assert resumed.ok, resumed.output
        record = DriverRecord.read(aws_cloud.runs_dir, record.run_id)  # the resumed process's pid
        followed = aws_cloud.cli("driver", "log", record.run_id, "-f", "--runs-dir", str(aws_cloud.runs_dir), timeout=600)
        assert followed.ok, followed.output
        fetched = aws_cloud.cli("driver", "fetch", record.run_id, "--runs-dir", str(aws_cloud.runs_dir))
        assert fetched.ok, fetched.output
    finally:
        (marks / "go").touch()
        _stop_driver(record)
    run = json.loads((aws_cloud.runs_dir / record.run_id / "run.json").read_text())
    one, two = run["attempts"]
    assert (one["outcome"], two["outcome"]) == ("lost", "succeeded") and "run --resume" in one["reason"], run["attempts"]
    assert (marks / "starts").read_text().split("\n")[:2] == ["start 0 -", "start 3 -"]
    assert json.loads((aws_cloud.runs_dir / record.run_id / "outputs" / "result.json").read_text()) == {
        "steps": STEPS, "total": TOTAL}
    billed = aws_cloud.bill.usd(aws_cloud.cluster, until=run["ended_at"])
    assert run["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * one["hourly_price_usd"] / 3600)
    assert aws_cloud.bill.running() == [] and aws_cloud.leftovers() == []


def test_a_driver_host_without_cloud_credentials_says_so_on_the_laptop(aws_cloud: Any, sshd_vm_factory: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the laptop's credentials goes to the host: with none of its own there, the host's
    `cloudtrain run` refuses before any run or machine exists, and the laptop's command ends with
    that refusal's line and exit code."""
    env = {k: v for k, v in aws_cloud.env.items()
           if k not in LAPTOP_KEEPS and k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    host = driver_host(sshd_vm_factory, env=env, address="build-box",
                       config={k: v for k, v in aws_cloud.config.items() if k != "runs_dir"})
    started = _drive(aws_cloud, sshd_vm_factory, host, aws_cloud.recipe(run="echo hi", resources={"spot": True}),
                     monkeypatch)
    assert started.returncode == 2, started.output
    (line,) = [line for line in started.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: --driver {host.label}: `cloudtrain run` there ended before its run started "
                           "(exit 2): error: "), line
    assert "credentials" in line.lower(), line
    assert aws_cloud.instances(aws_cloud.cluster) == [] and list(aws_cloud.runs_dir.glob("*")) == []


@pytest.mark.parametrize("trigger", ["drive.sh", "driver.log"])
def test_ctrl_c_while_the_driven_run_starts_leaves_nothing_going(aws_cloud: Any, sshd_vm_factory: Any,
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 trigger: str) -> None:
    """Ctrl-C anywhere in the start, from the files' copy to the record here (issue 34.5): the
    command exits 130, and on the host no driven run goes on that nobody here could find; nothing bills."""
    import subprocess
    import sys

    host = _host(aws_cloud, sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    env = {**os.environ, **{k: v for k, v in aws_cloud.env.items() if not k.startswith("AWS_")}}
    args = ["run", str(recipe(aws_cloud, marks)), "--cluster", aws_cloud.cluster, "--runs-dir", str(aws_cloud.runs_dir),
            "--driver", host.label, "--driver-key", str(sshd_vm_factory.client_key.private_path), "--down", "-y"]
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: any((d / trigger).exists() for d in host.drives()), 120, f"{trigger} on the host")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        (marks / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    (drive,) = host.drives()
    if (drive / "driver.log").exists():
        # Started there: stopped, whatever it had reached (recorded here or not).
        wait_until(lambda: (drive / "exit_code").exists(), 300, "the driven run to end on the host")
    wait_until(lambda: aws_cloud.bill.running() == [], 300, "nothing billing")
