"""Safety and correctness end to end: stopping a job ends everything it started, cluster names never
become paths, job state is never stale, two runs never share a cluster, spot + --stop is refused
before anything exists, and unsafe result members are refused one by one.

The CLI runs as a subprocess, as a user's. Jobs are tiny shell scripts that record the pids of the
processes they start in the test's tmp dir; "ended" means the pid is gone (a zombie counts as gone).
One of those processes moves to a process group of its own, the way process managers and
launchers do: signalling the job's process group alone does not reach it, its session does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.wait import wait_until
from tests.conftest import REPO, cloudtrain, start_cli

PY = shlex.quote(sys.executable)
# Stays running in a process group of its own; writes its pid (atomically) once it got there.
_OWN_GROUP = (
    "import os, sys, time; os.setpgid(0, 0); p = sys.argv[1]; "
    "open(p + '.tmp', 'w').write(str(os.getpid())); os.replace(p + '.tmp', p); time.sleep(323)"
)
NAME_RULE_WORDS = ("not valid", "lowercase letters")


# ------------------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False


def _wait_for(predicate: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> None:
    wait_until(predicate, timeout, what)


def spawner(pids: Path, foreground: str = "sleep 322", per_rank: bool = False) -> str:
    """Shell lines for a job that leaves processes behind: a plain `sleep 321 &`, a process in a
    group of its own, then the job's own shell pid; then `foreground` runs.

    The pids go to files in `pids` (`pids-<rank>` with per_rank, for jobs on several nodes)."""
    p = shlex.quote(str(pids)) + ('-"$CLOUDTRAIN_NODE_RANK"' if per_rank else "")
    return "\n".join([
        f"mkdir -p {p}",
        f"sleep 321 & echo $! > {p}/bg.tmp && mv {p}/bg.tmp {p}/bg",
        f"{PY} -c {shlex.quote(_OWN_GROUP)} {p}/pgrp &",
        f"echo $$ > {p}/job.tmp && mv {p}/job.tmp {p}/job",
        foreground,
    ]) + "\n"


def wait_pids(pids: Path, names: tuple[str, ...] = ("bg", "pgrp", "job"), timeout: float = 120) -> dict[str, int]:
    def ready() -> bool:
        return all((pids / n).is_file() and (pids / n).read_text().strip().isdigit() for n in names)

    _wait_for(ready, timeout=timeout, what=f"the job to record its processes in {pids}")
    found = {n: int((pids / n).read_text()) for n in names}
    for name, pid in found.items():
        assert _alive(pid), f"{name} ({pid}) should be running"
    return found


def assert_all_gone(found: dict[str, int], timeout: float = 30) -> None:
    # Ended processes may take a moment to be reaped by their parent or init.
    try:
        _wait_for(lambda: not any(_alive(p) for p in found.values()), timeout=timeout, what="processes to end")
    except AssertionError:
        left = {n: p for n, p in found.items() if _alive(p)}
        raise AssertionError(f"still running: {left}") from None


def write_recipe(tmp_path: Path, name: str, body: str, file_name: str | None = None) -> Path:
    path = tmp_path / (file_name or f"{name}.yaml")
    path.write_text(f"name: {name}\n" + textwrap.dedent(body))
    return path


def run_block(script: str, key: str = "run") -> str:
    """A recipe's `run:` (or `setup:`) as a YAML literal block."""
    return f"{key}: |\n" + textwrap.indent(script, "  ")


def ssh_resources(vm: SshdVM, factory: SshdFactory) -> str:
    key = json.dumps(str(factory.client_key.private_path))
    return textwrap.dedent(f"""\
        resources:
          cloud: ssh
          hosts: [{{address: {vm.host}, port: {vm.port}, user: {json.dumps(vm.user)}, key: {key}}}]
    """)


def started_job_id(proc: subprocess.CompletedProcess) -> str:
    """The job id `exec --detach` printed."""
    found = re.search(r"started job (\S+);", proc.stdout + proc.stderr)
    assert found, proc.stdout + proc.stderr
    return found.group(1)


def status_json(*args: str) -> dict:
    proc = cloudtrain("status", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def last_job(name: str, *args: str) -> dict | None:
    data = status_json(*args)
    return next(c["last_job"] for c in data["clusters"] if c["name"] == name)


@pytest.fixture
def reaper(cloudtrain_home: Path, tmp_path: Path) -> Iterator[None]:
    """On the way out (a failed test too): down what is left, then kill any recorded process."""
    yield
    try:
        data = json.loads(cloudtrain("status", "--json", timeout=120).stdout)
        for cluster in data["clusters"]:
            cloudtrain("down", cluster["name"], "--forget", timeout=180)
    except (json.JSONDecodeError, KeyError, subprocess.TimeoutExpired):
        pass
    # Whatever a recorded process shares a session with (the job's supervisor, its foreground
    # command) goes too; never our own session.
    sessions = set()
    for pid_file in tmp_path.glob("**/pids*/*"):
        try:
            pid = int(pid_file.read_text())
            sessions.add(os.getsid(pid))
            os.kill(pid, signal.SIGKILL)
        except (ValueError, OSError):
            continue
    sessions.discard(os.getsid(0))
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) in sessions:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue


@pytest.fixture
def ssh_config(cloudtrain_home: Path) -> None:
    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("ssh: {connect_retries_s: 5, add_include: false}\n")


def interrupt(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return out, err


# ------------------------------------------------------------- 1. stopping a job ends everything


@pytest.mark.parametrize("keep", [False, True], ids=["auto-down", "keep"])
def test_ctrl_c_ends_every_process_the_job_started_local(tmp_path: Path, reaper: None, keep: bool) -> None:
    pids = tmp_path / "pids"
    recipe = write_recipe(tmp_path, "sigint-tree", run_block(spawner(pids)))
    args = ["run", str(recipe), "--runs-dir", str(tmp_path / "runs")] + (["--keep"] if keep else [])
    proc = start_cli(*args, cwd=tmp_path)
    found = wait_pids(pids)
    out, err = interrupt(proc)
    assert proc.returncode == 130, out + err
    assert_all_gone(found)
    data = status_json()
    assert data["runs"][0]["status"] == "interrupted"
    if keep:
        # The interrupted run's job row is not left `running` (item 5).
        job = last_job("sigint-tree")
        assert job is not None and job["status"] not in ("running", "pending"), job
        assert cloudtrain("down", "sigint-tree").returncode == 0
    else:
        assert data["clusters"] == []


def test_ctrl_c_ends_every_process_the_job_started_ssh(sshd_vm_factory: SshdFactory, ssh_config: None,
                                                       tmp_path: Path, reaper: None) -> None:
    vm = sshd_vm_factory.start()
    pids = tmp_path / "pids"
    recipe = write_recipe(tmp_path, "ssh-sigint", ssh_resources(vm, sshd_vm_factory) + run_block(spawner(pids)))
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    found = wait_pids(pids, timeout=300)
    out, err = interrupt(proc)
    assert proc.returncode == 130, out + err
    assert_all_gone(found)
    data = status_json()
    assert data["clusters"] == [] and data["runs"][0]["status"] == "interrupted"
    assert not (vm.home_dir / ".cloudtrain" / "ssh-sigint").exists()
    assert vm.running


def test_leftovers_end_when_the_job_ends_by_itself(tmp_path: Path, reaper: None) -> None:
    pids = tmp_path / "pids"
    # The job starts its leftovers and exits 0 once they are up; --keep, so no `down` sweeps them later.
    wait_up = f"while [ ! -s {shlex.quote(str(pids / 'pgrp'))} ]; do sleep 0.05; done; echo job done"
    recipe = write_recipe(tmp_path, "leftovers", run_block(spawner(pids, foreground=wait_up)))
    proc = cloudtrain("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {n: int((pids / n).read_text()) for n in ("bg", "pgrp", "job")}
    assert_all_gone(found)
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert "job done" in (run_dir / "job.log").read_text()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    assert cloudtrain("down", "leftovers").returncode == 0


def test_down_ends_detached_jobs_and_what_they_started_local(tmp_path: Path, reaper: None) -> None:
    recipe = write_recipe(tmp_path, "detached", "run: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    found = {}
    for i in range(2):
        started = cloudtrain("exec", "detached", "-d", "--", spawner(tmp_path / f"pids{i}"))
        assert started.returncode == 0, started.stderr
        found.update({f"{k}{i}": v for k, v in wait_pids(tmp_path / f"pids{i}").items()})
    down = cloudtrain("down", "detached")
    assert down.returncode == 0, down.stderr
    assert_all_gone(found)
    assert status_json()["clusters"] == []


def test_down_on_ssh_ends_detached_jobs_then_removes_files(sshd_vm_factory: SshdFactory, ssh_config: None,
                                                           tmp_path: Path, reaper: None) -> None:
    vm = sshd_vm_factory.start()
    recipe = write_recipe(tmp_path, "ssh-detached", ssh_resources(vm, sshd_vm_factory) + "run: 'true'\n")
    up = cloudtrain("up", str(recipe))
    assert up.returncode == 0, up.stdout + up.stderr
    found = {}
    for i in range(2):
        started = cloudtrain("exec", "ssh-detached", "-d", "--", spawner(tmp_path / f"pids{i}"))
        assert started.returncode == 0, started.stderr
        found.update({f"{k}{i}": v for k, v in wait_pids(tmp_path / f"pids{i}").items()})
    assert (vm.home_dir / ".cloudtrain" / "ssh-detached").is_dir()
    down = cloudtrain("down", "ssh-detached")
    assert down.returncode == 0, down.stdout + down.stderr
    assert_all_gone(found)
    assert not (vm.home_dir / ".cloudtrain" / "ssh-detached").exists()
    assert vm.running  # an existing machine is never powered off
    assert status_json()["clusters"] == []


def test_down_on_ssh_ends_a_runs_jobs_on_every_node_after_its_driver_died(
        sshd_vm_factory: SshdFactory, ssh_config: None, tmp_path: Path, reaper: None) -> None:
    vms = sshd_vm_factory.start_many(2)
    key = json.dumps(str(sshd_vm_factory.client_key.private_path))
    hosts = ", ".join(f"{{address: {vm.host}, port: {vm.port}, user: {json.dumps(vm.user)}, key: {key}}}"
                      for vm in vms)
    pids = tmp_path / "pids"
    recipe = write_recipe(tmp_path, "orphaned", f"num_nodes: 2\nresources:\n  cloud: ssh\n  hosts: [{hosts}]\n"
                          + run_block(spawner(pids, per_rank=True)))
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    found = {}
    for rank in (0, 1):
        found.update({f"{k}{rank}": v for k, v in wait_pids(Path(f"{pids}-{rank}"), timeout=300).items()})
    # The driver dies without any cleanup (kill -9, a crash, a closed laptop): the jobs run on.
    proc.kill()
    proc.communicate()
    assert all(_alive(pid) for pid in found.values())
    down = cloudtrain("down", "orphaned")
    assert down.returncode == 0, down.stdout + down.stderr
    assert_all_gone(found)
    for vm in vms:
        assert not (vm.home_dir / ".cloudtrain" / "orphaned").exists()
        assert vm.running
    data = status_json()
    assert data["clusters"] == [] and data["runs"][0]["status"] == "abandoned"


def test_cancel_ends_the_job_and_the_run_following_it_is_cancelled(tmp_path: Path, reaper: None) -> None:
    pids = tmp_path / "pids"
    recipe = write_recipe(tmp_path, "cancelled", run_block(spawner(pids)))
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    try:
        found = wait_pids(pids)
        cancel = cloudtrain("cancel", "cancelled")
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert re.search(r"^job \S+-run: killed$", cancel.stdout, re.MULTILINE), cancel.stdout
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode not in (0, 130), out + err
    assert_all_gone(found)
    run_dir = Path(out.strip().splitlines()[-1])
    record = json.loads((run_dir / "run.json").read_text())
    # Said as what it was, not `failed (143)` (35.12): the user cancelled it.
    assert record["status"] == "cancelled" and record["teardown"] == "down"
    assert "was cancelled (killed from outside: `cloudtrain cancel`" in record["error"]
    assert status_json()["clusters"] == [] and status_json()["runs"][0]["status"] == "cancelled"


def test_cancel_kills_a_job_that_ignores_term(tmp_path: Path, reaper: None) -> None:
    pids = tmp_path / "pids"
    recipe = write_recipe(tmp_path, "stubborn", "run: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    # The shell ignores TERM, and so does everything it starts (an ignored signal is inherited).
    script = "trap '' TERM\n" + spawner(pids, foreground="sleep 600")
    started = cloudtrain("exec", "stubborn", "-d", "--", script)
    assert started.returncode == 0, started.stderr
    job_id = started_job_id(started)
    found = wait_pids(pids)
    cancel = cloudtrain("cancel", "stubborn", job_id)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert f"job {job_id}: killed" in cancel.stdout
    assert_all_gone(found)
    job = last_job("stubborn", "stubborn")
    assert job is not None and job["id"] == job_id and job["status"] == "killed"
    again = cloudtrain("cancel", "stubborn", "--all")  # nothing left to cancel
    assert again.returncode == 0 and "no running job" in again.stdout
    assert cloudtrain("down", "stubborn").returncode == 0


def test_ctrl_c_while_the_job_is_being_started_leaves_nothing_running(tmp_path: Path, cloudtrain_home: Path,
                                                                     reaper: None) -> None:
    """Ctrl-C at the worst moment: the job is being written to the node and the runner is starting it.

    Tried a few times: the moment is hit in a different place each time. Every time, the run must
    end interrupted with its job ended (not running, not forever pending)."""
    pattern = "local/*/.cloudtrain/early-sigint/jobs/*-run/env.sh"
    outcomes = []
    for attempt in range(8):
        pids = tmp_path / f"pids-{attempt}"
        recipe = write_recipe(tmp_path, "early-sigint", run_block(
            f"mkdir -p {pids}\necho $$ > {pids}/job.tmp && mv {pids}/job.tmp {pids}/job\nsleep 600\n"))
        proc = start_cli("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
                         stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not any(cloudtrain_home.glob(pattern)) and proc.poll() is None and time.monotonic() < deadline:
            pass  # as tight as it gets: the window is the runner's start
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 130, err
        job = last_job("early-sigint", "early-sigint")
        pid = int((pids / "job").read_text()) if (pids / "job").is_file() else None
        outcomes.append((job and job["status"], pid is not None and _alive(pid)))
        down = cloudtrain("down", "early-sigint")
        assert down.returncode == 0, down.stderr
    # `succeeded` cannot be: the job sleeps for 10 minutes (it would mean a cut script ran).
    bad = [o for o in outcomes if o[0] in ("pending", "running", "succeeded") or o[1]]
    assert not bad, f"(job row state, job process alive) after each interrupted run: {outcomes}"


# ----------------------------------------------------------------------- 2. setup and detached jobs


def test_ctrl_c_during_setup_ends_the_setup_job(tmp_path: Path, reaper: None) -> None:
    pids = tmp_path / "pids"
    setup = spawner(pids, foreground="sleep 601")
    recipe = write_recipe(tmp_path, "setup-sigint", run_block(setup, "setup") + "run: echo never\n")
    # --keep: the cluster (and anything the setup left running) stays after the run.
    proc = start_cli("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    found = wait_pids(pids)
    out, err = interrupt(proc)
    assert proc.returncode == 130, out + err
    assert_all_gone(found)
    job = last_job("setup-sigint", "setup-sigint")
    assert job is not None and job["id"].endswith("-setup") and job["status"] not in ("running", "pending"), job
    assert status_json()["runs"][0]["status"] == "interrupted"
    assert cloudtrain("down", "setup-sigint").returncode == 0


# --------------------------------------------------------------------------- 3. cluster names


def _created(tmp_path: Path, home: Path) -> list[Path]:
    """Files that an invalid name could have created: lock files outside locks/, run dirs, victims."""
    found = [p for p in tmp_path.rglob("*.lock") if p.parent != home / "locks"]
    found += [p for p in tmp_path.rglob("*") if "victim" in p.name and p.name != "victim.yaml"]
    found += [p for p in (tmp_path / "runs").glob("*")] if (tmp_path / "runs").exists() else []
    return found


@pytest.mark.parametrize(
    "args",
    [
        ["run", "victim.yaml", "--cluster", "../victim"],
        ["run", "victim.yaml", "--cluster", "Bad_Name"],
        ["run", "victim.yaml", "-c", "../../victim"],
        ["up", "victim.yaml", "--cluster", "../victim"],
        ["logs", "../x"],
        ["logs", "../x", "-f"],
        ["status", "../x"],
        ["stop", "../x"],
        ["start", "../x"],
        ["down", "../x"],
        ["down", "fine", "../x"],
        ["exec", "../x", "--", "true"],
        ["cancel", "../x"],
        ["cancel", "../x", "--all"],
        ["collect", "../x"],
        ["logs", "Bad_Name"],
    ],
    ids=lambda a: " ".join(a),
)
def test_invalid_cluster_name_is_refused_at_every_verb(tmp_path: Path, cloudtrain_home: Path, reaper: None,
                                                       args: list[str]) -> None:
    write_recipe(tmp_path, "victim", "run: echo should not run\n")
    proc = cloudtrain(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(word in lines[0] for word in NAME_RULE_WORDS), lines[0]
    assert "Traceback" not in proc.stderr and "should not run" not in proc.stdout
    assert _created(tmp_path, cloudtrain_home) == []
    data = status_json()
    assert data["runs"] == [] and data["clusters"] == []


# --------------------------------------------------------------------------- 5. job state is fresh


def test_finished_detached_job_shows_its_final_state(tmp_path: Path, reaper: None) -> None:
    recipe = write_recipe(tmp_path, "fresh", "run: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    first = cloudtrain("exec", "fresh", "-d", "--", "sh", "-c", "exit 3")
    assert first.returncode == 0, first.stderr

    # Plain `status` (no NAME, no --refresh) reads a local cluster's job files.
    def plain_says_failed() -> bool:
        job = last_job("fresh")
        return job is not None and job["status"] == "failed" and job["exit_code"] == 3

    _wait_for(plain_says_failed, what="plain `status --json` to show the job failed (3)")
    assert "failed (3)" in cloudtrain("status").stdout
    job = last_job("fresh", "--refresh")
    assert job is not None and job["status"] == "failed" and job["exit_code"] == 3, job

    # `status NAME` asks the node.
    second = cloudtrain("exec", "fresh", "-d", "--", "sh", "-c", "exit 4")
    assert second.returncode == 0, second.stderr
    second_id = started_job_id(second)

    def named_says_failed() -> bool:
        out = cloudtrain("status", "fresh").stdout
        return f"last job {second_id}: failed, exit code 4" in out

    _wait_for(named_says_failed, what="`status fresh` to show the second job failed (4)")
    job = last_job("fresh", "fresh")
    assert job is not None and job["id"] == second_id and job["status"] == "failed" and job["exit_code"] == 4
    assert cloudtrain("down", "fresh").returncode == 0


@pytest.mark.parametrize("code", [3, 0])
def test_logs_follow_exits_with_the_jobs_own_code(tmp_path: Path, reaper: None, code: int) -> None:
    recipe = write_recipe(tmp_path, "follow", "run: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    started = cloudtrain("exec", "follow", "-d", "--", f"echo before; sleep 1; echo after; exit {code}")
    assert started.returncode == 0, started.stderr
    followed = cloudtrain("logs", "follow", "-f", timeout=120)
    assert followed.returncode == code, followed.stdout + followed.stderr
    assert followed.stdout.splitlines() == ["before", "after"]
    again = cloudtrain("logs", "follow", "-f", timeout=120)  # the job is long over: same answer
    assert again.returncode == code, again.stdout + again.stderr
    assert cloudtrain("down", "follow").returncode == 0


def test_new_cluster_of_the_same_name_has_no_old_jobs(tmp_path: Path, reaper: None) -> None:
    recipe = write_recipe(tmp_path, "reborn", "run: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    old = cloudtrain("exec", "reborn", "--", "echo", "old job")
    assert old.returncode == 0 and "old job" in old.stdout
    assert last_job("reborn") is not None
    assert cloudtrain("down", "reborn").returncode == 0
    assert cloudtrain("up", str(recipe)).returncode == 0
    data = status_json("reborn")
    assert [c["name"] for c in data["clusters"]] == ["reborn"]
    assert data["clusters"][0]["last_job"] is None
    table = cloudtrain("status").stdout
    assert "LAST JOB" in table and "reborn" in table
    row = next(line for line in table.splitlines() if line.startswith("reborn"))
    assert row.split()[-1] == "-", row
    logs = cloudtrain("logs", "reborn")
    assert logs.returncode == 2 and "no jobs yet" in logs.stderr, logs.stdout + logs.stderr
    assert cloudtrain("down", "reborn").returncode == 0


# ------------------------------------------------------------------------ 6. two runs, one cluster


def _waiting_job(tmp_path: Path, tag: str) -> tuple[str, Path, Path]:
    started, go = tmp_path / f"{tag}-started", tmp_path / f"{tag}-go"
    script = f"echo started > {started}\nwhile [ ! -f {go} ]; do sleep 0.1; done\necho finished-{tag}\n"
    return run_block(script), started, go


def test_second_run_on_a_busy_cluster_is_refused(tmp_path: Path, reaper: None) -> None:
    body, started, go = _waiting_job(tmp_path, "a")
    recipe_a = write_recipe(tmp_path, "shared", body)
    proc_a = start_cli("run", str(recipe_a), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    try:
        _wait_for(started.exists, timeout=120, what="run A's job to start")
        run_a = next(r["id"] for r in status_json()["runs"] if r["status"] == "running")
        recipe_b = write_recipe(tmp_path, "other", "run: echo run-b-ran\n")
        second = cloudtrain("run", str(recipe_b), "--cluster", "shared", "--runs-dir", str(tmp_path / "runs-b"),
                            cwd=tmp_path, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert run_a in lines[0] and "--cluster" in lines[0], lines[0]
        assert "run-b-ran" not in second.stdout
        # Refused, not failed: no run row and no run directory for it (issue 24.11).
        assert [r["id"] for r in status_json()["runs"]] == [run_a]
        assert not (tmp_path / "runs-b").exists()
        go.write_text("")
        out, err = proc_a.communicate(timeout=300)
    finally:
        go.write_text("")
        if proc_a.poll() is None:
            proc_a.kill()
            proc_a.communicate()
    assert proc_a.returncode == 0, out + err
    run_dir = Path(out.strip().splitlines()[-1])
    assert run_dir.name == run_a
    assert "finished-a" in (run_dir / "job.log").read_text()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["teardown"] == "down"
    data = status_json()
    assert data["clusters"] == []
    assert next(r for r in data["runs"] if r["id"] == run_a)["status"] == "succeeded"


def test_run_keeps_its_cluster_while_a_detached_job_runs_on_it(tmp_path: Path, reaper: None) -> None:
    body, started, go = _waiting_job(tmp_path, "a")
    recipe = write_recipe(tmp_path, "busy-host", body)
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    pids = tmp_path / "pids"
    try:
        _wait_for(started.exists, timeout=120, what="the run's job to start")
        detached = cloudtrain("exec", "busy-host", "-d", "--", spawner(pids, foreground="sleep 600"))
        assert detached.returncode == 0, detached.stderr
        job_id = started_job_id(detached)
        found = wait_pids(pids)
        go.write_text("")
        out, err = proc.communicate(timeout=300)
    finally:
        go.write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert f"cluster busy-host kept: job {job_id} is still running" in err, err
    run_dir = Path(out.strip().splitlines()[-1])
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["teardown"] == "kept"
    assert [c["name"] for c in status_json()["clusters"]] == ["busy-host"]
    assert all(_alive(pid) for pid in found.values()), "the detached job was ended by the run's teardown"
    cancel = cloudtrain("cancel", "busy-host", "--all")
    assert cancel.returncode == 0 and f"job {job_id}: killed" in cancel.stdout, cancel.stdout + cancel.stderr
    assert_all_gone(found)
    assert cloudtrain("down", "busy-host").returncode == 0


# ------------------------------------------------------------------- 7. teardown flags and spot


@pytest.fixture
def no_real_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    for key, value in {
        "AWS_ACCESS_KEY_ID": "AKIDUMMYDUMMYDUMMY", "AWS_SECRET_ACCESS_KEY": "dummy-secret",
        "AWS_SESSION_TOKEN": "dummy-token", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}", "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{closed}",
        "AWS_ENDPOINT_URL_STS": f"http://127.0.0.1:{closed}", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.mark.parametrize("which", ["bundled", "minimal"])
def test_spot_with_stop_is_refused_before_anything_exists(tmp_path: Path, cloudtrain_home: Path,
                                                          no_real_aws: None, which: str) -> None:
    if which == "bundled":
        recipe = REPO / "recipes" / "mnist-aws-spot.yaml"
    else:
        recipe = write_recipe(tmp_path, "spotty", "resources: {cloud: aws, spot: true, region: us-east-1, "
                                                  "instance_type: t3.medium}\nrun: echo\n")
    proc = cloudtrain("run", str(recipe), "--stop", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "spot instances cannot be stopped" in lines[0] and "--down" in lines[0] and "--keep" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()
    assert not (cloudtrain_home / "keys").exists() or not any((cloudtrain_home / "keys").iterdir())
    data = status_json()
    assert data["runs"] == [] and data["clusters"] == []


@pytest.mark.parametrize("flags", [("--down", "--keep"), ("--stop", "--keep"), ("--down", "--stop")])
def test_contradicting_teardown_flags_are_one_line_exit_2(tmp_path: Path, reaper: None,
                                                          flags: tuple[str, str]) -> None:
    recipe = write_recipe(tmp_path, "flags", "run: echo should not run\n")
    proc = cloudtrain("run", str(recipe), *flags, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flags[0] in lines[0] and flags[1] in lines[0], proc.stderr
    assert "should not run" not in proc.stdout
    assert not (tmp_path / "runs").exists()
    data = status_json()
    assert data["runs"] == [] and data["clusters"] == []


# ---------------------------------------------------------------- 4. unsafe result members


def test_symlink_out_of_the_results_is_refused_and_the_rest_comes_home(tmp_path: Path, reaper: None) -> None:
    recipe = write_recipe(tmp_path, "links", run_block(textwrap.dedent("""\
        rm -rf outputs && mkdir -p outputs/sub
        echo one > outputs/a.txt
        echo two > outputs/sub/b.txt
        ln -s /etc outputs/etc-link
        echo job done
    """)) + "results: [outputs]\n")
    proc = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert (run_dir / "outputs" / "a.txt").read_text() == "one\n"
    assert (run_dir / "outputs" / "sub" / "b.txt").read_text() == "two\n"
    assert "job done" in (run_dir / "job.log").read_text()
    link = run_dir / "outputs" / "etc-link"
    assert not link.exists() and not link.is_symlink()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert len(record["refused"]) == 1, record["refused"]
    member, reason = record["refused"][0]
    assert member.endswith("etc-link") and reason
    assert "outputs/a.txt" in record["results"] and not any("etc-link" in r for r in record["results"])
    assert "refused" in proc.stdout  # the summary says so
    assert "etc-link" in proc.stderr  # and the warning names the member
    assert status_json()["clusters"] == []
