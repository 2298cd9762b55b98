"""Team policies: the floors (`max_idle_minutes`, `max_hours`) a team database holds for its members,
which no recipe and no `cloudtrain autostop` lifts (cloudtrain/policy.py applies them).

One row per scope: a project (the config's `project:`), or every project (`project` NULL). The
admin sets them (`cloudtrain team policy set`); a member may read them, not write them (`team
init`'s grants give `cloudtrain_member` only SELECT on `policies`), so a member's refusal is the
database's, said in one line. What covers a member is the every-project row and their project's
row; per key the lower value holds (a project's floor can only tighten the team's).

On this machine's own state (SQLite) the floor is the config's `policy:`: the table exists there
for schema parity and is never read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from cloudtrain.errors import UsageError
from cloudtrain.state import StateStore
from cloudtrain.state.budgets import is_team

KEYS = ("max_idle_minutes", "max_hours")
_COLUMNS = "project, max_idle_minutes, max_hours, set_at, set_by"


@dataclass(frozen=True)
class TeamPolicy:
    project: str | None  # None: every project
    max_idle_minutes: int | None
    max_hours: float | None
    set_at: float
    set_by: str

    @property
    def source(self) -> str:
        """Where a value of this row comes from, as a refusal names it."""
        return "team" if self.project is None else f"team, project {self.project}"

    def describe(self) -> str:
        return "the team's policy" if self.project is None else f"project {self.project}'s policy"

    def floors(self) -> str:
        """`max_idle_minutes 60, max_hours 24`: the keys this row sets."""
        return ", ".join(f"{k} {getattr(self, k):g}" for k in KEYS if getattr(self, k) is not None)

    @property
    def set_at_iso(self) -> str:
        return datetime.fromtimestamp(self.set_at, timezone.utc).isoformat(timespec="seconds")

    def as_json(self) -> dict[str, Any]:
        return {"project": self.project, "max_idle_minutes": self.max_idle_minutes, "max_hours": self.max_hours,
                "set_by": self.set_by, "set_at": self.set_at, "set_at_iso": self.set_at_iso}


def _policy(row: Any) -> TeamPolicy:
    idle, hours = row["max_idle_minutes"], row["max_hours"]
    return TeamPolicy(row["project"], None if idle is None else int(idle), None if hours is None else float(hours),
                      float(row["set_at"]), str(row["set_by"]))


def _refuse_sqlite(store: StateStore) -> None:
    if not is_team(store):
        raise UsageError("this machine keeps its own state (SQLite): its policy is the config's `policy:` "
                         "(max_idle_minutes, max_hours), not a team's",
                         hint="set `policy:` in the config (docs/watchdog.md); team policies live in a team "
                              "database (state_url, docs/teams.md)")


class _Unreadable:
    """A member whose role may not read `policies` (a database migrated to it, the grants not run
    again): one line, and no launch (a floor that cannot be read cannot be held)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if exc is not None and type(exc).__name__ == "InsufficientPrivilege":
            raise UsageError(f"this member may not read the team database's policies ({_first_line(exc)})",
                             hint="an admin runs the grants `cloudtrain team init` prints (docs/teams.md)") from None
        return False


def list_policies(store: StateStore) -> list[TeamPolicy]:
    """Every scope's row, the every-project one first."""
    _refuse_sqlite(store)
    with _Unreadable():
        rows = store._db.execute(f"SELECT {_COLUMNS} FROM policies ORDER BY COALESCE(project, '')").fetchall()
    return [_policy(r) for r in rows]


def covering(store: StateStore, project: str) -> list[TeamPolicy]:
    """The rows that bind a member of `project`, in one query; [] on SQLite."""
    if not is_team(store):
        return []
    with _Unreadable():
        rows = store._db.execute(f"SELECT {_COLUMNS} FROM policies WHERE project IS NULL OR project = ? "
                                 "ORDER BY COALESCE(project, '')", (project,)).fetchall()
    return [_policy(r) for r in rows]


def set_policy(store: StateStore, *, max_idle_minutes: int | None, max_hours: float | None, project: str | None,
               by: str) -> TeamPolicy:
    """Set the given keys of a scope's floor; a key not given keeps the value it had."""
    _refuse_sqlite(store)
    if max_idle_minutes is None and max_hours is None:
        raise UsageError("which floor? nothing to set",
                         hint="--max-idle-minutes N and/or --max-hours H (`cloudtrain team policy unset` removes one)")
    if max_idle_minutes is not None and max_idle_minutes < 1:
        raise UsageError(f"--max-idle-minutes {max_idle_minutes}: at least 1")
    if max_hours is not None and not max_hours > 0:
        raise UsageError(f"--max-hours {max_hours:g}: more than 0")
    with _admin(), store._write() as db:
        old = db.execute(f"SELECT {_COLUMNS} FROM policies WHERE COALESCE(project, '') = ?",
                         (project or "",)).fetchone()
        if old is not None:
            max_idle_minutes = max_idle_minutes if max_idle_minutes is not None else old["max_idle_minutes"]
            max_hours = max_hours if max_hours is not None else old["max_hours"]
        db.execute("DELETE FROM policies WHERE COALESCE(project, '') = ?", (project or "",))
        db.execute("INSERT INTO policies (project, max_idle_minutes, max_hours, set_at, set_by) VALUES (?, ?, ?, ?, ?)",
                   (project, max_idle_minutes, max_hours, time.time(), by))
        row = db.execute(f"SELECT {_COLUMNS} FROM policies WHERE COALESCE(project, '') = ?",
                         (project or "",)).fetchone()
    return _policy(row)


def unset_policy(store: StateStore, project: str | None) -> bool:
    """Remove a scope's floor; False when it had none."""
    _refuse_sqlite(store)
    with _admin(), store._write() as db:
        gone = db.execute("DELETE FROM policies WHERE COALESCE(project, '') = ?", (project or "",))
        return bool(gone.rowcount)


class _admin:
    """A member may read policies, not write them: one line with the database's own reason, not
    the driver's error."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if exc is not None and type(exc).__name__ == "InsufficientPrivilege":
            raise UsageError(f"only the team database's admin may set policies, a member may read them "
                             f"(the database: {_first_line(exc)})",
                             hint="ask the admin who ran `cloudtrain team init`; `cloudtrain team policy` shows "
                                  "them") from None
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
