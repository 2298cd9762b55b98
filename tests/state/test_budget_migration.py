"""SQLite schema v8 (budgets) from a v7 file: the rows stay, budgets work at once, and spend billed
before budgets existed (no hold row) counts for this machine's owner and project 'default'."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cloudtrain.state import SCHEMA_VERSION, StateStore
from cloudtrain.state.budgets import hold_launch, incarnation_owners, set_budget, usage
from cloudtrain.state.schema import _MIGRATIONS


def test_a_v7_file_migrates_to_budgets_and_its_spend_counts(tmp_path: Path) -> None:
    assert SCHEMA_VERSION >= 8
    path = tmp_path / "state.db"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(7):
        for statement in _MIGRATIONS[step].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {step + 1}")
    now = time.time()
    # Rows as a v7 cloudtrain wrote them: a live cluster billing for the last hour at $2/h.
    db.execute("INSERT INTO clusters (name, provider, status, owner, created_at, updated_at, uid) "
               "VALUES ('old', 'aws', 'up', 'alice', ?, ?, 'u-old')", (now - 3600, now - 3600))
    db.execute("INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at, incarnation, min_s) "
               "VALUES ('old', 'aws', 'i-1', 'running', 2.0, ?, 'u-old', 60)", (now - 3600,))
    db.close()

    store = StateStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [c.name for c in store.list_clusters()] == ["old"]
    assert incarnation_owners(store, "alice") == {"u-old": ("alice", "default")}
    set_budget(store, 5.0, "alice", None, by="alice")
    (use,) = usage(store, "alice", now)
    # No hold (launched before budgets): its spend counts, nothing is held for it.
    assert use.spent == pytest.approx(2.0, rel=1e-3) and use.held == 0.0
    hold_launch(store, dict(name="new", provider="aws", status="provisioning", owner="alice"), owner="alice",
                worst_usd=2.5)
    (use,) = usage(store, "alice", now)
    assert use.held == 2.5 and use.left == pytest.approx(0.5, rel=1e-2)
    store.close()
