"""`runner.sh kill JOBDIR GRACE` gives the job GRACE seconds to end on TERM (templates/runner.sh).

An interruption notice kills the job with the cloud's grace (EC2 100 s, GCP and Azure 20 s) so that
it can write a last checkpoint. The job's own process is usually not the supervisor's child: a
`run:` line is a script (`python train.py`, `sh train.sh`) that dash runs as a child of `sh cmd.sh`,
and that wrapper shell dies at once on TERM. The supervisor used to take its child's death as the
job's end and KILL what was left after its own start grace (10 s), cutting a checkpoint in the
middle: the kill's grace has to hold for every process of the job.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cloudtrain import paths
from cloudtrain.testing.wait import wait_until

RUNNER = paths.templates_dir() / "runner.sh"

# Traps TERM, then takes `slow` seconds (longer than the supervisor's start grace) to "write its
# checkpoint"; started as a child of cmd.sh's shell, like any `run:` command.
TRAINER = """\
trap 'sleep {slow}; echo saved > "$OUT/final"; exit 143' TERM
echo ready > "$OUT/ready"
while :; do sleep 0.05; done
"""


def _start(tmp_path: Path, *, start_grace: int, slow: float) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (tmp_path / "trainer.sh").write_text(TRAINER.format(slow=slow))
    (job / "cmd.sh").write_text(f'sh "{tmp_path}/trainer.sh"\n')
    (job / "env.sh").write_text(f'export OUT="{tmp_path}"\n')
    subprocess.run(["sh", str(RUNNER), "start", str(job), str(start_grace)], check=True, capture_output=True, timeout=30)
    wait_until(lambda: (tmp_path / "ready").exists(), 30, "the job to start")
    return job


def _status(job: Path) -> dict:
    out = subprocess.run(["sh", str(RUNNER), "status", str(job)], check=True, capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)


@pytest.mark.parametrize(("start_grace", "kill_grace", "slow", "saved"), [
    # The kill's grace outlasts the supervisor's start grace: the job's TERM handler finishes.
    (1, 8, 2.5, True),
    # A handler slower than the kill's grace is KILLed, as documented (TERM, then KILL after GRACE).
    (1, 1, 6, False),
])
def test_the_kill_grace_holds_for_a_job_under_its_wrapper_shell(
        tmp_path: Path, start_grace: int, kill_grace: int, slow: float, saved: bool) -> None:
    job = _start(tmp_path, start_grace=start_grace, slow=slow)
    pid = int((job / "pid").read_text())
    try:
        subprocess.run(["sh", str(RUNNER), "kill", str(job), str(kill_grace)], check=True, capture_output=True,
                       timeout=60)
        assert (tmp_path / "final").exists() == saved
        status = _status(job)
        assert status["state"] == "killed" and status["exit_code"] in (143, 137), status
        # Nothing of the job is left (exit_code is written once every process of it is over).
        assert not _session_members(pid)
    finally:
        for member in _session_members(pid):
            os.kill(member, 9)


def _session_members(session: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[3] == str(session) and fields[0] != "Z":
            found.append(int(entry.name))
    return found
