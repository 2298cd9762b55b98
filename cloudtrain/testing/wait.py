"""Waiting in tests for a condition, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 120, what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy (returns it); fail with `what` after `timeout` seconds (a
    bound on a hung test, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
