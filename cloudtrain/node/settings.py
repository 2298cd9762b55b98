"""The watchdog's settings as the loop reads them: what it enforces (described for the log), the
lease's deadline on this node's clocks, and when two configs differ. Standard library only.

The budget is a hard limit on running time (`budget.limit_s`, from max_hours and max_usd / the
cluster's hourly price): it fires even while a job runs. The laptop sends the time already used
(`budget.used_s`, from billed intervals) with an `epoch`; the node counts on from there, across
reboots, until a config with another epoch arrives.

The lease (`lease`, a sweep VM's) is a hard deadline: {"until": <unix time by which the delete must
have been called>, "why": "...", "sent_at": <the CLI's clock when it sent this>}. When it passes, the
machine is deleted whether or not a job runs (the action is then always a delete: the CLI asks the
provider for the delete action for a node with a lease). Clocks: `until` is the laptop's wall clock.
`ensure` also notes, on this node, when it wrote the lease (`mono_until`: this node's monotonic clock
plus until - sent_at, and the boot it belongs to), so the lease falls due at the EARLIER of
`until` on this node's wall clock and `mono_until` on its monotonic clock (same boot only). A node
clock that is behind (or jumps back) still fires on time, one that is ahead fires early (safe); the
price of the monotonic rule is the config's transit time (well inside the CLI's safety margin).
"""

from __future__ import annotations

import time

from .jobs import boot_id
from .protocol import LEASE_STAMPS, MARK_EVERY_S, VOLATILE_FIELDS, seconds, tick_of


def describe_settings(cfg: dict) -> str:
    auto, budget, action = cfg.get("autostop"), cfg.get("budget"), cfg.get("action") or {}
    parts = []
    if auto:
        waits = {"jobs_and_ssh": "jobs and ssh sessions", "jobs": "jobs", "none": "nothing"}
        parts.append("autostop after {:g}s idle ({}, waiting for {})".format(
            float(auto["idle_s"]), action.get("effect", "stop"), waits.get(auto.get("wait_for"), auto.get("wait_for"))))
    else:
        parts.append("autostop off")
    if auto and auto.get("gpu_util_below") is not None:
        parts.append("a running job is idle while every GPU stays < {:g}%".format(float(auto["gpu_util_below"])))
    if auto and auto.get("delete_after_stopped_days") is not None:
        parts.append("a stop tags the machine for deletion {:d} days later".format(int(auto["delete_after_stopped_days"])))
    if budget:
        parts.append("budget {:g}s of running time ({})".format(float(budget["limit_s"]), budget.get("why", "")))
    mark = cfg.get("mark") or {}
    if mark.get("kind") == "http-mark":
        parts.append("liveness mark every {:g}s while working".format(seconds(cfg, "mark_every_s", MARK_EVERY_S)))
    elif mark.get("why"):
        parts.append("no liveness mark ({})".format(mark["why"]))
    if cfg.get("lease"):
        parts.append(describe_lease(cfg["lease"]))
    parts.append("action {}".format(action.get("kind", "none")))
    parts.append(f"tick {tick_of(cfg):g}s")
    return ", ".join(parts)


def lease_left(lease: object, now: float, now_m: float) -> float | None:
    """Seconds until the lease falls due (<= 0: due), or None without a valid lease: the earlier of
    its wall-clock time and its monotonic reading on this boot (see the module's docstring)."""
    if not isinstance(lease, dict):
        return None
    try:
        left = float(lease["until"]) - now
    except (KeyError, TypeError, ValueError):
        return None
    mono = lease.get("mono_until")
    if isinstance(mono, (int, float)) and lease.get("boot_id") == boot_id():
        left = min(left, float(mono) - now_m)
    return left


def describe_lease(lease: dict) -> str:
    try:
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(lease["until"])))
    except (KeyError, TypeError, ValueError):
        return "lease invalid"
    return "lease: delete by {} ({})".format(until, lease.get("why", ""))


def stamp_lease(lease: dict) -> dict:
    """The lease with this node's monotonic reading of its deadline (see the module's docstring)."""
    out = dict(lease)
    try:
        remaining = float(lease["until"]) - float(lease.get("sent_at", lease["until"]))
    except (KeyError, TypeError, ValueError):
        return out  # unreadable: the loop says so in its log
    out["mono_until"] = time.monotonic() + remaining
    out["boot_id"] = boot_id()
    return out


def comparable(cfg: object) -> dict | None:
    """What of a config changes what the loop does: not when it was written, the budget's used time
    (the node counts its own), or the lease's stamps (the same lease sent again keeps the first)."""
    if not isinstance(cfg, dict):
        return None
    out = {k: v for k, v in cfg.items() if k not in VOLATILE_FIELDS}
    if isinstance(out.get("budget"), dict):
        out["budget"] = {k: v for k, v in out["budget"].items() if k != "used_s"}
    if isinstance(out.get("lease"), dict):
        out["lease"] = {k: v for k, v in out["lease"].items() if k not in LEASE_STAMPS}
    return out
