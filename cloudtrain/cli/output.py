"""All terminal output in one place: tables, messages, and the live run display.

rich is imported only when something is rendered, so `--help` stays fast. When stdout is not a
terminal (CI, pipes, tests) everything degrades to plain lines without colour or live updates.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click


def is_tty() -> bool:
    return sys.stdout.isatty()


def echo(message: str = "") -> None:
    click.echo(message)


def info(message: str) -> None:
    click.echo(message)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def keep_unshown(run_dir: Path) -> None:
    """What a reader that went away (a closed pipe or terminal) did not see, into RUN_DIR/console.log."""
    from cloudtrain.cli import streams

    try:
        streams.keep_in(run_dir / "console.log")
    except OSError as exc:  # the run's results are home either way; this only loses the copy of the screen
        warn(f"could not keep the unshown output in {run_dir}/console.log: {exc}")


def recipe_warnings(warnings: Sequence[str]) -> None:
    """What loading a recipe noticed (a file `run:` names that will not be on the node)."""
    for warning in warnings:
        warn(warning)


def interrupted_logs(name: str, job: str | None) -> None:
    """Ctrl-C of `logs`: what stopped (the printing, not the job) and how to go on."""
    which = f" {job}" if job else ""
    click.echo(f"\nstopped printing; the job runs on. `cloudtrain logs {name}{which} -f --resume` continues "
               "after the last line printed", err=True)


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, e.g. 2026-11-25T11:44:21Z."""
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def json_record(row: dict[str, Any], decode: Sequence[str] = ()) -> dict[str, Any]:
    """A state row for `--json`: every epoch field `<x>_at` gets `<x>_at_iso` beside it (null when
    the epoch is), and the fields in `decode`, stored as JSON text, become the values they hold."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in decode and isinstance(value, str):
            value = _json_or_text(value)
        out[key] = value
        if key.endswith("_at") and (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))):
            out[f"{key}_iso"] = None if value is None else iso_time(value)
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON after all (a hand-edited row): shown as the text it is


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A table; with only empty headers (a key/value summary) no header row is drawn."""
    show_header = any(str(h) for h in headers)
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, header_style="bold", show_header=show_header)
        for h in headers:
            t.add_column(h)
        for row in rows:
            t.add_row(*("" if c is None else str(c) for c in row))
        Console().print(t)
        return
    # Plain, aligned columns: readable in logs and easy to grep in tests.
    cells = ([[str(h) for h in headers]] if show_header else []) + [
        ["-" if c is None else str(c) for c in row] for row in rows]
    if not cells:
        return
    widths = [max(map(len, column)) for column in zip(*cells)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [title] if title else []
    lines += [line.format(*row).rstrip() for row in cells]
    # One write: a click.echo per line was a fifth of `cost`'s time with 1,000 clusters.
    click.echo("\n".join(lines))


def progress_text(event: dict[str, Any]) -> str | None:
    """The readable line for a progress event, or None for events that only move the progress bar
    (start, step). The bundled job prints the same lines itself (jobs/mnist_cnn.py progress_text;
    tests/test_output.py keeps the two in step)."""
    kind = event.get("type")
    if kind == "epoch":
        parts = [f"epoch {event.get('epoch')}/{event.get('epochs')}"]
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            if isinstance(event.get(key), (int, float)) and not isinstance(event.get(key), bool):
                parts.append(f"{key} {event[key]:.4f}")
        if isinstance(event.get("epoch_time_s"), (int, float)):
            parts.append(f"{event['epoch_time_s']:.1f}s")
        return "  ".join(parts)
    if kind == "done" and isinstance(event.get("test_accuracy"), (int, float)):
        parts = [f"test accuracy {event['test_accuracy']:.4f}"]
        if isinstance(event.get("test_loss"), (int, float)):
            parts.append(f"loss {event['test_loss']:.4f}")
        if isinstance(event.get("images_per_sec"), (int, float)):
            parts.append(f"{event['images_per_sec']:,.0f} images/s (steady state)")
        return "  ".join(parts)
    return None


def render_log_line(line: str) -> str | None:
    """A job log line as the user should read it: progress-protocol lines (older bundled jobs, or any
    job that prints them) become their readable line or nothing; everything else is kept verbatim."""
    from cloudtrain.events import parse_progress

    event = parse_progress(line)
    return line if event is None else progress_text(event)


class RunDisplay:
    """Reporter for `run`/`up`/`exec`: phase lines, job output, and a progress bar for epochs.

    quiet: only what went wrong (failed phases, warnings); the caller prints the summary.
    """

    def __init__(self, show_logs: bool = True, quiet: bool = False) -> None:
        self.tty = is_tty()
        self.quiet = quiet
        self.show_logs = show_logs and not quiet
        self._progress = None
        self._task = None
        self._console = None
        self._steps = 0
        if self.tty:
            from rich.console import Console

            self._console = Console()

    def _print(self, text: str, style: str | None = None) -> None:
        if self._console is not None:
            self._console.print(text, style=style, markup=False, highlight=False)
        else:
            click.echo(text)

    def phase_start(self, phase: str, detail: str = "") -> None:
        if self.quiet and phase != "recover":  # a lost node and its relaunch are news even when quiet
            return
        self._print(f"==> {phase}{': ' + detail if detail else ''}", style="bold cyan")

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        if phase in ("run", "setup"):
            self._stop_progress()
        if self.quiet and ok and phase != "recover":
            return
        mark = "ok" if ok else "FAILED"
        self._print(f"<== {phase} {mark} ({seconds:.1f}s){' ' + detail if detail else ''}",
                    style="green" if ok else "bold red")

    def log_line(self, line: str, node: int = 0) -> None:
        if self.show_logs:
            self._print(line if node == 0 else f"[node {node}] {line}", style="dim")

    def progress(self, event: dict[str, Any]) -> None:
        if self.quiet:
            return
        kind = event.get("type")
        if kind == "start":
            self._steps = int(event.get("steps_per_epoch") or 0)
            total = int(event.get("epochs") or 0) * self._steps
            done = int(event.get("initial_epoch") or 0) * self._steps
            if self.tty and total:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self._progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                          TextColumn("{task.description}"), TimeRemainingColumn(),
                                          console=self._console, transient=True)
                self._progress.start()
                self._task = self._progress.add_task("", total=total, completed=done)
        elif kind == "step" and self._progress is not None:
            completed = (int(event["epoch"]) - 1) * self._steps + int(event["step"])
            self._progress.update(self._task, completed=completed, description=f"loss {event.get('loss', 0):.4f}")
        elif kind == "epoch":
            text = progress_text(event) or ""
            if self._progress is not None:
                self._progress.console.print(text, markup=False, highlight=False)
            else:
                self._print(text)
        elif kind == "done":
            self._stop_progress()
            text = progress_text(event)
            if text:
                self._print(text, style="bold")

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def info(self, message: str) -> None:
        if not self.quiet:
            self._print(message)

    def warn(self, message: str) -> None:
        self._stop_progress()
        click.echo(f"warning: {message}", err=True)


def age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def money(value: float | None) -> str:
    if value is None:
        return "-"
    return "$0" if value == 0 else (f"${value:.2f}" if value >= 0.01 else f"${value:.4f}")
