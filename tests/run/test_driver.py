"""`run --driver HOST` and `cloudtrain driver ...` (run/driver.py, run/driver_ops.py; docs/driver.md).

The laptop is a test fixture's own homes; the driver host a kit sshd VM whose login profile is its
own (cloudtrain/testing/driver.py). The driven run here uses `cloud: local` on that host: what is
tested is the drive (the refusals, start, status, log, fetch, cancel), not a cloud
(tests/e2e/test_driver_e2e.py drives a preempted spot run on the AWS fake).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.run.driver import DriverRecord, parse_host
from cloudtrain.testing import sshd
from cloudtrain.testing.driver import DriverHostVM, driver_host
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def _drive(cloud: Any, host: DriverHostVM, recipe: Path, *args: str) -> Any:
    return cloud.cli("run", str(recipe), "--driver", host.label, "--driver-key",
                     str(host.vm.root.parent / "client_ed25519"), "--runs-dir", str(cloud.runs_dir), *args)


def _error_lines(result: Any) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_host_spellings_parse_and_a_bad_one_is_refused() -> None:
    assert parse_host("me@box:2222") == parse_host("me@box:2222")
    host = parse_host("me@box:2222")
    assert (host.user, host.address, host.port, host.label) == ("me", "box", 2222, "me@box:2222")
    assert parse_host("10.0.0.5").label == "10.0.0.5"
    with pytest.raises(Exception, match=r"expected \[user@\]host\[:port\]"):
        parse_host("me@box:99999")


def test_no_cloudtrain_on_the_host_is_refused_in_one_line(local_cloud: Any, sshd_vm_factory: Any) -> None:
    host = driver_host(sshd_vm_factory, path="/usr/bin:/bin")
    result = _drive(local_cloud, host, local_cloud.recipe(run="echo hi"), "-y")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert "no `cloudtrain` on the host's login PATH" in line and "--driver-cloudtrain" in line, line
    assert host.drives() == []  # nothing was synced or started


def test_another_cloudtrain_version_on_the_host_is_refused_in_one_line(local_cloud: Any, sshd_vm_factory: Any) -> None:
    host = driver_host(sshd_vm_factory)
    old = host.vm.bin_dir / "cloudtrain"
    old.write_text("#!/bin/sh\necho 'cloudtrain 0.0.1'\n")
    old.chmod(0o755)
    result = _drive(local_cloud, host, local_cloud.recipe(run="echo hi"), "-y")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert "cloudtrain 0.0.1 there" in line and "same version" in line and "install cloudtrain" in line, line
    assert host.drives() == []


def test_an_unknown_host_is_refused_in_one_line(local_cloud: Any) -> None:
    local_cloud.configure(ssh={"connect_timeout_s": 3})
    result = local_cloud.cli("run", str(local_cloud.recipe(run="echo hi")), "--driver", "me@no-such-host.invalid", "-y")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert line.startswith("error: --driver me@no-such-host.invalid: "), line
    assert "Traceback" not in result.stderr


def test_without_yes_a_driven_run_is_refused_before_any_connection(local_cloud: Any) -> None:
    local_cloud.configure(confirm=True)
    result = local_cloud.cli("run", str(local_cloud.recipe(run="echo hi")), "--driver", "me@no-such-host.invalid")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert "pass -y/--yes" in line, line


def _job_recipe(cloud: Any, marks: Path) -> Path:
    work = cloud.root / "work"
    work.mkdir(exist_ok=True)
    # Records its pid, then waits for the test's go; writes its result after.
    (work / "job.sh").write_text('echo $$ > "$MARKS/pid"\necho "job started, GREETING=${GREETING:-}"\n'
                                 'while [ ! -f "$MARKS/go" ]; do sleep 0.1; done\n'
                                 'mkdir -p outputs && echo done > outputs/result.txt\n')
    return cloud.recipe(workdir=str(work), run="sh job.sh", results=["outputs"], envs={"MARKS": str(marks)})


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill 0: ask its state (reaped meanwhile: its /proc entry is gone too).
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_driven_run_starts_returns_finishes_and_comes_home(local_cloud: Any, sshd_vm_factory: Any,
                                                             tmp_path: Path) -> None:
    host = driver_host(sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    started = _drive(local_cloud, host, _job_recipe(local_cloud, marks), "-y", "--env", "GREETING=hello there")
    assert started.ok, started.output
    run_dir = Path(started.stdout.strip().splitlines()[-1])
    record = DriverRecord.read(local_cloud.runs_dir, run_dir.name)
    assert oct((run_dir / "driver.json").stat().st_mode & 0o777) == "0o600"
    assert record.remote_dir.startswith(str(host.home)) and record.pid > 0
    wait_until(lambda: (marks / "pid").exists(), 120, "the driven job to start")

    status = local_cloud.cli("driver", "status", record.run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert status.ok and "running" in status.stdout, status.output
    early = local_cloud.cli("driver", "fetch", record.run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert early.returncode == 2 and "still running" in early.stderr, early.output

    (marks / "go").touch()
    followed = local_cloud.cli("driver", "log", record.run_id, "-f", "--runs-dir", str(local_cloud.runs_dir))
    assert followed.ok, followed.output
    assert "job started, GREETING=hello there" in followed.stdout, followed.output
    assert followed.stdout.strip().splitlines()[-1].endswith(record.run_id)

    fetched = local_cloud.cli("driver", "fetch", record.run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert fetched.ok, fetched.output
    assert (run_dir / "outputs" / "result.txt").read_text() == "done\n"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    assert (run_dir / "driver.json").exists() and "job started" in (run_dir / "job.log").read_text()
    again = local_cloud.cli("driver", "fetch", record.run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert again.ok and (run_dir / "outputs" / "result.txt").read_text() == "done\n", again.output
    assert DriverRecord.read(local_cloud.runs_dir, record.run_id) == record  # the laptop's record is its own
    # The recipe went over; the laptop's keys and state did not.
    drive = Path(record.remote_dir)
    assert (drive / "recipe.yaml").exists() and (drive / "workdir" / "job.sh").exists()
    assert not any((drive / name).exists() for name in ("keys", "state.db", "known_hosts.json"))


def test_cancel_ends_the_driven_run_and_leaves_nothing_running(local_cloud: Any, sshd_vm_factory: Any,
                                                              tmp_path: Path) -> None:
    host = driver_host(sshd_vm_factory)
    marks = tmp_path / "marks"
    marks.mkdir()
    started = _drive(local_cloud, host, _job_recipe(local_cloud, marks), "-y")
    assert started.ok, started.output
    run_id = Path(started.stdout.strip().splitlines()[-1]).name
    record = DriverRecord.read(local_cloud.runs_dir, run_id)
    wait_until(lambda: (marks / "pid").exists(), 120, "the driven job to start")
    job_pid = int((marks / "pid").read_text())

    cancelled = local_cloud.cli("driver", "cancel", run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert cancelled.ok, cancelled.output
    assert "ended (exit code 130)" in cancelled.stdout, cancelled.output
    assert not _pid_alive(record.pid) and not _pid_alive(job_pid)
    # The driven run took its cluster down: the host's own state holds none.
    state = subprocess.run([sys.executable, "-m", "cloudtrain", "status", "--json"], capture_output=True, text=True,
                           env={**os.environ, **host.env()}, check=True)
    assert json.loads(state.stdout)["clusters"] == [], state.stdout
    fetched = local_cloud.cli("driver", "fetch", run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert fetched.ok, fetched.output
    assert json.loads((local_cloud.runs_dir / run_id / "run.json").read_text())["status"] == "interrupted"
    again = local_cloud.cli("driver", "cancel", run_id, "--runs-dir", str(local_cloud.runs_dir))
    assert again.ok and "ended (exit code 130)" in again.stdout, again.output


def test_ctrl_c_while_the_driven_run_starts_stops_it_on_the_host(local_cloud: Any, sshd_vm_factory: Any,
                                                                 tmp_path: Path) -> None:
    """The host's `cloudtrain run` is held before it makes its run (a wrapper first on the host's
    PATH waits for the test); Ctrl-C on the laptop meanwhile TERMs it there: nothing is left running."""
    import signal

    host = driver_host(sshd_vm_factory)
    held, go = tmp_path / "held", tmp_path / "go"
    wrapper = host.vm.bin_dir / "cloudtrain"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = run ]; then touch {held}; while [ ! -f {go} ]; do sleep 0.1; done; fi\n'
                       f'exec {Path(sys.executable).parent / "cloudtrain"} "$@"\n')
    wrapper.chmod(0o755)
    laptop = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "run", str(local_cloud.recipe(run="echo hi")), "--driver", host.label,
         "--driver-key", str(sshd_vm_factory.client_key.private_path), "--runs-dir", str(local_cloud.runs_dir), "-y"],
        env={**os.environ, **local_cloud.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(held.exists, 120, "the driven run to start on the host")
        laptop.send_signal(signal.SIGINT)
        out, err = laptop.communicate(timeout=300)
    finally:
        go.touch()
        if laptop.poll() is None:
            laptop.kill()
            laptop.communicate()
    assert laptop.returncode == 130, out + err
    assert "interrupted: stopping the driven run on" in out, out + err
    (drive,) = host.drives()
    assert (drive / "exit_code").read_text().strip() == "143"  # TERMed there
    for name in ("pid", "wrapper"):
        assert not _pid_alive(int((drive / name).read_text()))
    assert list(local_cloud.runs_dir.glob("*")) == []  # no run, so no driver.json here


def test_a_relative_driver_key_is_recorded_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "id_driver").write_text("not read here\n")
    monkeypatch.chdir(tmp_path)
    assert parse_host("me@box", "id_driver").key == str(tmp_path.resolve() / "id_driver")
    with pytest.raises(Exception, match="--driver-key nope: no such file"):
        parse_host("me@box", "nope")


def test_a_local_data_source_is_refused_before_any_connection(local_cloud: Any) -> None:
    (local_cloud.root / "data.csv").write_text("1,2\n")
    recipe = local_cloud.recipe(run="echo hi", data=[{"source": str(local_cloud.root / "data.csv"), "target": "d"}])
    result = local_cloud.cli("run", str(recipe), "--driver", "me@no-such-host.invalid", "-y")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert "is a path on this machine, which the driver host does not have" in line, line


def test_resume_with_driver_names_driver_resume(local_cloud: Any) -> None:
    result = local_cloud.cli("run", str(local_cloud.recipe(run="echo hi")), "--driver", "me@box", "--resume",
                             "t-20261125-214436-4a1a", "-y")
    assert result.returncode == 2, result.output
    (line,) = _error_lines(result)
    assert "`cloudtrain driver resume t-20261125-214436-4a1a`" in line, line
