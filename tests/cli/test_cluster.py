"""`status --json`: values as JSON values (result_paths a list, not JSON in a string), and an ISO
8601 UTC time beside every epoch time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cloudtrain.cli.output import json_record
from cloudtrain.state import RunRecord, StateStore
from tests.conftest import cloudtrain


@pytest.mark.parametrize(("row", "decode", "expected"), [
    ({"started_at": 0, "name": "x"}, (), {"started_at": 0, "started_at_iso": "1970-01-01T00:00:00Z", "name": "x"}),
    ({"ended_at": None}, (), {"ended_at": None, "ended_at_iso": None}),
    ({"created_at": 1795607061.27}, (), {"created_at": 1795607061.27, "created_at_iso": "2026-11-25T11:44:21Z"}),
    ({"result_paths": '["outputs", "x"]'}, ("result_paths",), {"result_paths": ["outputs", "x"]}),
    ({"result_paths": "not json"}, ("result_paths",), {"result_paths": "not json"}),
    ({"flag_at": True}, (), {"flag_at": True}),  # not an epoch
])
def test_json_record(row: dict[str, Any], decode: tuple[str, ...], expected: dict[str, Any]) -> None:
    assert json_record(row, decode) == expected


def test_status_json_has_lists_and_iso_times() -> None:
    StateStore().insert_run(RunRecord(
        id="r-1", cluster="c", recipe_path=None, recipe_digest=None, run_dir=None, status="succeeded", exit_code=0,
        provider="local", instance_type=None, hourly_price=0.0, cost_usd=0.0, started_at=86400.0, ended_at=86460.0,
        result_paths=json.dumps(["outputs"])))
    shown = cloudtrain("status", "--json")
    assert shown.returncode == 0, shown.stderr
    (run,) = json.loads(shown.stdout)["runs"]
    assert run["result_paths"] == ["outputs"]
    assert (run["started_at"], run["started_at_iso"]) == (86400.0, "1970-01-02T00:00:00Z")
    assert (run["ended_at"], run["ended_at_iso"]) == (86460.0, "1970-01-02T00:01:00Z")
