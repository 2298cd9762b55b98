"""Where a sweep's Optuna study lives (sweep/space.py `study_location`): a journal file under this
machine's cloudtrain home without a team database, exactly as before; with one, Optuna's own
tables in that PostgreSQL database, which the admin's `team init`/`team migrate` make and grant, so
two members' machines go on with one study. A member of a database without them is told in one
line what the admin runs."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.errors import UsageError
from cloudtrain.recipe import Sweep
from cloudtrain.sweep.model import TrialState
from cloudtrain.state.optuna_tables import study_tables
from cloudtrain.sweep.space import OptunaSampler, study_location
from cloudtrain.testing.postgres import PostgresServer
from cloudtrain.testing.postgres import connection as pg_connection
from tests.conftest import cli_as, cli_env


def _sweep() -> Sweep:
    return Sweep.model_validate({"method": "random", "max_trials": 10, "budget_usd": 1, "metric": "score",
                                 "goal": "max", "parameters": {"x": {"uniform": [0.0, 1.0]}}, "seed": 0})


@pytest.fixture
def members(postgres_server: PostgresServer) -> Iterator[tuple[str, str, list[str]]]:
    """A database `team init` prepared, its grants applied, two member roles: (database, admin URL, member URLs)."""
    database = postgres_server.initialized_database()
    admin = postgres_server.url(database)
    roles = [f"ct_{who}_{secrets.token_hex(3)}" for who in ("alice", "bob")]
    postgres_server.grant_members(database)
    for role in roles:
        postgres_server.sql(f"CREATE ROLE {role} LOGIN IN ROLE cloudtrain_member")
    try:
        yield database, admin, [postgres_server.url(database, user=r) for r in roles]
    finally:
        postgres_server.drop_database(database)
        for role in roles:
            postgres_server.sql(f"DROP ROLE IF EXISTS {role}")


def test_without_a_team_database_the_study_is_a_journal_under_the_home(cloudtrain_home: Path, tmp_path: Path) -> None:
    where = study_location(tmp_path / "state.db", "abc123")
    assert where == cloudtrain_home / "sweeps" / "abc123" / "optuna.journal"
    first = OptunaSampler(_sweep(), where, "sweep-abc123")
    asked = first.ask()
    assert asked is not None and asked[0] == 0
    first.tell(0, TrialState.SUCCEEDED, 0.5)
    first.close()
    assert where.is_file()
    again = OptunaSampler(_sweep(), where, "sweep-abc123")
    assert [t.number for t in again.study.get_trials()] == [0]
    assert again.ask() is not None and again.study.get_trials()[-1].number == 1


def test_two_members_go_on_with_one_study_in_the_team_database(members: tuple[str, str, list[str]]) -> None:
    from cloudtrain.state.schema_pg import PG_TABLES

    _database, admin, (alice, bob) = members
    assert not set(study_tables()) & {*PG_TABLES, "budgets", "cloudtrain_schema"}  # Optuna's names are not ours
    assert study_location(alice, "abc123") == alice
    hers = OptunaSampler(_sweep(), study_location(alice, "abc123"), "sweep-abc123")
    try:
        for expected in (0, 1):
            asked = hers.ask()
            assert asked is not None and asked[0] == expected
        hers.report(1, 1, 0.25)
        hers.tell(0, TrialState.SUCCEEDED, 0.5)
    finally:
        hers.close()
    # Her machine died with trial 1 running and a third asked that the sweep never recorded.
    his = OptunaSampler(_sweep(), study_location(bob, "abc123"), "sweep-abc123")
    try:
        his.forget_unknown({0, 1})
        asked = his.ask()
        assert asked is not None and asked[0] == 2
        assert his.report(1, 2, 0.75) is False  # her running trial goes on here
        his.tell(1, TrialState.SUCCEEDED, 0.75)
        his.tell(2, TrialState.SUCCEEDED, 0.25)
        states = [(t.number, t.state.name, t.value) for t in his.study.get_trials()]
    finally:
        his.close()
    assert states == [(0, "COMPLETE", 0.5), (1, "COMPLETE", 0.75), (2, "COMPLETE", 0.25)]
    with pg_connection(admin) as conn:
        left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchone()[0]
    assert left == 0  # the samplers gave their connections back


def test_a_member_without_optuna_tables_is_told_what_the_admin_runs(
        members: tuple[str, str, list[str]], postgres_server: PostgresServer, cloudtrain_home: Path) -> None:
    database, admin, (alice, _bob) = members
    # A database migrated before sweeps kept their studies there: no Optuna tables.
    postgres_server.sql("DROP TABLE " + ", ".join(study_tables()) + " CASCADE", database)
    with pytest.raises(UsageError) as refused:
        OptunaSampler(_sweep(), alice, "sweep-abc123")
    assert "keeps sweeps' Optuna studies, and this member may not use its Optuna tables (permission denied" \
           in refused.value.message
    assert refused.value.hint is not None and "`cloudtrain team migrate`" in refused.value.hint
    assert "password" not in refused.value.message

    # The admin's `team migrate` makes them; until their grants are run the member still may not use them.
    migrated = _cli_as(admin, "team", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert any(line.startswith("GRANT") and "trials" in line for line in migrated.stdout.splitlines()), migrated.stdout
    with pytest.raises(UsageError) as still:
        OptunaSampler(_sweep(), alice, "sweep-abc123")
    assert "(permission denied for table" in still.value.message
    postgres_server.grant_members(database)
    sampler = OptunaSampler(_sweep(), alice, "sweep-abc123")
    try:
        asked = sampler.ask()
        assert asked is not None and asked[0] == 0
    finally:
        sampler.close()


def _cli_as(url: str, *args: str) -> subprocess.CompletedProcess:
    return cli_as(cli_env(CLOUDTRAIN_STATE_URL=url), *args, timeout=300)
