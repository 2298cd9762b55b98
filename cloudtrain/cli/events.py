"""`events`: the notification stream (docs/notifications.md), with each target's delivery status."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import click

from cloudtrain.cli import output

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
RETRY_BUDGET_S = 10.0  # `--retry` is asked for: it may wait longer than a command that sends in passing
FOLLOW_POLL_S = 1.0


def parse_since(text: str, now: float | None = None) -> float:
    """`30m`, `2h`, `1d`, `90s` ago, or an ISO date/time (local time unless it says otherwise)."""
    from cloudtrain.errors import UsageError

    now = time.time() if now is None else now
    match = _AGO.match(text.strip())
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(f"--since {text!r}: expected an age such as 30m, 2h or 1d, or a date/time such as "
                         "2026-11-28 or 2026-11-28T09:30", hint="e.g. cloudtrain events --since 2h") from None


def as_document(row: Any) -> dict[str, Any]:
    """One event as `--json` writes it: its envelope as sent, and where it went."""
    document = json.loads(row.body)
    document["deliveries"] = [{"target": d.label, "ref": d.target, "state": d.state, "attempts": d.attempts,
                               "last_error": d.last_error, "delivered_at": d.delivered_at,
                               "next_try_at": d.next_at if d.state == "pending" else None}
                              for d in row.deliveries]
    return document


def _delivery_text(row: Any) -> str:
    if not row.deliveries:
        return "no target wants it"
    parts = []
    for d in row.deliveries:
        state = d.state if d.state != "pending" or not d.attempts else f"pending after {d.attempts} attempt(s)"
        parts.append(f"{d.label}: {state}" + (f" ({d.last_error})" if d.last_error and d.state != "delivered" else ""))
    return "; ".join(parts)


def _line(row: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.at))
    data = json.loads(row.body).get("data", {})
    subject = data.get("run") or data.get("sweep") or data.get("cluster") or "-"
    status = data.get("status")
    node = " (from the node)" if row.source == "node" else ""
    return f"{when}  {row.type:<17} {subject}{f' {status}' if status else ''}{node}  -> {_delivery_text(row)}"


def _states(row: Any) -> tuple[tuple[str, str, int], ...]:
    return tuple((d.target, d.state, d.attempts) for d in row.deliveries)


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events and delivery changes until Ctrl-C.")
@click.option("--since", metavar="WHEN", help="Only events since WHEN: 30m, 2h, 1d ago, or a date/time (2026-11-28T09:30).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: the envelope as sent, plus deliveries.")
@click.option("--retry", is_flag=True, help="Send every undelivered event now (given-up ones too), then list.")
@click.option("--new-secret", is_flag=True, help="Print a new whsec_ signing secret for a webhook target, and exit.")
def events(follow: bool, since: str | None, as_json: bool, retry: bool, new_secret: bool) -> None:
    """What cloudtrain told (or is still telling) your notify: targets: run ends, preemptions,
    budgets, watchdog actions, leaks, sweeps; each with every target's delivery status.

    Listing also sends what is due, so a receiver that was down gets its events here too."""
    from cloudtrain.notify import outbox, send
    from cloudtrain.state import StateStore

    if new_secret:
        from cloudtrain.notify.signing import new_secret as make

        output.echo(make())
        return
    start = parse_since(since) if since else 0.0
    store = StateStore()
    sent = send.flush(store, RETRY_BUDGET_S if retry else send.BUDGET_S, force=retry)
    if retry and not as_json:
        output.info(f"sent {sent.delivered}; {len(sent.failed)} not delivered" + (
            f", {sent.left} left for later" if sent.left else ""))
        for text in sent.failed:
            output.warn(f"not delivered: {text}")
    rows = outbox.events(store, since=start)
    seen = {row.id: _states(row) for row in rows}
    for row in rows:
        _show(row, as_json)
    if not rows and not follow and not as_json:
        output.info("no events" + (f" since {since}" if since else "") +
                    " (docs/notifications.md: add notify: targets to config or a recipe)")
    if not follow:
        return
    try:
        while True:
            time.sleep(FOLLOW_POLL_S)
            send.flush(store, again=True)  # a follower sends what is due, as any command does
            for row in outbox.events(store, since=start):
                if seen.get(row.id) != _states(row):
                    seen[row.id] = _states(row)
                    _show(row, as_json)
    except KeyboardInterrupt:
        raise SystemExit(0) from None


def _show(row: Any, as_json: bool) -> None:
    if as_json:
        output.echo(json.dumps(as_document(row), sort_keys=True))
    else:
        output.echo(_line(row))
