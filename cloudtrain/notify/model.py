"""What a notification is: its type, its envelope (the JSON every webhook receives) and its one
readable line (what a human channel shows). Plain data, no I/O."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

# Receivers branch on this: a field added keeps the version, a field renamed or removed bumps it.
ENVELOPE_VERSION = 1


class EventType(str, Enum):
    RUN_STARTED = "run.started"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_PREEMPTED = "run.preempted"
    RUN_RECOVERED = "run.recovered"
    BUDGET_WARNING = "budget.warning"
    BUDGET_EXHAUSTED = "budget.exhausted"
    WATCHDOG_STOPPED = "watchdog.stopped"
    WATCHDOG_DELETED = "watchdog.deleted"
    DEADLINE_REACHED = "deadline.reached"
    GC_LEAKS = "gc.leaks"
    SWEEP_FINISHED = "sweep.finished"

    def __str__(self) -> str:
        return self.value


# What a target gets when its `on:` is not given: the run's end (a start is no news), failures,
# preemption, budget and watchdog actions, leaks, a sweep's end.
DEFAULT_ON: frozenset[EventType] = frozenset(EventType) - {EventType.RUN_STARTED}

# A run's or sweep's spend past this share of its budget is a budget.warning.
BUDGET_WARNING_SHARE = 0.8


def preemption_event_id(cluster: str, incarnation: str) -> str:
    """One id for the preemption of one incarnation of a cluster, whoever tells it: each node's
    watchdog on the cloud's notice (templates/watchdog.py `preemption_event_id`, the same rule) and
    this machine when it sees the node gone. A receiver that keeps one event per webhook-id (as
    Standard Webhooks asks) hears of it once, from whichever came first."""
    digest = hashlib.sha256(f"run.preempted:{cluster}:{incarnation}".encode()).hexdigest()
    return "msg_" + digest[:24]


@dataclass(frozen=True)
class Event:
    """One event, as sent: the same id and body on every delivery attempt to every target."""

    type: EventType
    data: dict[str, Any]
    id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(12))
    at: float = field(default_factory=time.time)
    source: str = "laptop"  # or "node": sent by a VM's watchdog itself

    def envelope(self) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(self.at, tz=timezone.utc).isoformat(timespec="milliseconds")
        return {"version": ENVELOPE_VERSION, "type": str(self.type), "id": self.id,
                "timestamp": stamp.replace("+00:00", "Z"), "source": self.source, "data": self.data}

    def body(self) -> str:
        # Compact and key-sorted: the exact bytes are what is signed, stored and sent again.
        return json.dumps(self.envelope(), sort_keys=True, separators=(",", ":"))


def line(event_type: str, data: dict[str, Any]) -> str:
    """The one short line a person reads in Slack or an e-mail subject."""
    what = data.get("run") or data.get("sweep") or data.get("cluster") or ""
    where = " ".join(str(p) for p in (data.get("cluster") if data.get("run") else None, data.get("cloud")) if p)
    parts = [f"cloudtrain {event_type}", str(what)]
    if where:
        parts.append(f"on {where}")
    text = " ".join(p for p in parts if p)
    extra = []
    if data.get("exit_code") not in (None, 0):
        extra.append(f"exit {data['exit_code']}")
    if isinstance(data.get("cost_usd"), (int, float)):
        extra.append(f"${data['cost_usd']:.2f}")
    if isinstance(data.get("hourly_usd"), (int, float)):
        extra.append(f"${data['hourly_usd']:.2f}/h")
    if data.get("attempt"):
        extra.append(f"attempt {data['attempt']}")
    if extra:
        text += f" ({', '.join(extra)})"
    if data.get("reason"):
        text += f": {data['reason']}"
    return text[:500]


def run_end_type(status: str) -> EventType:
    """The event of a run's final status (state.RunStatus values)."""
    if status == "succeeded":
        return EventType.RUN_SUCCEEDED
    if status in ("cancelled", "interrupted"):
        return EventType.RUN_CANCELLED
    return EventType.RUN_FAILED


def budget_type(spent: float, limit: float | None, exhausted: bool = False) -> EventType | None:
    """budget.exhausted, budget.warning or nothing, for `spent` of a `limit` (None: no money limit)."""
    if exhausted or (limit and spent >= limit):
        return EventType.BUDGET_EXHAUSTED
    if limit and spent >= BUDGET_WARNING_SHARE * limit:
        return EventType.BUDGET_WARNING
    return None
