"""run.json: the typed record every run leaves in its run directory, written and read in one place."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

FILE_NAME = "run.json"


@dataclass(frozen=True)
class RunJson:
    run_id: str
    status: str  # succeeded | failed | interrupted
    exit_code: int | None
    error: str | None
    recipe: dict[str, str]
    cluster: str | None
    provider: str
    instance_type: str | None
    num_nodes: int
    hourly_price_usd: float
    cost_usd: float
    phases_s: dict[str, float]
    started_at: float
    ended_at: float
    wall_time_s: float
    teardown: str  # down | stopped | kept | failed | none | gone (another command took it down)
    job_id: str
    result_paths: tuple[str, ...] = ()
    results: tuple[str, ...] = ()  # files written into the run directory
    # result paths under which node 0 had nothing this run wrote (a typo in `results:`?)
    empty_result_paths: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()  # (member, reason): unsafe members the node offered
    collect_error: str | None = None  # why not everything came home; None when it all did, verified
    collect_attempts: int = 0
    upload: str | None = None  # where the node uploaded the results (recipe `upload:`), docs/data.md
    # A recovering run (recipe `recover:`): one entry per attempt, each with its placement, times,
    # cost and why it ended (run/recover.py); empty otherwise.
    attempts: tuple[dict[str, Any], ...] = ()

    def write(self, run_dir: Path) -> None:
        data = asdict(self)
        tmp = run_dir / f".{FILE_NAME}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, run_dir / FILE_NAME)

    @classmethod
    def read(cls, run_dir: Path) -> RunJson:
        data: dict[str, Any] = json.loads((run_dir / FILE_NAME).read_text())
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("result_paths", "results", "empty_result_paths"):
            values[name] = tuple(values.get(name, ()))
        values["refused"] = tuple(tuple(x) for x in values.get("refused", ()))
        values["attempts"] = tuple(values.get("attempts", ()))
        return cls(**values)

    def with_collect(self, **changes: Any) -> RunJson:
        return replace(self, **changes)
