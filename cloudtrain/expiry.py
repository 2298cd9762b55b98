"""Stopped, then deleted (`autostop.delete_after_stopped_days`, issue 39.3): the tags that say when a
stopped machine may go, the rule that reads them, and the clock `gc --expired` judges by.

A stopped machine runs nothing, so nothing on it can delete it later: `cloudtrain gc --expired`
(from a laptop, a cron line or a CI schedule) does, from what the cloud itself shows, so that it
holds with this machine's state lost. Two tags (labels), both digits only, which every cloud
takes as a value (Compute Engine labels allow only lowercase letters, digits, `-` and `_`):

  TAG_STOPPED_DAYS  whole days a stopped machine is kept. Set in the launch request (laptop side,
                    launch_tags), so that it is there on every cloud, including machines that have
                    no identity of their own to tag themselves with (no instance role on the first
                    cloud, stop-only VMs without a service account on the second).
  TAG_DELETE_AFTER  whole epoch seconds after which it may be deleted. Written by the node's
                    watchdog just before it stops the machine, where the machine's identity may
                    set its own tags (the liveness mark's call, MarksItself); it also writes
                    TAG_STOPPED_DAYS then, so that gc can tell a mark left by an older stop.

The rule (due_at): a machine is due at the LATER of TAG_DELETE_AFTER and (the cloud's own time of
its stop + TAG_STOPPED_DAYS days). The cloud's stop time (ClusterResource.state_since: the state
transition time of the first cloud, lastStopTimestamp of the second, the power-state time of the
third) covers a stop nobody tagged (an OS shutdown from a node that cannot tag, `cloudtrain stop`)
and makes a TAG_DELETE_AFTER left by an earlier stop harmless (the machine was started and stopped
again since: its newer stop time wins). Taking the later of the two never deletes early. A machine
with days but neither a stop time nor a TAG_DELETE_AFTER is never due: when it stopped is unknown.

Time comes from `now()`: the wall clock, or CLOUDTRAIN_NOW (epoch seconds), the test kit's way to
move the clock a week ahead without waiting one (like CLOUDTRAIN_WATCHDOG_TICK_S for the watchdog).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cloudtrain.errors import UsageError

# The tags' names, and what a stop and a launch write, are the node protocol's: the node's watchdog
# writes them (cloudtrain/node/actions.py tag_expiry), this module reads them back.
from cloudtrain.node.protocol import TAG_DELETE_AFTER as TAG_DELETE_AFTER
from cloudtrain.node.protocol import TAG_STOPPED_DAYS as TAG_STOPPED_DAYS
from cloudtrain.node.protocol import launch_tags as launch_tags

DAY_S = 86400.0
ENV_NOW = "CLOUDTRAIN_NOW"  # test-only: the clock `gc --expired` judges by, in epoch seconds


def now() -> float:
    """The time `gc --expired` judges by: CLOUDTRAIN_NOW where set (tests), else the wall clock."""
    raw = os.environ.get(ENV_NOW)
    if not raw:
        return time.time()
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{ENV_NOW}={raw!r} is not a time in epoch seconds") from None


def _digits(value: object) -> float | None:
    # Only digits: what cloudtrain writes. Anything else was written by someone else and is ignored
    # (never deleted on a value nobody here could have meant).
    return float(value) if isinstance(value, str) and value.isdigit() else None


@dataclass(frozen=True)
class Expiry:
    """What a machine's tags say about deleting it once stopped."""

    delete_after: float | None = None  # TAG_DELETE_AFTER
    stopped_days: float | None = None  # TAG_STOPPED_DAYS

    @property
    def armed(self) -> bool:
        return self.delete_after is not None or self.stopped_days is not None


def expiry_of(tags: Mapping[str, str]) -> Expiry:
    """The tags' Expiry (providers read it into Instance.expiry when they list machines)."""
    return Expiry(_digits(tags.get(TAG_DELETE_AFTER)), _digits(tags.get(TAG_STOPPED_DAYS)))


def due_at(expiry: Expiry, stopped_since: float | None) -> tuple[float | None, str]:
    """When a stopped machine may be deleted, and from what (for the listing); (None, why) when never."""
    if not expiry.armed:
        return None, "no delete_after_stopped_days"
    found: list[tuple[float, str]] = []
    if expiry.delete_after is not None:
        found.append((expiry.delete_after, "its watchdog's mark"))
    if expiry.stopped_days is not None and stopped_since is not None:
        found.append((stopped_since + expiry.stopped_days * DAY_S,
                      f"stopped {when(stopped_since)} + {expiry.stopped_days:g} days"))
    if not found:
        return None, "the cloud reports no stop time and no watchdog marked it: when it stopped is unknown"
    return max(found)


@dataclass(frozen=True)
class Verdict:
    """gc --expired's decision on one machine."""

    delete: bool
    due: float | None
    why: str


def verdict(state_stopped: bool, expiry: Expiry, stopped_since: float | None, live: bool, at: float) -> Verdict:
    """Whether a machine may be deleted now: stopped, due, and nobody's live work (`live`: a fresh
    liveness mark or a command of this state holding its cluster). The table test pins the rules."""
    due, why = due_at(expiry, stopped_since)
    if not state_stopped:
        return Verdict(False, due, "not stopped")
    if due is None:
        return Verdict(False, None, why)
    if at < due:
        return Verdict(False, due, f"due {when(due)} ({why})")
    if live:
        return Verdict(False, due, f"due since {when(due)}, but live work holds it")
    return Verdict(True, due, f"due since {when(due)} ({why})")


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def stopped_disk_cost_line(hourly_disks: float, due: float | None, at: float) -> str:
    """`cost`'s line for a stopped cluster: what its disks cost per day, and until when."""
    per_day = hourly_disks * 24.0
    money = f"${per_day:.2f}" if per_day >= 1 else f"${per_day:.4f}"
    if due is None:
        return f"stopped: its disks cost about {money}/day, kept until `cloudtrain down`"
    left = max(0.0, due - at) / DAY_S
    return (f"stopped: its disks cost about {money}/day; `cloudtrain gc --expired --yes` deletes it from "
            f"{when(due)} ({left:.1f} days, about ${per_day * left:.2f} more)")
