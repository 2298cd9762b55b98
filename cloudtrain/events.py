"""What the core tells the user while it works. The CLI renders it; tests can record it."""

from __future__ import annotations

import json
from typing import Any, Protocol


class Reporter(Protocol):
    def phase_start(self, phase: str, detail: str = "") -> None: ...

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None: ...

    def log_line(self, line: str, node: int = 0) -> None: ...

    def progress(self, event: dict[str, Any]) -> None: ...

    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


class NullReporter:
    def phase_start(self, phase: str, detail: str = "") -> None:
        return None

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        return None

    def log_line(self, line: str, node: int = 0) -> None:
        return None

    def progress(self, event: dict[str, Any]) -> None:
        return None

    def info(self, message: str) -> None:
        return None

    def warn(self, message: str) -> None:
        return None


# A progress line is a job's output: data to bound, never to trust (issue 29). Real ones are a few
# hundred bytes; anything longer, nested deeper than json can follow, or with fields the display
# cannot use is shown as the text it is.
MAX_PROGRESS_LINE = 64 * 1024
_MAX_COUNT = 10**12  # epochs, steps: beyond any real job, small enough for the progress bar's sums
# type -> {field: required?}; these fields must be whole numbers in 0.._MAX_COUNT when present.
_COUNTS = {
    "start": {"epochs": False, "steps_per_epoch": False, "initial_epoch": False},
    "step": {"epoch": True, "step": True},
}


def parse_progress(line: str) -> dict[str, Any] | None:
    """A bundled job's progress line: one JSON object with "cloudtrain": "progress", else None (text)."""
    text = line.strip()
    if len(text) > MAX_PROGRESS_LINE or not (text.startswith("{") and '"cloudtrain"' in text):
        return None
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth limit
        return None
    if not (isinstance(event, dict) and event.get("cloudtrain") == "progress"):
        return None
    return event if _usable(event) else None


def _usable(event: dict[str, Any]) -> bool:
    for name, required in _COUNTS.get(event.get("type"), {}).items():
        value = event.get(name)
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
            return False
    loss = event.get("loss")
    return loss is None or (isinstance(loss, (int, float)) and not isinstance(loss, bool))  # nan is a real loss
