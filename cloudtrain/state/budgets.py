"""Team budgets: a monthly cap on what a member, a project, or both may spend, held at every launch.

A budget covers a (member, project) scope, either side '*' (every member, every project). Each
launch writes a hold in the same write transaction as its intent (the cluster row written before
the create call): the launch's worst case, checked against what is left of every budget that
covers its member and project. Write transactions run one at a time on both engines (SQLite's
BEGIN IMMEDIATE, PostgreSQL's writers' advisory lock: state/pg.py), so the read of what is left
and the write of the hold are one step: racing launches, from any laptop or CI runner, never
over-commit a budget.

What a budget has used this month (UTC) is

    spent: the ledger (billing rows) of the month, of every incarnation in the scope;
    held:  for each live cluster in the scope, what its worst case has not spent yet
           (a hold becomes spend as the ledger observes it);
    left:  monthly_usd - spent - held.

A hold counts while its cluster's row lives and is not terminated: `down`, a launch failure's
cleanup and a settled abandoned intent delete or end the row, and the hold with it. The hold row
itself stays as the incarnation's owner: the month's spend is attributed to the member and
project that launched it (billing rows on PostgreSQL record who *observed* them, which may be a
teammate's `cost`). Spend of incarnations without a hold (launched before budgets existed) is
attributed to the billing rows' member and project on PostgreSQL, and on SQLite (one laptop, a
team of one) to this machine's owner and project 'default'.

Who a member is: on PostgreSQL the database role (the server says, not the config); on SQLite the
config's `owner` (passed in by the caller: the state knows no config).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from cloudtrain.errors import UsageError
from cloudtrain.state import BillingRecord, ClusterStatus, StateStore

EVERY = "*"
# What "still live" means for a hold: its cluster row exists and is not terminated.
_ENDED = str(ClusterStatus.TERMINATED)
_BILLING_FIELDS = [f.name for f in fields(BillingRecord)]


class OverBudget(UsageError):
    """A launch whose worst case does not fit what is left of a budget covering it (nothing was created)."""


@dataclass(frozen=True)
class Budget:
    member: str  # EVERY: every member
    project: str  # EVERY: every project
    monthly_usd: float

    def covers(self, member: str, project: str) -> bool:
        return self.member in (EVERY, member) and self.project in (EVERY, project)

    def describe(self) -> str:
        if self.member == EVERY and self.project == EVERY:
            return "the team's budget"
        if self.project == EVERY:
            return f"{self.member}'s budget"
        if self.member == EVERY:
            return f"project {self.project}'s budget"
        return f"{self.member}'s budget in project {self.project}"


@dataclass(frozen=True)
class BudgetUse:
    budget: Budget
    spent: float
    held: float

    @property
    def left(self) -> float:
        return self.budget.monthly_usd - self.spent - self.held

    def as_json(self) -> dict[str, Any]:
        b = self.budget
        return {"member": None if b.member == EVERY else b.member, "project": None if b.project == EVERY else b.project,
                "monthly_usd": b.monthly_usd, "spent_usd": round(self.spent, 6), "held_usd": round(self.held, 6),
                "left_usd": round(self.left, 6)}


def is_team(store: StateStore) -> bool:
    return isinstance(store.path, str)


def who(store: StateStore, owner: str) -> str:
    """The member this CLI launches as: the database role on PostgreSQL, else `owner` (the config's)."""
    if is_team(store):
        return str(store._db.execute("SELECT current_user").fetchone()[0])
    return owner


def project() -> str:
    from cloudtrain.state.location import project as configured

    return configured()


def month_start(now: float) -> float:
    """The first second of `now`'s month, UTC: budgets are monthly, as the clouds' bills are."""
    day = datetime.fromtimestamp(now, timezone.utc)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def usd(amount: float) -> str:
    """Dollars as `cost` prints them: cents, or more digits where cents would read as $0.00."""
    if amount == 0:
        return "$0"
    return f"${amount:,.2f}" if abs(amount) >= 0.1 else f"${amount:.4f}"


# reading --------------------------------------------------------------------------------------------


def list_budgets(store: StateStore) -> list[Budget]:
    rows = store._db.execute("SELECT member, project, monthly_usd FROM budgets ORDER BY member, project").fetchall()
    return [Budget(r["member"], r["project"], float(r["monthly_usd"])) for r in rows]


def _billing(row: Any) -> BillingRecord:
    return BillingRecord(**{n: row[n] for n in _BILLING_FIELDS})


def attributed_billing(db: Any, team: bool, since: float, fallback: str) -> list[tuple[BillingRecord, str, str]]:
    """Billing rows that may bill from `since` on, each with the member and project it counts for."""
    extra = ", b.member AS b_member, b.project AS b_project" if team else ""
    rows = db.execute(
        f"SELECT b.*, h.member AS h_member, h.project AS h_project{extra} FROM billing b "
        "LEFT JOIN budget_holds h ON h.incarnation = b.incarnation "
        "WHERE b.ended_at IS NULL OR MAX(b.ended_at, b.started_at + b.min_s) > ?", (since,)).fetchall()
    found = []
    for row in rows:
        if row["h_member"] is not None:
            member, proj = row["h_member"], row["h_project"]
        elif team:
            member, proj = row["b_member"], row["b_project"]
        else:
            member, proj = fallback, "default"
        found.append((_billing(row), member, proj))
    return found


def _live_holds(db: Any, now: float, exclude: str | None) -> list[tuple[str, str, float]]:
    """(member, project, unspent worst case) of every live cluster's hold."""
    holds = db.execute("SELECT h.incarnation, h.member, h.project, h.usd FROM budget_holds h "
                       "JOIN clusters c ON c.uid = h.incarnation WHERE c.status != ? AND h.usd IS NOT NULL",
                       (_ENDED,)).fetchall()
    holds = [h for h in holds if h["incarnation"] != exclude]
    if not holds:
        return []
    spent: dict[str, float] = {}
    rows = db.execute("SELECT b.* FROM billing b JOIN budget_holds h ON h.incarnation = b.incarnation "
                      "JOIN clusters c ON c.uid = h.incarnation WHERE c.status != ?", (_ENDED,)).fetchall()
    for row in rows:
        record = _billing(row)
        spent[record.incarnation or ""] = spent.get(record.incarnation or "", 0.0) + record.cost(now)
    return [(h["member"], h["project"], max(0.0, float(h["usd"]) - spent.get(h["incarnation"], 0.0))) for h in holds]


def _uses(db: Any, team: bool, budgets: Iterable[Budget], now: float, fallback: str,
          exclude: str | None = None) -> list[BudgetUse]:
    budgets = list(budgets)
    if not budgets:
        return []
    since = month_start(now)
    spent: dict[tuple[str, str], float] = {}
    for record, member, proj in attributed_billing(db, team, since, fallback):
        spent[(member, proj)] = spent.get((member, proj), 0.0) + record.cost(now, since)
    held = _live_holds(db, now, exclude)
    return [BudgetUse(b, sum(v for (m, p), v in spent.items() if b.covers(m, p)),
                      sum(v for m, p, v in held if b.covers(m, p))) for b in budgets]


def usage(store: StateStore, owner: str, now: float | None = None) -> list[BudgetUse]:
    """Every budget with what it has spent this month, holds and has left."""
    return _uses(store._db, is_team(store), list_budgets(store), now or time.time(), owner)


def covering(store: StateStore, owner: str, now: float | None = None) -> tuple[str, str, list[BudgetUse]]:
    """This CLI's member and project, and the budgets that cover its launches."""
    member, proj = who(store, owner), project()
    budgets = [b for b in list_budgets(store) if b.covers(member, proj)]
    return member, proj, _uses(store._db, is_team(store), budgets, now or time.time(), owner)


# writing ---------------------------------------------------------------------------------------------


def set_budget(store: StateStore, monthly_usd: float, member: str | None, proj: str | None, by: str) -> Budget:
    if monthly_usd < 0:
        raise UsageError(f"--monthly-usd {monthly_usd:g}: a budget is zero or more dollars")
    budget = Budget(member or EVERY, proj or EVERY, float(monthly_usd))
    with _admin(store), store._write() as db:
        db.execute("DELETE FROM budgets WHERE member = ? AND project = ?", (budget.member, budget.project))
        db.execute("INSERT INTO budgets (member, project, monthly_usd, set_at, set_by) VALUES (?, ?, ?, ?, ?)",
                   (budget.member, budget.project, budget.monthly_usd, time.time(), by))
    return budget


def unset_budget(store: StateStore, member: str | None, proj: str | None) -> bool:
    with _admin(store), store._write() as db:
        gone = db.execute("DELETE FROM budgets WHERE member = ? AND project = ?", (member or EVERY, proj or EVERY))
        return bool(gone.rowcount)


class _admin:
    """On PostgreSQL a member may read budgets, not write them (team init's grants): one line, not
    the driver's error."""

    def __init__(self, store: StateStore) -> None:
        self.team = is_team(store)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if self.team and exc is not None and type(exc).__name__ == "InsufficientPrivilege":
            raise UsageError("only the team database's admin may set budgets (a member may read them)",
                             hint="ask the admin who ran `cloudtrain team init`") from None
        return False


def _refusal(use: BudgetUse, worst: float | None, member: str, proj: str) -> OverBudget:
    spent, held, left, monthly = use.spent, use.held, use.left, use.budget.monthly_usd
    numbers = f"{usd(spent)} spent + {usd(held)} held of {usd(monthly)} this month, {usd(max(left, 0.0))} left"
    if worst is None:
        return OverBudget(f"{use.budget.describe()} covers this launch ({member}, project {proj}) and nothing bounds "
                          f"its cost: {numbers}",
                          hint="set budget.max_hours or budget.max_usd in the recipe, so its worst case can be held")
    return OverBudget(f"{use.budget.describe()}: {numbers}; this launch's worst case is {usd(worst)}",
                      hint="`cloudtrain team budget` shows every budget; lower the recipe's budget.max_hours or "
                           "max_usd, `down` a cluster, or ask the admin to raise it")


def _check(uses: list[BudgetUse], worst: float | None, member: str, proj: str) -> None:
    if worst is not None and worst <= 0:
        return  # a free launch (local, ssh) spends nothing, whatever is left
    for use in uses:
        # To a hundredth of a cent: float noise never refuses a budget that covers it exactly.
        if worst is None or round(worst, 4) > round(use.left, 4):
            raise _refusal(use, worst, member, proj)


def check_launch(store: StateStore, *, owner: str, worst_usd: float | None) -> None:
    """Refuse now, before any cloud call, a launch that does not fit; the hold itself is taken with
    the intent (`hold_launch`), where racing launches are decided."""
    member, proj, uses = covering(store, owner)
    _check(uses, worst_usd, member, proj)


def hold_launch(store: StateStore, intent: dict[str, Any], *, owner: str, worst_usd: float | None) -> None:
    """Write the launch intent (the cluster row: StateStore.upsert_cluster_in) and its hold in
    one write transaction, or neither: OverBudget when the worst case does not fit what is left of
    a budget covering this member and project. A failover attempt of the same launch (same row,
    same incarnation) replaces its hold with the new placement's."""
    now = time.time()
    member, proj = who(store, owner), project()
    team = is_team(store)
    with store._write() as db:
        uid = store.upsert_cluster_in(db, **{"updated_at": now, **intent})
        budgets = [b for b in _budgets(db) if b.covers(member, proj)]
        _check(_uses(db, team, budgets, now, owner, exclude=uid), worst_usd, member, proj)
        db.execute("DELETE FROM budget_holds WHERE incarnation = ?", (uid,))
        db.execute("INSERT INTO budget_holds (incarnation, cluster, member, project, usd, at) VALUES (?, ?, ?, ?, ?, ?)",
                   (uid, intent["name"], member, proj, worst_usd, now))


def _budgets(db: Any) -> list[Budget]:
    rows = db.execute("SELECT member, project, monthly_usd FROM budgets ORDER BY member, project").fetchall()
    return [Budget(r["member"], r["project"], float(r["monthly_usd"])) for r in rows]


# the team's views ------------------------------------------------------------------------------------


def incarnation_owners(store: StateStore, owner: str) -> dict[str, tuple[str, str]]:
    """Every billed incarnation's (member, project), as budgets attribute its spend."""
    found: dict[str, tuple[str, str]] = {}
    for record, member, proj in attributed_billing(store._db, is_team(store), 0.0, owner):
        key = record.incarnation or f"legacy-{record.id}"
        found.setdefault(key, (member, proj))
    return found


def cluster_members(store: StateStore) -> dict[str, str]:
    """Each cluster row's member: the database role that wrote it (PostgreSQL), else its owner."""
    column = "member" if is_team(store) else "owner"
    return {r["name"]: r[column] for r in store._db.execute(f"SELECT name, {column} FROM clusters").fetchall()}


def run_members(store: StateStore) -> dict[str, str] | None:
    """Each run's member on PostgreSQL; None on SQLite (every run is this machine's)."""
    if not is_team(store):
        return None
    return {r["id"]: r["member"] for r in store._db.execute("SELECT id, member FROM runs").fetchall()}
