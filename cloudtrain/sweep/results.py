"""What a sweep leaves in runs/sweep-<id>/: leaderboard, sweep.csv, sweep.json, plots, the best trial.

    leaderboard.txt    trials ranked by the metric: parameters, metric, duration, cost, attempts
    sweep.csv          one row per trial (the same, machine-readable, with the run directory)
    attempts.csv       one row per attempt: VM, start, end, outcome, cost
    sweep.json         the sweep's summary: budget, spend, counts, best trial
    plots/metric_vs_<param>.png, plots/cost_vs_metric.png, plots/timeline.png
    best -> trials/tNNNN-aK/<run-id>/   the best trial's run directory (its artifacts)
    trials/            every attempt's run directory, as `cloudtrain run` writes them

Rewritten whole at the end of a sweep (and by `sweep status ID --write`), so it is safe to repeat.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.sweep.model import Attempt, Outcome, Snapshot, Trial, TrialState, Vm
from cloudtrain.sweep.spec import SweepSpec


@dataclass(frozen=True)
class TrialRow:
    trial: Trial
    attempts: tuple[Attempt, ...]
    duration_s: float
    cost_usd: float
    run_dir: Path | None


@dataclass(frozen=True)
class Written:
    leaderboard: Path
    csv: Path
    plots: tuple[Path, ...]
    best: Path | None
    plot_error: str | None = None


def trial_rows(snapshot: Snapshot, results_dir: Path, now: float) -> list[TrialRow]:
    from cloudtrain.sweep.backend import attempt_dir

    by_trial: dict[int, list[Attempt]] = {}
    for a in snapshot.attempts:
        by_trial.setdefault(a.trial, []).append(a)
    rows = []
    for t in sorted(snapshot.trials, key=lambda t: t.number):
        attempts = tuple(sorted(by_trial.get(t.number, []), key=lambda a: a.attempt))
        run_dir = None
        cost = 0.0
        for a in attempts:
            found = sorted(p for p in attempt_dir(results_dir, a.trial, a.attempt).glob("*") if p.is_dir())
            run_dir = found[-1] if found else run_dir
            ran = _run_cost(found[-1]) if found else None
            # An attempt still running (or whose run left no record) counts its VM time so far.
            cost += ran if ran is not None else a.cost_usd(now)
        duration = sum(((a.ended_at or now) - a.started_at) for a in attempts)
        rows.append(TrialRow(t, attempts, duration, cost, run_dir))
    return rows


def _run_cost(run_dir: Path) -> float | None:
    """One number per run: the attempt's run.json (its share of its VM's billed time, as `cost`
    lists the run); None where it has none yet."""
    try:
        return float(json.loads((run_dir / "run.json").read_text())["cost_usd"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ranked(rows: Sequence[TrialRow], goal: str) -> list[TrialRow]:
    done = [r for r in rows if r.trial.state == TrialState.SUCCEEDED and r.trial.value is not None]
    done.sort(key=lambda r: ((-r.trial.value if goal == "max" else r.trial.value), r.trial.number))  # type: ignore[operator]
    rest = [r for r in rows if r not in done]
    return done + rest


def write_results(results_dir: Path, spec: SweepSpec, snapshot: Snapshot, summary: dict[str, Any],
                  now: float) -> Written:
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = ranked(trial_rows(snapshot, results_dir, now), spec.goal)
    leaderboard = results_dir / "leaderboard.txt"
    _atomic(leaderboard, leaderboard_text(rows, spec, summary))
    table = results_dir / "sweep.csv"
    with _atomic_open(table) as out:
        writer = csv.writer(out)
        writer.writerow(["rank", "trial", "state", *spec.params, spec.metric, "attempts", "duration_s", "cost_usd",
                         "error", "run_dir"])
        for rank, r in enumerate(rows, 1):
            params = r.trial.param_dict()
            writer.writerow([rank if r.trial.state == TrialState.SUCCEEDED else "", r.trial.number,
                             r.trial.state.value, *(params.get(p, "") for p in spec.params),
                             "" if r.trial.value is None else r.trial.value, len(r.attempts),
                             round(r.duration_s, 3), round(r.cost_usd, 6), r.trial.error or "",
                             "" if r.run_dir is None else os.path.relpath(r.run_dir, results_dir)])
    with _atomic_open(results_dir / "attempts.csv") as out:
        writer = csv.writer(out)
        writer.writerow(["trial", "attempt", "vm", "outcome", "started_at", "ended_at", "value", "cost_usd", "error"])
        for a in sorted(snapshot.attempts, key=lambda a: (a.started_at, a.trial, a.attempt)):
            writer.writerow([a.trial, a.attempt, a.vm, a.state.value, round(a.started_at, 3),
                             "" if a.ended_at is None else round(a.ended_at, 3), "" if a.value is None else a.value,
                             round(a.cost_usd(now), 6), a.error or ""])
    best = _link_best(results_dir, rows)
    best_row = rows[0] if rows and rows[0].trial.state == TrialState.SUCCEEDED else None
    summary = {**summary, "best": None if best_row is None else {
        "trial": best_row.trial.number, spec.metric: best_row.trial.value, "params": best_row.trial.param_dict(),
        "run_dir": None if best_row.run_dir is None else str(best_row.run_dir)}}
    _atomic(results_dir / "sweep.json", json.dumps(summary, indent=2, default=str) + "\n")
    plots: tuple[Path, ...] = ()
    error = None
    try:
        plots = write_plots(results_dir / "plots", rows, spec, snapshot, now)
    except ImportError as exc:
        error = f"plots skipped: {exc} (pip install matplotlib)"
    return Written(leaderboard, table, plots, best, error)


def _shared_note(rows: Sequence[TrialRow], summary: dict[str, Any]) -> str:
    """Trial costs are their runs' shares of their VMs' billed time: what the sweep spent beyond
    them (boots, idle VMs between trials, billing minimums) is said, so the rows add up."""
    rest = float(summary.get("spent_usd", 0) or 0) - sum(r.cost_usd for r in rows)
    return f" (${rest:.4f} of it outside trials: boots, idle VMs, billing minimums)" if rest >= 0.00005 else ""


def leaderboard_text(rows: Sequence[TrialRow], spec: SweepSpec, summary: dict[str, Any]) -> str:
    ended = summary.get("ended")
    head = (f"sweep {summary.get('id')} ({summary.get('name')}): {summary.get('status')}"
            f"{' - ' + str(ended) if ended and ended != summary.get('status') else ''}\n"
            f"metric {spec.metric} ({'higher' if spec.goal == 'max' else 'lower'} is better); "
            f"spent ${summary.get('spent_usd', 0):.4f} of ${spec.costs.budget_usd:g}"
            f"{_shared_note(rows, summary)}\n\n")
    headers = ["rank", "trial", "state", *spec.params, spec.metric, "duration", "cost", "attempts"]
    cells = [headers]
    for rank, r in enumerate(rows, 1):
        params = r.trial.param_dict()
        cells.append([str(rank) if r.trial.state == TrialState.SUCCEEDED else "-", str(r.trial.number),
                      r.trial.state.value, *(_short(params.get(p)) for p in spec.params),
                      "-" if r.trial.value is None else f"{r.trial.value:.4g}", f"{r.duration_s:.1f}s",
                      f"${r.cost_usd:.4f}", str(len(r.attempts))])
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return head + "\n".join(lines) + "\n"


def write_plots(plots: Path, rows: Sequence[TrialRow], spec: SweepSpec, snapshot: Snapshot,
                now: float) -> tuple[Path, ...]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    done = [r for r in rows if r.trial.state == TrialState.SUCCEEDED and r.trial.value is not None]
    written: list[Path] = []
    for name in spec.params:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r.trial.param_dict().get(name) for r in done]
        ys = [r.trial.value for r in done]
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
            ax.scatter(xs, ys)
            ax.set_xscale(x_scale(xs, name in spec.log_params))
        else:
            labels = sorted({str(x) for x in xs})
            ax.scatter([labels.index(str(x)) for x in xs], ys)
            ax.set_xticks(range(len(labels)), labels)
        for r, x, y in zip(done, xs, ys):
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                ax.annotate(str(r.trial.number), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.set_xlabel(name)
        ax.set_ylabel(spec.metric)
        ax.set_title(f"{spec.metric} vs {name}")
        ax.grid(alpha=0.3)
        written.append(_save(fig, plots / f"metric_vs_{name}.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r.cost_usd for r in done], [r.trial.value for r in done])
    for r in done:
        ax.annotate(str(r.trial.number), (r.cost_usd, r.trial.value), fontsize=7, textcoords="offset points",
                    xytext=(3, 3))
    ax.set_xlabel("trial cost (USD)")
    ax.set_ylabel(spec.metric)
    ax.set_title(f"cost vs {spec.metric}")
    ax.grid(alpha=0.3)
    written.append(_save(fig, plots / "cost_vs_metric.png"))
    written.append(_timeline(plt, plots / "timeline.png", snapshot, now))
    plt.close("all")
    return tuple(written)


_COLOURS = {Outcome.SUCCEEDED: "tab:green", Outcome.FAILED: "tab:red", Outcome.TIMEOUT: "tab:orange",
            Outcome.PRUNED: "tab:purple", Outcome.STOPPED: "tab:gray", Outcome.PREEMPTED: "tab:brown",
            Outcome.LOST: "black", Outcome.NOT_STARTED: "lightgray", Outcome.RUNNING: "tab:blue"}


def x_scale(xs: Sequence[float], log_distributed: bool) -> str:
    """A parameter's axis: log when it is sampled log-uniformly, or when its values spread over two
    orders of magnitude or more (a learning rate from a choice list), where a linear axis piles the
    small ones up under overlapping labels."""
    positive = [x for x in xs if x > 0]
    spread = bool(xs) and len(positive) == len(xs) and max(positive) / min(positive) >= 100
    return "log" if log_distributed or spread else "linear"


def _timeline(plt: Any, path: Path, snapshot: Snapshot, now: float) -> Path:
    vms: list[Vm] = sorted(snapshot.vms, key=lambda v: v.slot)
    start = min([v.launched_at for v in vms] + [a.started_at for a in snapshot.attempts] + [now])
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * max(1, len(vms))))
    for lane, vm in enumerate(vms):
        ready = vm.ready_at if vm.ready_at is not None else (vm.gone_at or now)
        ax.broken_barh([((vm.launched_at - start) / 60, (ready - vm.launched_at) / 60)], (lane - 0.4, 0.8),
                       color="lightsteelblue")
        if vm.release_at is not None:
            ax.broken_barh([((vm.release_at - start) / 60, ((vm.gone_at or now) - vm.release_at) / 60)],
                           (lane - 0.4, 0.8), color="gainsboro")
        for a in snapshot.attempts:
            if a.vm != vm.id:
                continue
            end = a.ended_at if a.ended_at is not None else now
            ax.broken_barh([((a.started_at - start) / 60, (end - a.started_at) / 60)], (lane - 0.4, 0.8),
                           color=_COLOURS.get(a.state, "tab:blue"), edgecolor="white")
            ax.text((a.started_at - start) / 60 + 0.01, lane, f"t{a.trial}", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(vms)), [v.id for v in vms])
    ax.set_xlabel("minutes since the sweep started")
    ax.set_title("trials per VM (blue-grey: boot, grey: release; colour: outcome)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for o, c in _COLOURS.items()
               if any(a.state == o for a in snapshot.attempts)]
    labels = [o.value for o in _COLOURS if any(a.state == o for a in snapshot.attempts)]
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper right")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _link_best(results_dir: Path, rows: Sequence[TrialRow]) -> Path | None:
    link = results_dir / "best"
    if link.is_symlink() or link.exists():
        link.unlink()
    if not rows or rows[0].trial.state != TrialState.SUCCEEDED or rows[0].run_dir is None:
        return None
    link.symlink_to(os.path.relpath(rows[0].run_dir, results_dir), target_is_directory=True)
    return link


def _short(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _atomic_open:
    """A text file written in full or not at all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")

    def __enter__(self) -> Any:
        self.handle = self.tmp.open("w", newline="")
        return self.handle

    def __exit__(self, *exc: object) -> None:
        self.handle.close()
        if exc[0] is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
