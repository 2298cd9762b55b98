"""One rule for "is this job still running", read three ways (issue 22.8): by `runner.sh status`
on the node, by the node's watchdog when the runner is missing, and by `status` on the laptop for
local nodes (the last two through one implementation, cloudtrain/node/jobs.py). A job's supervisor is identified by (boot id, pid, start time), written by the runner
as `identity`: a pid that lives but belongs to another process now (reused after a reboot) is a
lost job, not a running one, so autostop fires and `cancel` signals nobody else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import paths, procid
from cloudtrain.node.jobs import job_state
from cloudtrain.run.jobstate import peek_local
from cloudtrain.state import JobRecord

RUNNER = paths.templates_dir() / "runner.sh"


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen]:
    """A live process that is not any job's supervisor: what a reused pid points at."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# (case, files written into the job dir; "{live}" is the live process's pid and "{ident}" its
# identity, "{dead}" a pid that no longer exists; expected: runner status, watchdog, laptop)
CASES = [
    ("succeeded", {"pid": "{dead}", "exit_code": "0"}, ("succeeded", "succeeded", "succeeded")),
    ("failed", {"pid": "{dead}", "exit_code": "3"}, ("failed", "failed", "failed")),
    ("cancelled", {"pid": "{dead}", "exit_code": "1", "cancelled": ""}, ("killed", "killed", "killed")),
    ("ended by TERM", {"pid": "{dead}", "exit_code": "143"}, ("killed", "killed", "killed")),
    ("never started", {}, ("pending", "pending", "running")),
    ("running, identity matches", {"pid": "{live}", "identity": "{ident}"}, ("running", "running", "running")),
    ("pid reused: another start time", {"pid": "{live}", "identity": "{boot}:{live}:1"}, ("lost", "lost", "lost")),
    ("pid reused after a reboot", {"pid": "{live}", "identity": "not-this-boot:{live}:{ticks}"},
     ("lost", "lost", "lost")),
    ("supervisor gone", {"pid": "{dead}", "identity": "{boot}:{dead}:5"}, ("lost", "lost", "lost")),
    ("started before identities (pid only)", {"pid": "{live}"}, ("running", "running", "running")),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_rule_three_readers(case, other_process: subprocess.Popen, cloudtrain_home: Path) -> None:  # noqa: ANN001
    name, files, (by_runner, by_watchdog, by_laptop) = case
    live = other_process.pid
    values = {"live": live, "dead": _dead_pid(), "ident": procid.identity(live), "boot": procid.boot_id(),
              "ticks": procid.start_ticks(live)}
    job_dir = paths.home() / "nodes" / "n0" / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    for file, text in files.items():
        (job_dir / file).write_text(text.format(**values) + "\n")

    status = json.loads(subprocess.run(["sh", str(RUNNER), "status", str(job_dir)], capture_output=True,
                                       text=True, check=True).stdout)
    assert status["state"] == by_runner
    assert job_state(str(job_dir), "/nonexistent/runner.sh") == by_watchdog
    record = JobRecord(id="j1", cluster="c", run_id=None, job_dir=str(job_dir), status="running", command=None,
                       submitted_at=time.time(), started_at=None, ended_at=None, exit_code=None)
    # The laptop reads only jobs it still believes open; "never started" stays as state has it.
    assert peek_local(record).status == by_laptop


def test_the_runner_records_the_supervisors_identity(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "cmd.sh").write_text("sleep 30\n")
    pid = int(subprocess.run(["sh", str(RUNNER), "start", str(job_dir)], capture_output=True, text=True,
                             check=True).stdout)
    try:
        assert (job_dir / "identity").read_text().strip() == procid.identity(pid)
        assert procid.alive((job_dir / "identity").read_text().strip(), pid)
    finally:
        subprocess.run(["sh", str(RUNNER), "kill", str(job_dir), "1"], check=True)
    assert not procid.alive((job_dir / "identity").read_text().strip(), pid)
