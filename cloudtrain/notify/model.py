"""What a notification is: its type, its envelope (the JSON every webhook receives) and its one
readable line (what a human channel shows). Plain data, no I/O."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

# ENVELOPE_VERSION: receivers branch on it (a field added keeps it, a field renamed or removed bumps
# it). It, the node's event names, the budget's warning share and a preemption's id are the node
# protocol's: the node's watchdog builds the same envelopes (cloudtrain/node/tell.py).
from cloudtrain.node.protocol import BUDGET_WARNING_SHARE as BUDGET_WARNING_SHARE
from cloudtrain.node.protocol import ENVELOPE_VERSION as ENVELOPE_VERSION
from cloudtrain.node.protocol import (
    EVENT_BUDGET_WARNING,
    EVENT_DEADLINE,
    EVENT_DELETED,
    EVENT_PREEMPTED,
    EVENT_STOPPED,
)
from cloudtrain.node.protocol import preemption_event_id as preemption_event_id


class EventType(str, Enum):
    RUN_STARTED = "run.started"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_PREEMPTED = EVENT_PREEMPTED
    RUN_RECOVERED = "run.recovered"
    BUDGET_WARNING = EVENT_BUDGET_WARNING
    BUDGET_EXHAUSTED = "budget.exhausted"
    WATCHDOG_STOPPED = EVENT_STOPPED
    WATCHDOG_DELETED = EVENT_DELETED
    DEADLINE_REACHED = EVENT_DEADLINE
    GC_LEAKS = "gc.leaks"
    SWEEP_FINISHED = "sweep.finished"

    def __str__(self) -> str:
        return self.value


# What a target gets when its `on:` is not given: the run's end (a start is no news), failures,
# preemption, budget and watchdog actions, leaks, a sweep's end.
DEFAULT_ON: frozenset[EventType] = frozenset(EventType) - {EventType.RUN_STARTED}

# A run's or sweep's spend past BUDGET_WARNING_SHARE of its budget is a budget.warning. A preemption
# has one id whoever tells it (preemption_event_id): each node's watchdog on the cloud's notice and
# this machine when it sees the node gone, so a receiver that dedupes by webhook-id hears it once.


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
