"""`compare` for any runs, not only the bundled job's: what every `cloudtrain run` records
(run.json: status, exit code, wall time, per-phase timings, cost) and every numeric metric the
runs share from their metrics.json (the convention: the job writes `outputs/metrics.json`, a JSON
object; nested objects are flattened as `a.b`; booleans, lists and text are not metrics), and the
final value of every TensorBoard scalar the run's event files hold (`tb:<dir>/<tag>`, tbscalars.py).

The bundled job's richer table (devices, images/s, speed-up) stays in compare.py; the CLI uses it
when every run is the bundled job's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.compare import REQUIRED, CompareError, find_metrics, read_json, usd
from cloudtrain.tbscalars import final_scalars


@dataclass(frozen=True)
class AnyRun:
    name: str
    path: Path
    status: str | None
    exit_code: int | None
    wall_time_s: float | None
    run_time_s: float | None  # the job itself (the `run` phase)
    cost_usd: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    bundled: bool = False  # its metrics.json is the bundled job's (compare.py's table applies)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON object as {"a.b": value}; booleans, lists, text and non-finite numbers left out."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def load_any(run_dir: Path | str, name: str | None = None) -> AnyRun:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CompareError(f"{run_dir}: no such run directory" if not run_dir.exists() else f"{run_dir}: not a directory")
    record_path = run_dir / "run.json"
    record = read_json(record_path) if record_path.is_file() else {}
    try:
        scalars = final_scalars(run_dir)
    except (OSError, ValueError) as exc:
        raise CompareError(f"{run_dir}: cannot read its TensorBoard event files: {exc}") from None
    try:
        metrics_path: Path | None = find_metrics(run_dir)
    except CompareError:
        if not record and not scalars:
            raise CompareError(f"{run_dir}: no run.json, metrics.json or TensorBoard event file: "
                               "not a run directory") from None
        metrics_path = None
    metrics = read_json(metrics_path) if metrics_path is not None else {}
    phases = record.get("phases_s") if isinstance(record.get("phases_s"), dict) else {}
    return AnyRun(
        name=name or run_dir.resolve().name, path=run_dir,
        status=record.get("status") if isinstance(record.get("status"), str) else None,
        exit_code=record.get("exit_code") if isinstance(record.get("exit_code"), int) else None,
        wall_time_s=_num(record.get("wall_time_s")), run_time_s=_num(phases.get("run")),
        cost_usd=_num(record.get("cost_usd")), metrics={**flatten(metrics), **scalars},
        bundled=metrics_path is not None and all(k in metrics for k in REQUIRED),
    )


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def load_all(dirs: Sequence[Path | str]) -> list[AnyRun]:
    if not dirs:
        raise CompareError("no run directories given")
    names = [Path(d).resolve().name for d in dirs]
    return [load_any(d, name=str(d) if names.count(n) > 1 else n) for d, n in zip(dirs, names)]


def shared_metrics(runs: Sequence[AnyRun]) -> list[str]:
    """The metric names every run has, in the first run's order."""
    if not runs:
        return []
    return [k for k in runs[0].metrics if all(k in r.metrics for r in runs[1:])]


def table(runs: Sequence[AnyRun]) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, rows, metrics only some runs have) for the generic comparison."""
    shared = shared_metrics(runs)
    headers = ["run", "status", "exit", "wall s", "job s", "cost", *shared]
    rows = [[r.name, r.status or "-", "-" if r.exit_code is None else str(r.exit_code), _secs(r.wall_time_s),
             _secs(r.run_time_s), "-" if r.cost_usd is None else usd(r.cost_usd),
             *(_metric(r.metrics[k]) for k in shared)] for r in runs]
    partial = sorted({k for r in runs for k in r.metrics} - set(shared))
    return headers, rows, partial


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _metric(value: float) -> str:
    return f"{value:.6g}"
