"""`cloudtrain report`: one self-contained HTML file of spend, what bills now, runs, sweeps and
leaks. Its numbers come from the functions behind `cost --json`, `status --json`, `sweep status
--json` and `gc` (data.py); the page is drawn by html.py with SVG charts from svg.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cloudtrain.state import StateStore


def write_report(store: StateStore, out_path: Path, since: float, now: float, leaks: Any = None,
                 problems: list[str] | None = None) -> Path:
    """Gather, render and write the page atomically (a reader never sees half a file); returns its path."""
    from cloudtrain.report.data import gather
    from cloudtrain.report.html import render

    out_path = out_path.expanduser()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    page = render(gather(store, since, now, leaks, problems), out_path.parent)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out_path)
    return out_path
