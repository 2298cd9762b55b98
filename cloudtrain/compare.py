"""Side-by-side comparison of finished training runs (the core of `cloudtrain compare`).

A run directory holds the job's metrics.json and environment.json, either at its top level or in a
subdirectory (for example `outputs/` after results were collected), and optionally a top-level
run.json written by cloudtrain with `hourly_price_usd` (the price of everything the run used) and
`cost_usd`. Nothing here prints or exits; errors are CompareError (a ValueError) with the path.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from cloudtrain.errors import UsageError

# Scratch output of non-chief workers and the job's own subtrees never hold the run's result.
_SKIP_PARTS = ("checkpoints", "tensorboard")
REQUIRED = ("images_per_sec", "sec_per_batch", "test_accuracy")


class CompareError(UsageError):
    """A run directory is missing, unreadable or not a finished training run (exit code 2)."""


@dataclass(frozen=True)
class RunSummary:
    name: str
    path: Path
    metrics_path: Path
    device: str
    gpu_names: tuple[str, ...]
    strategy: str
    replicas: int
    global_batch_size: int | None
    sec_per_batch: float | None
    images_per_sec: float | None
    test_accuracy: float | None
    wall_time_s: float | None
    train_time_s: float | None
    epochs: int | None
    epoch_times_s: tuple[float, ...]
    data_source: str | None
    hostname: str | None
    tensorflow: str | None
    hourly_price_usd: float | None
    cost_usd: float | None

    @property
    def mean_epoch_time_s(self) -> float | None:
        return sum(self.epoch_times_s) / len(self.epoch_times_s) if self.epoch_times_s else None


@dataclass(frozen=True)
class CompareRow:
    run: str
    device: str  # "GPU" or "CPU"
    gpu_model: str | None
    strategy: str
    replicas: int
    global_batch_size: int | None  # images per step, all replicas together
    sec_per_batch: float | None
    images_per_sec: float | None
    speedup: float | None  # images/s relative to the first run
    test_accuracy: float | None
    wall_time_s: float | None
    cost_per_epoch_usd: float | None
    cost_usd: float | None
    epochs: int | None = None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CompareError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise CompareError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def find_metrics(run_dir: Path) -> Path:
    """The run's metrics.json: at the top, else the one shallowest file below (workers' and the
    job's scratch subtrees skipped). Raises CompareError when there is none or it is ambiguous."""
    top = run_dir / "metrics.json"
    if top.is_file():
        return top
    found = [p for p in run_dir.rglob("metrics.json")
             if not any(part.startswith("worker-") or part in _SKIP_PARTS for part in p.relative_to(run_dir).parts)]
    if not found:
        raise CompareError(f"{run_dir}: no metrics.json in it or its subdirectories "
                           "(is the run finished and collected?)")
    depth = min(len(p.parts) for p in found)
    shallowest = sorted(p for p in found if len(p.parts) == depth)
    if len(shallowest) > 1:
        listed = ", ".join(str(p.relative_to(run_dir)) for p in shallowest)
        raise CompareError(f"{run_dir}: several metrics.json files ({listed}); pass the one directory you mean")
    return shallowest[0]


def _number(source: Path, data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CompareError(f"{source}: field {key!r} should be a number, got {value!r}")
    return float(value)


def load_run(run_dir: Path | str, name: str | None = None) -> RunSummary:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise CompareError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise CompareError(f"{run_dir}: not a directory")
    metrics_path = find_metrics(run_dir)
    m = read_json(metrics_path)
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise CompareError(f"{metrics_path}: missing {', '.join(missing)} (not written by the cloudtrain job?)")
    env_path = metrics_path.with_name("environment.json")
    env = read_json(env_path) if env_path.exists() else {}
    price_path = run_dir / "run.json"
    price = read_json(price_path) if price_path.exists() else {}
    gpu_names = m.get("gpu_names") or []
    if not isinstance(gpu_names, list):
        raise CompareError(f"{metrics_path}: field 'gpu_names' should be a list")
    epoch_times = m.get("epoch_times_s") or []
    if not isinstance(epoch_times, list):
        raise CompareError(f"{metrics_path}: field 'epoch_times_s' should be a list")
    times = tuple(_number(metrics_path, {"epoch_times_s": t}, "epoch_times_s") or 0.0 for t in epoch_times)
    replicas, epochs, gbs = (_number(metrics_path, m, k) for k in ("replicas", "epochs", "global_batch_size"))
    return RunSummary(
        name=name or run_dir.resolve().name, path=run_dir, metrics_path=metrics_path,
        device=str(m.get("device") or ("GPU" if gpu_names else "CPU")), gpu_names=tuple(map(str, gpu_names)),
        strategy=str(m.get("strategy") or "default"), replicas=int(replicas or 1),
        global_batch_size=int(gbs) if gbs is not None else None,
        sec_per_batch=_number(metrics_path, m, "sec_per_batch"),
        images_per_sec=_number(metrics_path, m, "images_per_sec"),
        test_accuracy=_number(metrics_path, m, "test_accuracy"), wall_time_s=_number(metrics_path, m, "wall_time_s"),
        train_time_s=_number(metrics_path, m, "train_time_s"), epochs=int(epochs) if epochs is not None else None,
        epoch_times_s=times, data_source=m.get("data_source"), hostname=env.get("hostname"),
        tensorflow=env.get("tensorflow") or m.get("tensorflow"),
        hourly_price_usd=_number(price_path, price, "hourly_price_usd"),
        cost_usd=_number(price_path, price, "cost_usd"),
    )


def load_runs(dirs: Sequence[Path | str]) -> list[RunSummary]:
    if not dirs:
        raise CompareError("no run directories given")
    names = [Path(d).resolve().name for d in dirs]
    # Two runs from different parents may share a directory name; the given path tells them apart.
    return [load_run(d, name=str(d) if names.count(n) > 1 else n) for d, n in zip(dirs, names)]


def _gpu_model(names: tuple[str, ...]) -> str | None:
    if not names:
        return None
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items())


def compare_table(runs: Sequence[RunSummary]) -> list[CompareRow]:
    base = runs[0].images_per_sec if runs else None
    rows = []
    for r in runs:
        per_epoch = (r.hourly_price_usd * r.mean_epoch_time_s / 3600
                     if r.hourly_price_usd is not None and r.mean_epoch_time_s is not None else None)
        rows.append(CompareRow(
            run=r.name, device="GPU" if r.gpu_names else "CPU", gpu_model=_gpu_model(r.gpu_names),
            strategy=r.strategy, replicas=r.replicas, global_batch_size=r.global_batch_size,
            sec_per_batch=r.sec_per_batch, images_per_sec=r.images_per_sec,
            speedup=r.images_per_sec / base if base and r.images_per_sec is not None else None,
            test_accuracy=r.test_accuracy, wall_time_s=r.wall_time_s, cost_per_epoch_usd=per_epoch,
            cost_usd=r.cost_usd, epochs=r.epochs))
    return rows


HEADERS = ("run", "device", "GPU", "strategy", "replicas", "batch", "sec/batch", "images/s", "speed-up",
           "test acc", "wall s", "cost/epoch")


def _fmt(value: float | None, spec: str, prefix: str = "", suffix: str = "") -> str:
    return "-" if value is None else f"{prefix}{value:{spec}}{suffix}"


def usd(value: float) -> str:
    """A small dollar amount with two significant digits: $0.00026, $0.012, $1.3."""
    if value == 0:
        return "$0"
    decimals = max(2, 1 - math.floor(math.log10(abs(value))))
    return f"${value:.{decimals}f}"


def _money(value: float | None) -> str:
    return "-" if value is None else usd(value)


def format_rows(rows: Sequence[CompareRow]) -> tuple[list[str], list[list[str]]]:
    cells = [[r.run, r.device, r.gpu_model or "-", r.strategy, str(r.replicas),
              "-" if r.global_batch_size is None else str(r.global_batch_size), _fmt(r.sec_per_batch, ".4f"),
              _fmt(r.images_per_sec, ",.0f"), _fmt(r.speedup, ".2f", suffix="x"), _fmt(r.test_accuracy, ".4f"),
              _fmt(r.wall_time_s, ".1f"), _money(r.cost_per_epoch_usd)] for r in rows]
    return list(HEADERS), cells


def _differs(rows: Sequence[CompareRow], field: str, what: str, consequence: str) -> str | None:
    """A sentence naming each run's `field` when the runs disagree on it, else None."""
    values = [(r.run, getattr(r, field)) for r in rows if getattr(r, field) is not None]
    if len({value for _, value in values}) < 2:
        return None
    return f"{what} differ ({', '.join(f'{run} {value}' for run, value in values)}): {consequence}"


def batch_size_warning(rows: Sequence[CompareRow]) -> str | None:
    """Different global batch sizes: images/s and accuracy are then not like for like."""
    return _differs(rows, "global_batch_size", "batch sizes", "images/s and accuracy are not like for like; "
                    "set the same job.params.batch_size x replicas to compare devices")


def epochs_warning(rows: Sequence[CompareRow]) -> str | None:
    """Different numbers of epochs: accuracy and whole-run time and cost are then not like for like."""
    return _differs(rows, "epochs", "epochs", "accuracy and whole-run time and cost are not like for like; "
                    "per-epoch numbers (sec/batch, images/s, cost per epoch) still compare")


def default_png_path(run_dirs: Sequence[Path | str]) -> Path:
    """Where the chart goes without --output: beside the runs, in the directory that holds the
    first one (the runs/ folder), never a far common ancestor of runs from two places ($HOME, /)."""
    first = Path(run_dirs[0])
    return (first.resolve().parent if first.exists() else first.absolute().parent) / "compare.png"


# One colour per device: CPU runs grey, each GPU model its own colour (colour-blind friendly set).
_CPU_COLOUR = "#8C8C8C"
_GPU_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442")


def device_label(row: CompareRow) -> str:
    return row.gpu_model or row.device


def device_colours(rows: Sequence[CompareRow]) -> list[str]:
    gpus = list(dict.fromkeys(device_label(r) for r in rows if r.device == "GPU"))
    return [_GPU_COLOURS[gpus.index(device_label(r)) % len(_GPU_COLOURS)] if r.device == "GPU" else _CPU_COLOUR
            for r in rows]


def value_axis(values: Sequence[float | None]) -> tuple[float, float] | None:
    """Fixed y limits for a panel whose bars are all zero or missing (no scale to show), else None."""
    return (0.0, 1.0) if all(not v for v in values) else None


def render_png(rows: Sequence[CompareRow], path: Path | str) -> Path:
    """Three panels, one bar per run coloured by device: training images/s (with speed-up), test
    accuracy, cost per epoch. Bars are numbered (the runs' names are listed under the panels) and
    carry their device and batch size; the title warns when batch sizes differ. The Agg canvas is
    used directly so no GUI backend or pyplot global state is touched (matplotlib is imported here:
    `cloudtrain --help` must not pay for it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    if not rows:
        raise CompareError("nothing to plot: no runs")
    path = Path(path)
    n = len(rows)
    fig = Figure(figsize=(max(9.0, 3 * (0.8 * n + 1.2)), 4.4 + 0.17 * n), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    colours = device_colours(rows)
    import textwrap

    labels = [f"{i}\n{textwrap.fill(device_label(r), 16)}\nbatch {r.global_batch_size or '?'}"
              for i, r in enumerate(rows, 1)]
    panels = (
        ("training images/s (steady state)", [r.images_per_sec for r in rows],
         lambda r: f"{r.images_per_sec:,.0f}" + (f"\n{r.speedup:.2f}x" if r.speedup is not None else ""),
         lambda v, _: f"{v:,.0f}"),
        ("test accuracy", [r.test_accuracy for r in rows], lambda r: f"{r.test_accuracy:.4f}",
         lambda v, _: f"{v:.2f}"),
        ("cost per epoch", [r.cost_per_epoch_usd for r in rows],
         lambda r: "free" if r.cost_per_epoch_usd == 0 else usd(r.cost_per_epoch_usd),
         lambda v, _: usd(v)),
    )
    for ax, (title, values, note, ticks) in zip(axes, panels):
        bars = ax.bar(range(n), [v or 0.0 for v in values], color=colours)
        for bar, r, v in zip(bars, rows, values):
            ax.annotate("n/a" if v is None else note(r), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(n), labels, fontsize=7)
        ax.yaxis.set_major_formatter(FuncFormatter(ticks))
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.25)
        flat = value_axis(values)
        if flat is not None:
            # Bars of nothing (free runs): autoscaling would centre the axis on 0 and print $-0.060.
            ax.set_ylim(*flat)
            ax.set_yticks([])
        else:
            ax.set_ylim(bottom=0)  # images/s and dollars are never negative
        ax.spines[["top", "right"]].set_visible(False)
    accuracies = [r.test_accuracy for r in rows if r.test_accuracy is not None]
    if accuracies:
        low = min(accuracies)
        axes[1].set_ylim(max(0.0, low - (1 - low) * 2 - 0.02), 1.0)
    if all(r.cost_per_epoch_usd is None for r in rows):
        axes[2].text(0.5, 0.5, "no prices\n(runs without run.json)", ha="center", va="center",
                     transform=axes[2].transAxes, fontsize=9, color="#555555")
    legend = {device_label(r): c for r, c in zip(rows, colours)}
    fig.legend([Patch(color=c) for c in legend.values()], list(legend), loc="outside upper right", fontsize=8,
               title="device", title_fontsize=8, ncols=min(len(legend), 4))
    sizes = list(dict.fromkeys(r.global_batch_size for r in rows if r.global_batch_size is not None))
    title = "cloudtrain compare"
    if batch_size_warning(rows):
        title += f"\nbatch sizes differ ({', '.join(map(str, sizes))}): not like for like"
    fig.suptitle(title, fontsize=11, color="#B00020" if len(sizes) > 1 else "black", x=0.01, ha="left")
    fig.supxlabel("\n".join(f"{i}  {r.run}" for i, r in enumerate(rows, 1)), fontsize=8, x=0.01, ha="left",
                  family="monospace")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
