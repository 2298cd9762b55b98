"""All terminal output in one place: tables, messages, and the live run display.

rich is imported only when something is rendered, so `--help` stays fast. When stdout is not a
terminal (CI, pipes, tests) everything degrades to plain lines without colour or live updates.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
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


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, header_style="bold")
        for h in headers:
            t.add_column(h)
        for row in rows:
            t.add_row(*("" if c is None else str(c) for c in row))
        Console().print(t)
        return
    # Plain, aligned columns: readable in logs and easy to grep in tests.
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if title:
        click.echo(title)
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


class RunDisplay:
    """Reporter for `run`/`up`/`exec`: phase lines, job output, and a progress bar for epochs."""

    def __init__(self, show_logs: bool = True) -> None:
        self.tty = is_tty()
        self.show_logs = show_logs
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
        self._print(f"==> {phase}{': ' + detail if detail else ''}", style="bold cyan")

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        mark = "ok" if ok else "FAILED"
        self._print(f"<== {phase} {mark} ({seconds:.1f}s){' ' + detail if detail else ''}",
                    style="green" if ok else "bold red")
        if phase in ("run", "setup"):
            self._stop_progress()

    def log_line(self, line: str, node: int = 0) -> None:
        if self.show_logs:
            self._print(line if node == 0 else f"[node {node}] {line}", style="dim")

    def progress(self, event: dict[str, Any]) -> None:
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
            parts = [f"epoch {event.get('epoch')}/{event.get('epochs')}"]
            for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
                if isinstance(event.get(key), (int, float)):
                    parts.append(f"{key} {event[key]:.4f}")
            if isinstance(event.get("epoch_time_s"), (int, float)):
                parts.append(f"{event['epoch_time_s']:.1f}s")
            if self._progress is not None:
                self._progress.console.print("  ".join(parts), markup=False, highlight=False)
            else:
                self._print("  ".join(parts))
        elif kind == "done":
            self._stop_progress()
            acc = event.get("test_accuracy")
            if isinstance(acc, (int, float)):
                self._print(f"test accuracy {acc:.4f}", style="bold")

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def info(self, message: str) -> None:
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
