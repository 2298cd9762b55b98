"""run/recover_logs.py: which attempt `logs -f` follows on a recovering run, and when its end is
told as the attempt's end (the node went) rather than as the connection's error."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.errors import CloudtrainError
from cloudtrain.run.recover_logs import Followed, attempt_ended, followed_attempt
from cloudtrain.state import RunRecord, StateStore

pytestmark = pytest.mark.quick


def _run(tmp_path: Path, status: str, attempts: list[dict[str, Any]] | None) -> Path:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    if attempts is not None:
        (run_dir / "attempts.json").write_text(json.dumps(attempts))
    StateStore().insert_run(RunRecord(
        id="r1", cluster="c", recipe_path=None, recipe_digest=None, run_dir=str(run_dir), status=status,
        exit_code=None, provider="aws", instance_type=None, hourly_price=0.0, cost_usd=0.0, started_at=time.time(),
        ended_at=None))
    return run_dir


@pytest.mark.parametrize(("status", "attempts", "attempt"), [
    ("running", [{"number": 1, "outcome": "preempted"}, {"number": 2, "outcome": "running"}], 2),
    ("running", [{"number": 1, "outcome": "running"}], 1),
    ("running", None, None),                                   # no recover: (no attempts.json)
    ("running", [{"number": 1, "outcome": "preempted"}], None),  # between attempts: nothing running
    ("succeeded", [{"number": 1, "outcome": "succeeded"}], None),
])
def test_the_followed_attempt(tmp_path: Path, status: str, attempts: list | None, attempt: int | None) -> None:
    run_dir = _run(tmp_path, status, attempts)
    found = followed_attempt(StateStore(), "c")
    assert found == (None if attempt is None else Followed("r1", run_dir, attempt))


@pytest.mark.parametrize(("outcome", "told"), [
    ("preempted", "stopped following attempt 1 of run r1: preempted (spot reclaimed)"),
    ("lost", "stopped following attempt 1 of run r1: lost (spot reclaimed)"),
    ("running", None),  # the attempt goes on: the connection's own error stands
    ("failed", None),
])
def test_the_end_of_a_followed_attempt(tmp_path: Path, outcome: str, told: str | None) -> None:
    run_dir = _run(tmp_path, "running", [{"number": 1, "outcome": outcome, "reason": "spot reclaimed"}])
    ended = attempt_ended(Followed("r1", run_dir, 1), "c", CloudtrainError("ssh: connection refused"))
    if told is None:
        assert ended is None
    else:
        assert ended is not None and ended.message.startswith(told)
        assert ended.hint is not None and "`cloudtrain logs c -f` follows the next attempt" in ended.hint
