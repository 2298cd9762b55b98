"""The outbox: notifications kept in the state database until every target has them.

An event is written with its body (exactly the bytes signed and sent, no secret in it) and one
delivery row per target before anything is sent, so a crash, a closed laptop or a receiver that
is down loses nothing: the next command that sends (or `cloudtrain events --retry`) finds the row
due and sends the same id again. A sender claims rows for a while (a lease) so that two commands
at once do not both send; a sender that dies holding one only delays it by the lease.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloudtrain.notify.model import Event
    from cloudtrain.notify.targets import Bound
    from cloudtrain.state import StateStore

LEASE_S = 60.0
GIVE_UP_S = 3 * 24 * 3600.0  # an event undelivered for three days is given up (`events --retry` revives it)


class DeliveryState(str, Enum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # given up: too old, or its target is no longer configured

    def __str__(self) -> str:
        return self.value


def next_wait_s(rounds: int) -> float:
    """How long after a command's failed round the next command may try again: at once for the
    next three commands (a receiver down a moment; a refused connection costs nothing), then
    doubling from 30 s to an hour."""
    return 0.0 if rounds <= 3 else min(30.0 * 2 ** (rounds - 4), 3600.0)


@dataclass(frozen=True)
class Claim:
    event_id: str
    event_type: str
    at: float
    body: str
    target: str
    label: str
    attempts: int
    rounds: int


@dataclass(frozen=True)
class DeliveryRow:
    target: str
    label: str
    state: str
    attempts: int
    next_at: float
    last_error: str | None
    delivered_at: float | None


@dataclass(frozen=True)
class EventRow:
    id: str
    type: str
    at: float
    source: str
    run_id: str | None
    cluster: str | None
    body: str
    deliveries: list[DeliveryRow] = field(default_factory=list)


def enqueue(store: StateStore, event: Event, targets: list[Bound]) -> None:
    """The event and a pending delivery per target, in one transaction. An event that reached this
    machine already (the node's, reconciled twice) is kept once."""
    now = time.time()
    data = event.data
    with store._write() as db:
        db.execute("INSERT INTO notify_events (id, type, at, source, run_id, cluster, body) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                   (event.id, str(event.type), event.at, event.source, data.get("run"), data.get("cluster"),
                    event.body()))
        for bound in targets:
            db.execute("INSERT INTO notify_deliveries (event, target, label, state, next_at) "
                       "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", (event.id, bound.ref.key(), bound.target.label(),
                                                  str(DeliveryState.PENDING), now))


def record_delivered(store: StateStore, event_id: str, target: str, label: str, when: float) -> None:
    """A delivery the sender made itself (the node's watchdog), learned afterwards."""
    with store._write() as db:
        db.execute("INSERT INTO notify_deliveries (event, target, label, state, attempts, rounds, next_at, "
                   "delivered_at) VALUES (?, ?, ?, ?, 1, 1, ?, ?) ON CONFLICT(event, target) DO UPDATE SET "
                   "state = excluded.state, delivered_at = excluded.delivered_at",
                   (event_id, target, label, str(DeliveryState.DELIVERED), when, when))


def claim(store: StateStore, force: bool = False, limit: int = 50,
          skip: frozenset[tuple[str, str]] = frozenset()) -> list[Claim]:
    """Due deliveries, leased to this process. `force`: every undelivered one, given-up ones too.
    `skip`: (event, target) pairs this process tried already (the next command tries them)."""
    now = time.time()
    states = [str(DeliveryState.PENDING)] + ([str(DeliveryState.FAILED)] if force else [])
    marks = ", ".join("?" for _ in states)
    with store._write() as db:
        rows = db.execute(
            f"SELECT d.*, e.type, e.at, e.body FROM notify_deliveries d JOIN notify_events e ON e.id = d.event "
            f"WHERE d.state IN ({marks}) AND (? = 1 OR d.next_at <= ?) ORDER BY e.at, d.event LIMIT ?",
            (*states, force, now, limit + len(skip))).fetchall()
        rows = [r for r in rows if force or (r["event"], r["target"]) not in skip][:limit]
        for row in rows:
            db.execute("UPDATE notify_deliveries SET next_at = ?, state = ? WHERE event = ? AND target = ?",
                       (now + LEASE_S, str(DeliveryState.PENDING), row["event"], row["target"]))
    return [Claim(r["event"], r["type"], r["at"], r["body"], r["target"], r["label"], r["attempts"], r["rounds"])
            for r in rows]


def record(store: StateStore, claim_: Claim, ok: bool, attempts: int, error: str | None,
           gone: bool = False) -> None:
    """One round's result. `gone`: the target is no longer configured (given up at once)."""
    now = time.time()
    rounds = claim_.rounds + 1
    if ok:
        state, next_at = DeliveryState.DELIVERED, now
    elif gone or now - claim_.at > GIVE_UP_S:
        state, next_at = DeliveryState.FAILED, now
    else:
        state, next_at = DeliveryState.PENDING, now + next_wait_s(rounds)
    with store._write() as db:
        db.execute("UPDATE notify_deliveries SET state = ?, attempts = attempts + ?, rounds = ?, next_at = ?, "
                   "last_error = ?, delivered_at = ? WHERE event = ? AND target = ?",
                   (str(state), attempts, rounds, next_at, None if ok else error, now if ok else None,
                    claim_.event_id, claim_.target))


def release(store: StateStore, claim_: Claim) -> None:
    """A claim this process did not get to (its time was up): due again at once."""
    with store._write() as db:
        db.execute("UPDATE notify_deliveries SET next_at = ? WHERE event = ? AND target = ? AND state = ?",
                   (time.time(), claim_.event_id, claim_.target, str(DeliveryState.PENDING)))


def pending_count(store: StateStore) -> int:
    row = store._db.execute("SELECT COUNT(*) FROM notify_deliveries WHERE state = ?",
                            (str(DeliveryState.PENDING),)).fetchone()
    return int(row[0])


def events(store: StateStore, since: float = 0.0, after: str | None = None, limit: int = 200) -> list[EventRow]:
    """Events at or after `since`, oldest first, each with its deliveries; `after`: only those
    stored after that event (what `events -f` has not shown yet)."""
    # rowid: the order events were stored in (SQLite's own; a column of that name on PostgreSQL).
    query = "SELECT rowid AS seq, id, type, at, source, run_id, cluster, body FROM notify_events WHERE at >= ?"
    args: list[object] = [since]
    if after is not None:
        query += " AND rowid > (SELECT rowid FROM notify_events WHERE id = ?)"
        args.append(after)
    rows = store._db.execute(f"SELECT * FROM ({query} ORDER BY seq DESC LIMIT ?) AS newest ORDER BY seq",
                             (*args, limit)).fetchall()
    found = []
    for row in rows:
        deliveries = [DeliveryRow(d["target"], d["label"], d["state"], d["attempts"], d["next_at"], d["last_error"],
                                  d["delivered_at"])
                      for d in store._db.execute("SELECT * FROM notify_deliveries WHERE event = ? ORDER BY label",
                                                 (row["id"],))]
        found.append(EventRow(row["id"], row["type"], row["at"], row["source"], row["run_id"], row["cluster"],
                              row["body"], deliveries))
    return found



def record_node(store: StateStore, event_id: str, event_type: str, at: float, data: dict, body: str, target: str,
                label: str, delivered: bool) -> bool:
    """An event the node's watchdog sent itself (its sent-log, read later): kept once with the
    node's body; delivered, or pending for this machine to send (the same id) where the node could
    not. A delivery already recorded is left as it is. True: the event was new here."""
    with store._write() as db:
        new = db.execute("SELECT 1 FROM notify_events WHERE id = ?", (event_id,)).fetchone() is None
        db.execute("INSERT INTO notify_events (id, type, at, source, run_id, cluster, body) "
                   "VALUES (?, ?, ?, 'node', ?, ?, ?) ON CONFLICT DO NOTHING",
                   (event_id, event_type, at, data.get("run"), data.get("cluster"), body))
        if delivered:
            db.execute("INSERT INTO notify_deliveries (event, target, label, state, attempts, rounds, next_at, "
                       "delivered_at) VALUES (?, ?, ?, ?, 1, 1, ?, ?) ON CONFLICT(event, target) DO UPDATE SET "
                       "state = excluded.state, delivered_at = excluded.delivered_at",
                       (event_id, target, label, str(DeliveryState.DELIVERED), at, at))
        else:
            db.execute("INSERT INTO notify_deliveries (event, target, label, state, next_at) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT DO NOTHING", (event_id, target, label, str(DeliveryState.PENDING), at))
    return new
