"""run/driver.probe: how a drive's processes read, on this machine (the probe is plain sh).

The run's process and drive.sh's wrapper end one after the other: between the run's exit and the
wrapper's `exit_code`, the drive is still running (it read as gone: `driver log -f` exited 1 and
`driver cancel` said "nothing to stop" on runs that had ended well).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cloudtrain.remote.local import LocalTransport
from cloudtrain.run.driver import DriveState, probe


def _sleeper(*args: str) -> subprocess.Popen:
    """A process whose arguments end with `args` (one process: nothing of it outlives a kill)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_drive_reads_starting_running_ending_ended_and_gone(tmp_path: Path) -> None:
    drive = tmp_path / "drive"
    (drive / "runs" / "t-20261125-214436-4a1a").mkdir(parents=True)
    transport = LocalTransport(tmp_path)
    assert probe(transport, str(drive)).state == DriveState.STARTING  # the wrapper has not written its pid

    # A stand-in wrapper: its arguments name drive.sh, as `sh drive.sh` does.
    wrapper = _sleeper("drive.sh")
    run = _sleeper("run", "recipe.yaml", "--runs-dir", f"{drive}/runs")
    try:
        (drive / "wrapper").write_text(f"{wrapper.pid}\n")
        assert probe(transport, str(drive)).state == DriveState.STARTING
        (drive / "pid").write_text(f"{run.pid}\n")
        seen = probe(transport, str(drive))
        assert (seen.state, seen.pid, seen.runs) == (DriveState.RUNNING, run.pid, ("t-20261125-214436-4a1a",))
        run.kill()
        run.wait()
        # The run has ended, its wrapper is about to write exit_code: still running, not gone.
        assert probe(transport, str(drive)).state == DriveState.RUNNING
        (drive / "exit_code").write_text("0\n")
        seen = probe(transport, str(drive))
        assert (seen.state, seen.exit_code) == (DriveState.ENDED, 0)
        (drive / "exit_code").unlink()
    finally:
        for proc in (wrapper, run):
            proc.kill()
            proc.wait()
    assert probe(transport, str(drive)).state == DriveState.GONE  # both gone, no exit code: killed, or a restart


def test_a_reused_pid_is_not_the_driven_run(tmp_path: Path) -> None:
    drive = tmp_path / "drive"
    (drive / "runs").mkdir(parents=True)
    other = _sleeper("something else")  # alive, but not the drive's run (its arguments say so)
    try:
        (drive / "wrapper").write_text(f"{_dead_pid()}\n")
        (drive / "pid").write_text(f"{other.pid}\n")
        assert probe(LocalTransport(tmp_path), str(drive)).state == DriveState.GONE
    finally:
        other.kill()
        other.wait()
