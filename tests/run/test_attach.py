"""`logs NAME [JOB]` on a cluster that is down: the log the chosen run brought home, or one line
listing the jobs its runs had."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cloudtrain.state import RunRecord, StateStore
from tests.conftest import cloudtrain


def _record_run(runs_dir: Path, run_id: str, started: float, log: str | None) -> None:
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "job_id": f"{run_id}-run"}))
    if log is not None:
        (run_dir / "job.log").write_text(log)
    StateStore().insert_run(RunRecord(
        id=run_id, cluster="gone", recipe_path=None, recipe_digest=None, run_dir=str(run_dir), status="succeeded",
        exit_code=0, provider="local", instance_type=None, hourly_price=0.0, cost_usd=0.0, started_at=started,
        ended_at=started + 1))


@pytest.mark.parametrize(("job", "code", "out", "err"), [
    (None, 0, "second\n", ""),                              # default: the newest run
    ("gone-1-run", 0, "first\n", ""),                       # JOB picks its own run's log
    ("gone-1", 0, "first\n", ""),                           # or the run's id
    ("gone-2-run", 0, "second\n", ""),
    ("gone-3-run", 2, "", "its run gone-3 did not bring its log home"),
    ("no-such-job", 2, "", "none of its runs had job 'no-such-job'"),
    ("gone-1-rn", 2, "", "did you mean 'gone-1-run'"),
])
def test_logs_of_a_down_cluster_follow_the_job_asked_for(
    tmp_path: Path, job: str | None, code: int, out: str, err: str
) -> None:
    now = time.time()
    _record_run(tmp_path / "runs", "gone-1", now - 300, "first\n")
    _record_run(tmp_path / "runs", "gone-3", now - 200, None)
    _record_run(tmp_path / "runs", "gone-2", now - 100, "second\n")
    shown = cloudtrain("logs", "gone", *([job] if job else []))
    assert shown.returncode == code, shown.stderr
    assert shown.stdout == out
    assert err in shown.stderr
    if code:
        assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr


def test_an_unknown_job_lists_the_known_ones(tmp_path: Path) -> None:
    now = time.time()
    _record_run(tmp_path / "runs", "gone-1", now - 300, "first\n")
    _record_run(tmp_path / "runs", "gone-2", now - 100, "second\n")
    shown = cloudtrain("logs", "gone", "zzz")
    assert shown.returncode == 2
    assert "gone-2-run, gone-1-run" in shown.stderr
