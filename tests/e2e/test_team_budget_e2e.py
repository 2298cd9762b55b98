"""Team budgets on the AWS fake (issue 37): two members (two HOMEs and CLOUDTRAIN_HOMEs, two
database roles, one PostgreSQL database) start 2 x 10 `up`s at once under a team budget that admits
three launches' worst cases. At most three launch, the rest are refused in one line before any
launch call, and the fake's bill (its own record of every instance's life, never cloudtrain's)
stays within the budget; `cost --all-users` equals that bill within 1%, `status --all-users` shows
each member's clusters, and a member may read the budgets but not set them."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.postgres import PostgresServer
from tests.conftest import cli_as

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

PER_MEMBER = 10
ADMITS = 3.5  # launches' worst cases the budget holds: three fit, a fourth does not


@pytest.fixture
def team_db(postgres_server: PostgresServer):  # noqa: ANN201
    """A team database at the current schema, two member roles made with `team init`'s grants."""
    database = postgres_server.initialized_database()
    admin = postgres_server.url(database)
    members = [f"ct_{who}_{secrets.token_hex(3)}" for who in ("alice", "bob")]
    postgres_server.grant_members(database)
    for member in members:
        postgres_server.sql(f"CREATE ROLE {member} LOGIN IN ROLE cloudtrain_member")
    try:
        yield admin, [postgres_server.url(database, user=m) for m in members], members
    finally:
        postgres_server.drop_database(database)
        for member in members:
            postgres_server.sql(f"DROP ROLE IF EXISTS {member}")


def _member_env(cloud: AwsCloud, root: Path, url: str, owner: str) -> dict[str, str]:
    """A member's own HOME, CLOUDTRAIN_HOME and config (the fake's, with their owner), one database."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    (root / "home").mkdir(exist_ok=True)
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({**cloud.config, "owner": owner, "runs_dir": str(root / "runs")}))
    return {**os.environ, **cloud.env, "HOME": str(root / "home"), "CLOUDTRAIN_HOME": str(root / "ct-home"),
            "CLOUDTRAIN_CONFIG": str(config), "CLOUDTRAIN_STATE_URL": url}


def _cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli_as(env, *args, timeout=timeout)


def test_racing_ups_of_two_members_stay_within_the_team_budget(aws_cloud: AwsCloud, team_db, tmp_path: Path) -> None:  # noqa: ANN001
    from cloudtrain.cluster.holds import worst_case_usd
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import set_budget

    admin, urls, roles = team_db
    envs = [_member_env(aws_cloud, tmp_path / who, url, who) for who, url in zip(("alice", "bob"), urls)]
    recipe = str(aws_cloud.recipe(run="true", budget={"max_hours": 1}))
    planned = _cli(envs[0], "plan", recipe, "--json")
    assert planned.returncode == 0, planned.stderr
    best = json.loads(planned.stdout)["best"]
    worst = worst_case_usd("aws", best["hourly_price"], 1, 3600.0, None)
    assert worst is not None and worst > 0
    store = StateStore(admin)
    set_budget(store, round(ADMITS * worst, 4), None, None, by="admin")
    store.close()

    # A member reads the budgets and may not set them.
    refused = _cli(envs[1], "team", "budget", "set", "--monthly-usd", "1000")
    assert refused.returncode == 2 and "only the team database's admin may set budgets" in refused.stderr
    shown = _cli(envs[1], "team", "budget", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["budgets"][0]["left_usd"] == pytest.approx(ADMITS * worst, abs=1e-4)

    names = [[aws_cloud.new_cluster(f"{who[0]}{i}") for i in range(PER_MEMBER)] for who in ("alice", "bob")]
    started = time.time()
    # All the `up`s at once, each a CLI process of its own (a thread here waits for each).
    launches = [(m, names[m][i]) for i in range(PER_MEMBER) for m in (0, 1)]
    with ThreadPoolExecutor(len(launches)) as pool:
        done = list(pool.map(lambda launch: _cli(envs[launch[0]], "up", recipe, "--cluster", launch[1], timeout=600),
                             launches))
    results = [(member, name, proc.returncode, proc.stderr) for (member, name), proc in zip(launches, done)]
    took = time.time() - started
    admitted = [(m, n) for m, n, rc, _ in results if rc == 0]
    refusals = [err.strip().splitlines()[-1] for _, _, rc, err in results if rc != 0]
    assert 1 <= len(admitted) <= 3, results
    assert all(rc in (0, 2) for _, _, rc, _ in results), results
    for line in refusals:
        assert line.startswith("error: the team's budget: ") and "this launch's worst case is" in line, line
    # Refused before any launch call: only the admitted launched, one instance each.
    assert aws_cloud.faults.count("RunInstances") == len(admitted)
    assert sorted(aws_cloud.bill.instances()) == sorted(i["InstanceId"] for i in aws_cloud.instances())

    alice = _cli(envs[0], "status", "--all-users", "--json")
    assert alice.returncode == 0, alice.stderr
    assert {c["name"]: c["user"] for c in json.loads(alice.stdout)["clusters"]} == {n: roles[m] for m, n in admitted}
    mine = json.loads(_cli(envs[0], "status", "--json").stdout)["clusters"]
    assert {c["name"] for c in mine} == {n for m, n in admitted if m == 0}
    held = json.loads(_cli(envs[0], "team", "budget", "--json").stdout)["budgets"][0]
    assert held["spent_usd"] + held["held_usd"] == pytest.approx(len(admitted) * worst, rel=0.01)

    for member, name in admitted:
        done = _cli(envs[member], "down", name)
        assert done.returncode == 0, done.stderr
    assert aws_cloud.bill.running() == []
    at = time.time()
    billed = aws_cloud.bill.usd(until=at)
    assert 0 < billed <= ADMITS * worst
    report = _cli(envs[1], "cost", "--all-users", "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["total_usd"] == pytest.approx(billed, rel=0.01)
    per_user = {g["user"]: g["usd"] for g in data["groups"]}
    assert set(per_user) == {roles[m] for m, _ in admitted}
    after = json.loads(_cli(envs[0], "team", "budget", "--json").stdout)["budgets"][0]
    assert after["held_usd"] == 0 and after["spent_usd"] == pytest.approx(billed, rel=0.01)
    plan_text = _cli(envs[0], "plan", recipe)
    assert f"the team's budget: ${after['left_usd']:,.2f} left this month" in plan_text.stdout + plan_text.stderr
    print(f"20 racing ups took {took:.1f} s; {len(admitted)} admitted; bill ${billed:.4f} of "
          f"${ADMITS * worst:.4f}; cost --all-users ${data['total_usd']:.4f}")
