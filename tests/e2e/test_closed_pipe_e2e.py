"""A reader that goes away (`cloudtrain run r.yaml | head -3`, `| tee log` then Ctrl-C, a closed
terminal) never stops collect, teardown or run.json (issue 35.1). Each verb that makes or holds a
cluster has its stdout, stderr or both closed at each phase; afterwards nothing is left (the kit's
`leftovers()`), the run is recorded, and what the reader missed is in the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import FakeCloud

JOB = 'for i in $(seq 1 30); do echo "line $i"; done; mkdir -p outputs; echo kept > outputs/result.txt'
PHASES = ["provision", "sync", "run", "collect", "teardown"]


def _start(cloud: FakeCloud, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], env={**os.environ, **cloud.env},
                            cwd=cloud.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _close_at(proc: subprocess.Popen, marker: str | None, close: str, timeout: float = 300) -> None:
    """Read stdout until a line starts with `marker` (None: at once), then close the named streams'
    read ends, drain the others and wait for the command."""
    assert proc.stdout is not None and proc.stderr is not None
    if marker is not None:
        for line in proc.stdout:
            if line.startswith(marker):
                break
        else:
            pytest.fail(f"the command ended before printing {marker!r}")
    if close in ("stdout", "both"):
        proc.stdout.close()
    if close in ("stderr", "both"):
        proc.stderr.close()
    for stream in (proc.stdout, proc.stderr):
        if not stream.closed:
            stream.read()
    proc.wait(timeout=timeout)


def _run_closing_at(cloud: FakeCloud, phase: str, close: str) -> dict:
    """`cloudtrain run` of JOB with `close` gone at `phase`: it exits 0; its run.json."""
    recipe = cloud.recipe(run=JOB, results=["outputs"])
    proc = _start(cloud, "run", str(recipe), "--cluster", cloud.cluster, "--runs-dir", str(cloud.runs_dir))
    try:
        _close_at(proc, f"==> {phase}", close)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    return json.loads((_only_run_dir(cloud) / "run.json").read_text())


def _only_run_dir(cloud: FakeCloud) -> Path:
    found = [p for p in cloud.runs_dir.iterdir() if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("close", ["stdout", "stderr", "both"])
@pytest.mark.parametrize("phase", PHASES)
def test_run_with_a_reader_gone_at_each_phase_cleans_up(local_cloud: FakeCloud, phase: str, close: str) -> None:
    record = _run_closing_at(local_cloud, phase, close)
    run_dir = _only_run_dir(local_cloud)
    assert record["status"] == "succeeded" and record["teardown"] == "down", record
    assert (run_dir / "outputs" / "result.txt").read_text() == "kept\n"
    assert local_cloud.leftovers() == []
    if close != "stderr":
        # What the reader missed, the last line (the run directory) included, is beside the results.
        assert str(run_dir) in (run_dir / "console.log").read_text()


@pytest.mark.parametrize("close", ["stdout", "both"])
def test_up_exec_and_down_with_the_reader_gone(local_cloud: FakeCloud, close: str) -> None:
    recipe = local_cloud.recipe(run=JOB)
    up = _start(local_cloud, "up", str(recipe), "--cluster", local_cloud.cluster)
    _close_at(up, "==> provision", close)
    assert up.returncode == 0
    exec_ = _start(local_cloud, "exec", local_cloud.cluster, "--", "sh", "-c", JOB)
    _close_at(exec_, "line 1", close)
    assert exec_.returncode == 0
    down = _start(local_cloud, "down", local_cloud.cluster)
    _close_at(down, None, close)
    assert down.returncode == 0
    assert local_cloud.leftovers() == []


def test_a_command_started_with_its_output_closed_writes_nothing_into_its_files(local_cloud: FakeCloud) -> None:
    """`cloudtrain run r.yaml >&- 2>&-`: descriptors 1 and 2 do not exist, so the first files opened
    (the state database) would take them, and every line printed would land in them."""
    recipe = local_cloud.recipe(run=JOB, results=["outputs"])
    args = [sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", local_cloud.cluster,
            "--runs-dir", str(local_cloud.runs_dir)]
    # The shell closes both before exec, as `>&- 2>&-` does.
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&- 2>&-', "sh", *args], env={**os.environ, **local_cloud.env},
                          cwd=local_cloud.root, timeout=300, check=False)
    assert proc.returncode == 0
    run_dir = _only_run_dir(local_cloud)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    status = local_cloud.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["clusters"] == []
    assert local_cloud.leftovers() == []


@pytest.mark.skipif(not sshd.sshd_available() and not os.environ.get("CI"), reason="OpenSSH sshd is not installed")
@pytest.mark.parametrize("phase,close", [("run", "stdout"), ("collect", "both"), ("teardown", "both")])
def test_a_cloud_run_with_the_reader_gone_leaves_no_vm(aws_cloud: FakeCloud, phase: str, close: str) -> None:
    assert _run_closing_at(aws_cloud, phase, close)["status"] == "succeeded"
    assert aws_cloud.leftovers() == []
    assert aws_cloud.bill.running(aws_cloud.cluster) == []  # type: ignore[attr-defined]
