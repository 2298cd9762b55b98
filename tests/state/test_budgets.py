"""Team budgets (cloudtrain/state/budgets.py) on both engines: what a budget has spent, holds and
has left; a launch that does not fit is refused with its intent unwritten; racing launches from
two processes never over-commit a budget."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cloudtrain.state import StateStore
from cloudtrain.state.budgets import (
    OverBudget,
    check_launch,
    hold_launch,
    incarnation_owners,
    month_start,
    set_budget,
    unset_budget,
    usage,
    who,
)
from tests.conftest import cli_env

OWNER = "alice"  # the config's owner: the member on SQLite (PostgreSQL says its role)


def intent(name: str) -> dict:
    return dict(name=name, provider="aws", status="provisioning", owner=OWNER, hourly_price=1.0, num_nodes=1)


def bill(store: StateStore, name: str, hourly: float, started: float, ended: float | None) -> None:
    """A billed interval of the cluster's current incarnation, as reconcile writes one."""
    uid = store.get_cluster(name).uid  # type: ignore[union-attr]
    with store._write() as db:
        db.execute("INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at, ended_at, "
                   "incarnation, min_s, source) VALUES (?, 'aws', ?, 'running', ?, ?, ?, ?, 0, 'call')",
                   (name, f"i-{name}", hourly, started, ended, uid))


def test_a_hold_counts_its_unspent_worst_case_until_its_cluster_ends(state_backend: str) -> None:
    store = StateStore()
    set_budget(store, 100.0, None, None, by="admin")
    now = time.time()
    hold_launch(store, intent("a"), owner=OWNER, worst_usd=10.0)
    (use,) = usage(store, OWNER, now)
    assert (use.spent, use.held, use.left) == (0.0, 10.0, 90.0)
    # Four hours at $1/h observed by the ledger: the hold shrinks by what became spend.
    bill(store, "a", 1.0, now - 4 * 3600, now)
    (use,) = usage(store, OWNER, now)
    assert use.spent == pytest.approx(4.0) and use.held == pytest.approx(6.0) and use.left == pytest.approx(90.0)
    # Ended: nothing held any more, the spend stays.
    store.delete_cluster("a")
    (use,) = usage(store, OWNER, now)
    assert use.spent == pytest.approx(4.0) and use.held == 0.0 and use.left == pytest.approx(96.0)
    store.close()


def test_spend_is_this_month_only_and_a_terminated_cluster_holds_nothing(state_backend: str) -> None:
    store = StateStore()
    set_budget(store, 50.0, None, None, by="admin")
    now = time.time()
    start = month_start(now)
    hold_launch(store, intent("old"), owner=OWNER, worst_usd=30.0)
    # Two hours before the month began and one after: only the one counts this month.
    bill(store, "old", 2.0, start - 2 * 3600, start + 3600)
    store.set_cluster_status("old", "terminated")
    (use,) = usage(store, OWNER, max(now, start + 3600))
    assert use.spent == pytest.approx(2.0) and use.held == 0.0
    store.close()


def test_budgets_cover_their_member_and_project_only(state_backend: str, cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    me = who(store, OWNER)
    set_budget(store, 5.0, None, "vision", by="admin")
    set_budget(store, 7.0, me, None, by="admin")
    set_budget(store, 9.0, "somebody-else", None, by="admin")
    hold_launch(store, intent("d"), owner=OWNER, worst_usd=4.0)  # project 'default'
    uses = {(u.budget.member, u.budget.project): u for u in usage(store, OWNER)}
    assert uses[("*", "vision")].held == 0.0
    assert uses[(me, "*")].held == 4.0
    assert uses[("somebody-else", "*")].held == 0.0
    assert incarnation_owners(store, OWNER) == {}  # nothing billed yet
    # 7 - 4 = 3 left of mine: a launch of 3.5 does not fit, and says which budget and its numbers.
    with pytest.raises(OverBudget) as refused:
        hold_launch(store, intent("e"), owner=OWNER, worst_usd=3.5)
    line = refused.value.one_line()
    assert line.startswith(f"{me}'s budget: $0 spent + $4.00 held of $7.00 this month, $3.00 left; "
                           "this launch's worst case is $3.50 (")
    assert refused.value.exit_code == 2
    # Refused with its intent: no cluster row, no hold.
    assert store.get_cluster("e") is None
    assert store._db.execute("SELECT COUNT(*) FROM budget_holds WHERE cluster = 'e'").fetchone()[0] == 0
    with pytest.raises(OverBudget):
        check_launch(store, owner=OWNER, worst_usd=3.5)
    check_launch(store, owner=OWNER, worst_usd=2.9)
    # Spend is attributed to the launcher's member and project (the hold row), and counts.
    bill(store, "d", 1.0, time.time() - 60, None)
    assert list(incarnation_owners(store, OWNER).values()) == [(me, "default")]
    assert {(u.budget.member, u.budget.project): u for u in usage(store, OWNER)}[(me, "*")].spent > 0
    assert unset_budget(store, me, None) and not unset_budget(store, me, None)
    hold_launch(store, intent("e"), owner=OWNER, worst_usd=3.5)
    store.close()


def test_an_unbounded_launch_is_refused_under_a_budget_and_free_ones_always_fit(state_backend: str) -> None:
    store = StateStore()
    hold_launch(store, intent("free-for-all"), owner=OWNER, worst_usd=None)  # no budget: nothing to hold
    set_budget(store, 0.0, None, None, by="admin")
    with pytest.raises(OverBudget, match="nothing bounds its cost") as refused:
        hold_launch(store, intent("unbounded"), owner=OWNER, worst_usd=None)
    assert "set budget.max_hours or budget.max_usd" in refused.value.one_line()
    hold_launch(store, intent("local"), owner=OWNER, worst_usd=0.0)
    store.close()


def test_a_failover_attempt_replaces_its_own_hold(state_backend: str) -> None:
    store = StateStore()
    set_budget(store, 10.0, None, None, by="admin")
    hold_launch(store, intent("f"), owner=OWNER, worst_usd=6.0)
    # The next placement of the same launch (same row, same incarnation) at a dearer price: it fits
    # because its own first hold is not counted against it.
    hold_launch(store, {**intent("f"), "hourly_price": 1.5}, owner=OWNER, worst_usd=9.0)
    (use,) = usage(store, OWNER)
    assert use.held == 9.0
    assert store.get_cluster("f").hourly_price == 1.5  # type: ignore[union-attr]
    store.close()


RACER = """
import sys, threading
from cloudtrain.state import StateStore
from cloudtrain.state.budgets import OverBudget, hold_launch

tag, count = sys.argv[1], int(sys.argv[2])
stores = [StateStore() for _ in range(count)]
barrier = threading.Barrier(count)
results = []

def launch(i):
    barrier.wait()
    try:
        hold_launch(stores[i], dict(name=f"race-{tag}-{i}", provider="aws", status="provisioning", owner="alice",
                                    hourly_price=1.0, num_nodes=1), owner="alice", worst_usd=1.0)
        results.append("admitted")
    except OverBudget:
        results.append("refused")

threads = [threading.Thread(target=launch, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(" ".join(results))
"""


def test_racing_launches_from_two_processes_never_over_commit(state_backend: str) -> None:
    """2 processes x 10 concurrent launches, each holding $1, against a budget of $3.50: three fit."""
    store = StateStore()
    set_budget(store, 3.5, None, None, by="admin")
    procs = [subprocess.Popen([sys.executable, "-c", RACER, tag, "10"], env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for tag in ("p", "q")]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes += out.split()
    assert len(outcomes) == 20
    assert outcomes.count("admitted") == 3
    (use,) = usage(store, OWNER)
    assert use.held == 3.0 and use.left == 0.5
    assert len([c for c in store.list_clusters() if c.name.startswith("race-")]) == 3
    store.close()
