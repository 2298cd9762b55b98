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


def parse_progress(line: str) -> dict[str, Any] | None:
    """A bundled job's progress line: one JSON object with "cloudtrain": "progress"."""
    text = line.strip()
    if not (text.startswith("{") and '"cloudtrain"' in text):
        return None
    try:
        event = json.loads(text)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and event.get("cloudtrain") == "progress" else None
