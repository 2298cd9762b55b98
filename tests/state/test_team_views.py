"""`status --all-users` and `cost --all-users [--by user|project|cloud|day]` on both engines: every
member's rows, spend attributed to whoever launched it, groups that add up to the total; without
--all-users a team database shows a member their own rows (SQLite: this machine's, as before)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from cloudtrain.state import StateStore
from cloudtrain.state.budgets import hold_launch, who
from tests.conftest import cloudtrain

# A fixed past day, so that an interval across its midnight (UTC) splits into two known days.
MIDNIGHT = datetime(2026, 3, 15, tzinfo=timezone.utc).timestamp()


def _bill(store: StateStore, name: str, cloud: str, hourly: float, started: float, ended: float) -> None:
    uid = store.get_cluster(name).uid  # type: ignore[union-attr]
    with store._write() as db:
        db.execute("INSERT INTO billing (cluster, cloud, instance_id, kind, hourly_price, started_at, ended_at, "
                   "incarnation, min_s, source) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, 0, 'call')",
                   (name, cloud, f"i-{name}", hourly, started, ended, uid))


@pytest.fixture
def two_members(state_backend: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Cluster a1 (this member, project default: 1 h at $1) and b1 (bob, project vision: 2 h at $2,
    one hour each side of MIDNIGHT), both still up."""
    monkeypatch.setenv("CLOUDTRAIN_OWNER", "alice")
    store = StateStore()
    me = who(store, "alice")
    for name, owner in (("a1", "alice"), ("b1", "bob")):
        hold_launch(store, dict(name=name, provider="aws" if owner == "alice" else "gcp", status="up", owner=owner,
                                hourly_price=1.0, num_nodes=1), owner=owner, worst_usd=None)
    with store._write() as db:
        # bob launched b1 for project vision (on PostgreSQL the server records the role: a second
        # role's rows are written here as the test's superuser, then given to bob).
        db.execute("UPDATE budget_holds SET member = 'bob', project = 'vision' WHERE cluster = 'b1'")
        if state_backend == "postgres":
            db.execute("UPDATE clusters SET member = 'bob' WHERE name = 'b1'")
    _bill(store, "a1", "aws", 1.0, MIDNIGHT - 5 * 3600, MIDNIGHT - 4 * 3600)
    _bill(store, "b1", "gcp", 2.0, MIDNIGHT - 3600, MIDNIGHT + 3600)
    store.close()
    return me, state_backend


def _json(*args: str) -> dict:
    done = cloudtrain(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cost_all_users_groups_add_up_to_the_ledger(two_members: tuple[str, str]) -> None:
    me, _ = two_members
    by_user = _json("cost", "--all-users", "--no-refresh", "--json")
    assert by_user["by"] == "user" and by_user["total_usd"] == pytest.approx(5.0)
    assert {g["user"]: g["usd"] for g in by_user["groups"]} == {me: pytest.approx(1.0), "bob": pytest.approx(4.0)}
    by_project = _json("cost", "--all-users", "--by", "project", "--no-refresh", "--json")
    assert {g["project"]: g["usd"] for g in by_project["groups"]} == {"default": pytest.approx(1.0),
                                                                      "vision": pytest.approx(4.0)}
    by_cloud = _json("cost", "--all-users", "--by", "cloud", "--no-refresh", "--json")
    assert {g["cloud"]: g["node_hours"] for g in by_cloud["groups"]} == {"aws": 1.0, "gcp": 2.0}
    by_day = _json("cost", "--all-users", "--by", "day", "--no-refresh", "--json")
    assert {g["day"]: g["usd"] for g in by_day["groups"]} == {"2026-03-14": pytest.approx(3.0),
                                                              "2026-03-15": pytest.approx(2.0)}
    text = cloudtrain("cost", "--all-users", "--no-refresh")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["USER", "SPENT", "NODE-HOURS", "CLUSTERS"]
    assert ["bob", "$4.00", "2.00", "1"] in [line.split() for line in lines]
    assert "total: $5.00" in text.stdout


def test_without_all_users_a_team_member_sees_their_own(two_members: tuple[str, str]) -> None:
    me, backend = two_members
    mine = _json("cost", "--no-refresh", "--json")
    status = _json("status", "--json")
    if backend == "postgres":
        assert mine["total_usd"] == pytest.approx(1.0)
        assert [c["cluster"] for c in mine["clusters"]] == ["a1"]
        assert [c["name"] for c in status["clusters"]] == ["a1"]
    else:  # this machine's own file: everything in it, as before
        assert mine["total_usd"] == pytest.approx(5.0)
        assert [c["name"] for c in status["clusters"]] == ["a1", "b1"]
    everyone = _json("status", "--all-users", "--json")
    owners = {"postgres": {"a1": me, "b1": "bob"}, "sqlite": {"a1": "alice", "b1": "bob"}}[backend]
    assert {c["name"]: c["user"] for c in everyone["clusters"]} == owners
    text = cloudtrain("status", "--all-users")
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split()[:3] == ["CLUSTER", "USER", "CLOUD"]
    assert [row.split()[:2] for row in rows[:2]] == [["a1", owners["a1"]], ["b1", "bob"]]
