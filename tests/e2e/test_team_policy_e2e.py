"""Team policies through the CLI (issue 39.4): the admin and a member (two HOMEs and
CLOUDTRAIN_HOMEs, two database roles, one PostgreSQL database). The admin sets the team's floor;
the member cannot, and is told so in one line with the database's reason; the member's recipe
above the floor (`validate`, `up`) and their `autostop --cancel` are refused in one line naming
"(team)", before any cloud call; the member's own config floor wins where it is lower; once the
admin unsets it the recipe passes."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cloudtrain.testing.postgres import PostgresServer
from tests.conftest import cli_as

RECIPE = ("name: p\nresources: {cloud: aws, instance_type: t3.medium}\nrun: 'true'\n"
          "autostop: {idle_minutes: 120}\nbudget: {max_hours: 2}\n")


@pytest.fixture
def team_db(postgres_server: PostgresServer) -> Iterator[tuple[str, str]]:
    """A team database at the current schema; the admin's URL and a member's, granted as `team init` prints."""
    database = postgres_server.initialized_database()
    admin = postgres_server.url(database)
    member = f"ct_dana_{secrets.token_hex(3)}"
    postgres_server.grant_members(database)
    postgres_server.sql(f"CREATE ROLE {member} LOGIN IN ROLE cloudtrain_member")
    try:
        yield admin, postgres_server.url(database, user=member)
    finally:
        postgres_server.drop_database(database)
        postgres_server.sql(f"DROP ROLE IF EXISTS {member}")


def _env(root: Path, url: str, config: dict) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "home").mkdir(exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no cloud is reached
    return {**env, "HOME": str(root / "home"), "CLOUDTRAIN_HOME": str(root / "ct-home"),
            "CLOUDTRAIN_CONFIG": str(root / "config.yaml"), "CLOUDTRAIN_STATE_URL": url}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return cli_as(env, *args, timeout=120)


def _refused(done: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (exit 2)."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stdout, done.stderr)
    return lines[0]


def test_the_admins_floor_binds_a_member_who_cannot_lift_it(team_db: tuple[str, str], tmp_path: Path) -> None:
    admin_url, member_url = team_db
    admin = _env(tmp_path / "admin", admin_url, {"owner": "admin"})
    member = _env(tmp_path / "dana", member_url, {"owner": "dana", "policy": {"max_hours": 12}})
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)

    done = _cli(admin, "team", "policy", "set", "--max-idle-minutes", "60", "--max-hours", "24")
    assert done.returncode == 0, done.stderr
    assert "the team's policy: max_idle_minutes 60, max_hours 24;" in done.stdout

    line = _refused(_cli(member, "team", "policy", "set", "--max-idle-minutes", "600"))
    assert line.startswith("error: only the team database's admin may set policies, a member may read them (the "
                           "database: permission denied for table policies)"), line
    shown = _cli(member, "team", "policy", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [(p["project"], p["max_idle_minutes"], p["max_hours"]) for p in data["policies"]] == [(None, 60, 24.0)]
    # Per key the stricter: the team's 60 minutes, the member's own config's 12 hours.
    assert data["in_force"] == {"max_idle_minutes": {"value": 60, "source": "team"},
                                "max_hours": {"value": 12.0, "source": "config"}}

    text = _cli(member, "team", "policy")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[-1] == "in force for you (project default): max_idle_minutes 60 (team), " \
                                           "max_hours 12 (config)", text.stdout

    line = _refused(_cli(member, "validate", str(recipe)))
    assert line == f"error: {recipe}:4: autostop.idle_minutes: 120 is more than policy max_idle_minutes 60 (team) " \
                   "(at most 60)", line
    # `up` is refused by the same check, before any credentials or cloud call.
    line = _refused(_cli(member, "up", str(recipe), "--cluster", "p1"))
    assert "120 is more than policy max_idle_minutes 60 (team)" in line, line
    line = _refused(_cli(member, "autostop", "p1", "--cancel"))
    assert line == "error: autostop --cancel: policy max_idle_minutes 60 (team) does not allow turning autostop " \
                   "off (`cloudtrain autostop p1 -i 60` (or less))", line

    done = _cli(admin, "team", "policy", "unset")
    assert done.returncode == 0 and "the team's policy: removed" in done.stdout, done.stderr
    done = _cli(member, "validate", str(recipe))
    assert done.returncode == 0, done.stderr
