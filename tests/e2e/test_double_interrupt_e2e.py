"""A second Ctrl-C while an interrupted run cleans up (issue 35.12): reported, never obeyed, at any
moment of the cleanup; the run directory is still the last line, run.json says interrupted, and
nothing is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.testing.cloud import FakeCloud
from cloudtrain.testing.wait import wait_until


@pytest.mark.parametrize("gap_s", [0.0, 0.05, 0.2])
def test_a_second_ctrl_c_during_cleanup_is_reported_not_obeyed(local_cloud: FakeCloud, tmp_path: Path,
                                                               gap_s: float) -> None:
    started = tmp_path / "started"
    recipe = local_cloud.recipe(run=f"touch {started}; sleep 60")
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", local_cloud.cluster,
                             "--runs-dir", str(local_cloud.runs_dir)], env={**os.environ, **local_cloud.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(started.exists, 120, "the job to start")
        proc.send_signal(signal.SIGINT)
        time.sleep(gap_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    assert "Aborted." not in err
    run_dir = Path(out.strip().splitlines()[-1])
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert local_cloud.leftovers() == []
