"""Team policies (cloudtrain/state/policies.py, cloudtrain/policy.py): on a team database the floor
in force is, per key, the lower of the config's and the team's (its every-project row and the
member's project's), named where it was set; recipes and `cloudtrain autostop` are refused by it;
on SQLite nothing but the config's `policy:` holds, and the team verbs say so in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import paths
from cloudtrain.config import Config
from cloudtrain.errors import UsageError
from cloudtrain.policy import Policy, check_autostop, effective_policy, recipe_refusal
from cloudtrain.recipe import Recipe
from cloudtrain.state import StateStore
from cloudtrain.state.location import ENV
from cloudtrain.state.policies import covering, list_policies, set_policy, unset_policy
from cloudtrain.testing.postgres import PostgresServer
from tests.conftest import cloudtrain


def config(**policy: Any) -> Config:
    return Config.model_validate({"policy": policy})


def recipe(**fields: Any) -> Recipe:
    return Recipe.model_validate({"name": "p", "run": "true", **fields,
                                  "resources": fields.get("resources", {"cloud": "aws", "instance_type": "t3.medium"})})


@pytest.fixture
def team(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh team database at the current schema as the state, its admin (who ran init) as the role."""
    database = postgres_server.initialized_database()
    monkeypatch.setenv(ENV, postgres_server.url(database))
    try:
        yield
    finally:
        postgres_server.drop_database(database)


def test_the_stricter_of_config_and_team_holds_per_key_and_is_named(team: None) -> None:
    store = StateStore()
    assert effective_policy(config(max_hours=12), store) == Policy(max_hours=12)
    done = set_policy(store, max_idle_minutes=60, max_hours=24, project=None, by="admin")
    assert (done.project, done.max_idle_minutes, done.max_hours, done.set_by) == (None, 60, 24.0, "admin")
    # The config's 12 hours is lower than the team's 24: the config's binds; idle is the team's alone.
    assert effective_policy(config(max_hours=12), store) == Policy(60, 12, "team", "config")
    # The team's 60 minutes is lower than the config's 90; its 24 hours binds where the config has none.
    assert effective_policy(config(max_idle_minutes=90), store) == Policy(60, 24, "team", "team")
    # A tie is named as the team's: editing the config would not lift it.
    assert effective_policy(config(max_idle_minutes=60, max_hours=24), store) == Policy(60, 24, "team", "team")
    # A key not given keeps its value.
    set_policy(store, max_idle_minutes=None, max_hours=8, project=None, by="admin")
    assert [(p.max_idle_minutes, p.max_hours) for p in list_policies(store)] == [(60, 8.0)]
    assert unset_policy(store, None) and not unset_policy(store, None)
    assert effective_policy(config(max_hours=12), store) == Policy(max_hours=12)
    store.close()


def test_a_projects_floor_only_tightens_the_teams_and_binds_its_members_only(
        team: None, cloudtrain_home: Path) -> None:
    store = StateStore()
    set_policy(store, max_idle_minutes=60, max_hours=24, project=None, by="admin")
    set_policy(store, max_idle_minutes=None, max_hours=4, project="vision", by="admin")
    set_policy(store, max_idle_minutes=120, max_hours=None, project="nlp", by="admin")
    assert [p.project for p in list_policies(store)] == [None, "nlp", "vision"]
    # Project 'default' (no `project:` in the config): the team's row only.
    assert effective_policy(Config(), store) == Policy(60, 24, "team", "team")
    assert [p.project for p in covering(store, "nlp")] == [None, "nlp"]
    store.close()
    cloudtrain_home.mkdir(exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("project: vision\n")
    store = StateStore()
    assert effective_policy(Config(), store) == Policy(60, 4, "team", "team, project vision")
    store.close()
    (cloudtrain_home / "config.yaml").write_text("project: nlp\n")
    store = StateStore()
    # nlp's 120 minutes is more than the team's 60: the team's holds.
    assert effective_policy(Config(), store) == Policy(60, 24, "team", "team")
    store.close()


def test_a_team_floor_refuses_recipes_and_live_changes_naming_the_team(team: None) -> None:
    store = StateStore()
    set_policy(store, max_idle_minutes=60, max_hours=24, project=None, by="admin")
    floor = effective_policy(Config(), store)
    assert recipe_refusal(recipe(autostop={"idle_minutes": 60}, budget={"max_hours": 24}), floor) is None
    assert recipe_refusal(recipe(autostop={"idle_minutes": 90}, budget={"max_hours": 2}), floor)[:2] == (
        "autostop.idle_minutes", "90 is more than policy max_idle_minutes 60 (team)")
    assert recipe_refusal(recipe(budget={"max_hours": 30}), floor)[:2] == (
        "budget.max_hours", "30 is more than policy max_hours 24 (team)")
    assert recipe_refusal(recipe(autostop=False, budget={"max_hours": 1}), floor)[:2] == (
        "autostop", "autostop: false turns autostop off, which policy max_idle_minutes 60 (team) does not allow")
    # A cloud that bills nothing is not bound, by the team's floor either.
    assert recipe_refusal(recipe(resources={"cloud": "local"}, autostop=False), floor) is None
    with pytest.raises(UsageError) as refused:
        check_autostop("c", None, True, floor)
    assert refused.value.one_line() == ("autostop --cancel: policy max_idle_minutes 60 (team) does not allow turning "
                                        "autostop off (`cloudtrain autostop c -i 60` (or less))")
    with pytest.raises(UsageError, match=r"autostop -i 61: more than policy max_idle_minutes 60 \(team\)"):
        check_autostop("c", 61, False, floor)
    # Where the config's floor is the lower one, the refusal names the config.
    mixed = effective_policy(config(max_hours=6), store)
    assert recipe_refusal(recipe(budget={"max_hours": 7}), mixed)[1] == "7 is more than policy max_hours 6 (config)"
    store.close()


def test_without_a_store_the_team_floor_is_read_on_the_processes_one_connection(team: None) -> None:
    """preflight (validate, plan, up, run) hands no store: the team database the config names is
    read through this process's session, which a store already open keeps."""
    store = StateStore()
    pid = store._db.execute("SELECT pg_backend_pid()").fetchone()[0]
    set_policy(store, max_idle_minutes=45, max_hours=None, project=None, by="admin")
    assert effective_policy(Config()) == Policy(max_idle_minutes=45, max_idle_minutes_from="team")
    assert store._db.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert store._db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cloudtrain' "
                             "AND datname = current_database()").fetchone()[0] == 1
    store.close()


def test_on_sqlite_only_the_config_holds_and_the_team_verbs_say_where_policies_are_set() -> None:
    # Without a store nothing is opened (`plan` and `validate` create no state file).
    assert effective_policy(config(max_hours=12)) == Policy(max_hours=12)
    assert not paths.state_db().exists()
    store = StateStore()
    # Rows in the parity table are never read: this machine's floor is its config's.
    with store._write() as db:
        db.execute("INSERT INTO policies (project, max_idle_minutes, max_hours, set_at, set_by) "
                   "VALUES (NULL, 5, 1, 0, 'x')")
    assert effective_policy(config(max_hours=12), store) == Policy(max_hours=12)
    with pytest.raises(UsageError, match=r"its policy is the config's `policy:`"):
        set_policy(store, max_idle_minutes=5, max_hours=None, project=None, by="me")
    store.close()
    for args in (("team", "policy"), ("team", "policy", "set", "--max-hours", "3"), ("team", "policy", "unset")):
        done = cloudtrain(*args)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("error: this machine keeps its own state (SQLite): its policy is the config's "
                                   "`policy:`"), lines


def test_set_refuses_nothing_to_set_and_bad_values(team: None) -> None:
    store = StateStore()
    with pytest.raises(UsageError, match="nothing to set"):
        set_policy(store, max_idle_minutes=None, max_hours=None, project=None, by="admin")
    with pytest.raises(UsageError, match="at least 1"):
        set_policy(store, max_idle_minutes=0, max_hours=None, project=None, by="admin")
    with pytest.raises(UsageError, match="more than 0"):
        set_policy(store, max_idle_minutes=None, max_hours=0.0, project=None, by="admin")
    assert list_policies(store) == []
    store.close()
