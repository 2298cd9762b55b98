"""`recover:` in recipes and plans, and the pure rules of run/recover.py: what a loss rules out,
what is left of the budget, when the cloud says a node went."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from cloudtrain.cluster.lifecycle import Cluster
from cloudtrain.plan import Placement, Plan
from cloudtrain.recipe import Budget, Recipe
from cloudtrain.recipe.recover import DEFAULT_RECOVER, Recover
from cloudtrain.run.recover_rules import NodeLostError, budget_left, next_candidates, rule_out
from cloudtrain.run.gone import Gone, GoneKind, ask, judge
from cloudtrain.state import ClusterRecord, ClusterStatus, NodeRecord


def recipe(**fields: Any) -> Recipe:
    return Recipe.model_validate({"name": "r", "run": "true", **fields})


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, None),  # on-demand: off unless asked
    ({"resources": {"cloud": "aws", "spot": True}}, DEFAULT_RECOVER),  # spot: on by default
    ({"resources": {"cloud": "aws", "spot": True}, "recover": False}, None),
    ({"recover": True}, DEFAULT_RECOVER),
    ({"recover": {"max_restarts": 1}}, Recover(max_restarts=1)),
    ({"recover": {"watch_s": 2}}, Recover(watch_s=2)),
    ({"resources": {"cloud": "local"}, "recover": {"max_restarts": 0}}, Recover(max_restarts=0)),
])
def test_recover_in_force(fields: dict[str, Any], expected: Recover | None) -> None:
    assert recipe(**fields).recovery == expected


@pytest.mark.parametrize(("fields", "says"), [
    ({"recover": 3}, "recover: {max_restarts: 3}"),
    ({"recover": "yes"}, "expected a mapping"),
    ({"recover": {"max_restart": 1}}, "max_restart"),
    ({"recover": {"max_restarts": -1}}, "greater than or equal to 0"),
    ({"recover": {"max_restarts": 21}}, "less than or equal to 20"),
    ({"recover": {"watch_s": 0}}, "greater than or equal to 1"),
    ({"resources": {"cloud": "ssh", "hosts": [{"address": "10.0.0.5"}]}, "recover": True}, "listed hosts"),
])
def test_bad_recover_is_refused(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        recipe(**fields)
    assert says in str(caught.value)


def placement(region: str, zone: str | None = None, cloud: str = "aws", price: float = 0.1) -> Placement:
    return Placement(cloud=cloud, region=region, zone=zone, instance_type="t3.medium", hourly_price=price, spot=True)


@pytest.mark.parametrize(("max_restarts", "shown"), [(3, True), (None, False), (0, False)])
def test_the_plan_says_it_recovers(max_restarts: int | None, shown: bool) -> None:
    plan = Plan("aws", 1, True, (placement("us-east-1"),), max_restarts=max_restarts)
    assert ("recover: up to 3 relaunch(es)" in plan.summary()) is shown


A, B, C = placement("us-east-1"), placement("us-west-2", price=0.2), placement("westus2", cloud="azure", price=0.3)


@pytest.mark.parametrize(("losses", "expected"), [
    # A zonal machine: the same region first, without the zones lost so far; then the rest in order.
    ([("aws", "us-east-1", "us-east-1a")], [("us-east-1", ("us-east-1a",)), ("us-west-2", ()), ("westus2", ())]),
    ([("aws", "us-east-1", "us-east-1a"), ("aws", "us-east-1", "us-east-1b")],
     [("us-east-1", ("us-east-1a", "us-east-1b")), ("us-west-2", ()), ("westus2", ())]),
    # A regional machine (no zone): the region goes.
    ([("azure", "westus2", None)], [("us-east-1", ()), ("us-west-2", ())]),
    # Losses elsewhere rule out nothing here.
    ([("gcp", "us-central1", "us-central1-a")], [("us-east-1", ()), ("us-west-2", ()), ("westus2", ())]),
])
def test_next_candidates_skip_what_losses_ruled_out(losses: list, expected: list) -> None:
    avoid: dict = {}
    for cloud, region, zone in losses:
        rule_out(avoid, cloud, region, zone)
    assert [(p.region, p.avoid_zones) for p in next_candidates((A, B, C), avoid)] == expected


def test_nothing_left_to_try_stops_recovery() -> None:
    avoid: dict = {}
    rule_out(avoid, "azure", "westus2", None)
    with pytest.raises(NodeLostError, match="ruled out"):
        next_candidates((C,), avoid)


@pytest.mark.parametrize(("budget", "spent", "hours", "left"), [
    (Budget(max_usd=1.0), 0.25, 0.5, (0.75, None)),
    (Budget(max_hours=2.0), 0.25, 0.5, (None, 1.5)),
    (Budget(max_usd=1.0, max_hours=2.0), 0.4, 1.0, (0.6, 1.0)),
    (Budget(max_usd=1.0), 1.0, 0.1, None),  # spent: no relaunch
    (Budget(max_hours=1.0), 0.0, 1.2, None),
])
def test_a_relaunch_gets_what_is_left_of_the_budget(budget: Budget, spent: float, hours: float, left: Any) -> None:
    if left is None:
        with pytest.raises(NodeLostError, match="budget is spent"):
            budget_left(budget, spent, hours)
        return
    got = budget_left(budget, spent, hours)
    for value, want in zip((got.max_usd, got.max_hours), left):
        assert value == (None if want is None else pytest.approx(want))


def test_a_relaunch_whose_first_billed_minimum_is_over_what_is_left_is_refused() -> None:
    # The issue: a $2 budget, one p5 attempt billed its 60 s minimum, the rest below another; the
    # relaunch, planned with what is left (run/recover.py _next_plan), billed one more. At today's
    # $55.04/h: $1.20, one minimum ($0.92), $0.28 left.
    from cloudtrain.catalog import default_catalog
    from cloudtrain.errors import UsageError
    from cloudtrain.plan import make_plan

    p5 = recipe(resources={"cloud": "aws", "instance_type": "p5.48xlarge", "spot": False},
                budget={"max_usd": 1.2}, recover={"max_restarts": 3})
    assert make_plan(p5, default_catalog(), ["aws"]).best.instance_type == "p5.48xlarge"  # $1.20 covers one start
    left = budget_left(p5.budget, 55.04 / 60, 0.01)
    assert left.max_usd == pytest.approx(0.28, abs=0.005)
    with pytest.raises(UsageError) as caught:
        make_plan(p5.model_copy(update={"budget": left}), default_catalog(), ["aws"])
    assert caught.value.one_line() == (
        "budget.max_usd: $0.28 left, below one billed minimum: one 60 s minimum of p5.48xlarge on aws costs $0.92 "
        "(raise budget.max_usd so that $0.92 of it is left, or choose a cheaper type)")


class _Provider:
    name = "aws"


def cluster(status: ClusterStatus, *states: str) -> Cluster:
    record = ClusterRecord(name="c", provider="aws", status=status, region="us-east-1", zone="us-east-1a",
                           instance_type="t3.medium", hourly_price=0.1, num_nodes=len(states), recipe_path=None,
                           recipe_digest=None, owner="me", created_at=0.0, updated_at=0.0, last_error=None)
    nodes = tuple(NodeRecord(cluster="c", rank=i, instance_id=f"i-{i}", state=s, public_ip=None, private_ip=None,
                             ssh_user="u", ssh_port=22, ssh_key=None, proxy_command=None, started_at=None)
                  for i, s in enumerate(states))
    return Cluster(record, nodes, _Provider())  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "states", "kind", "says"), [
    (ClusterStatus.UP, ("running",), None, None),
    (ClusterStatus.UP, ("running", "terminated"), GoneKind.LEAVING, "aws reports i-1 terminated"),
    (ClusterStatus.UP, ("stopping",), GoneKind.LEAVING, "aws reports i-0 stopping"),
    (ClusterStatus.TERMINATED, ("terminated",), GoneKind.LEAVING, "aws reports i-0 terminated"),
    (ClusterStatus.STOPPED, ("stopped",), GoneKind.LEAVING, "aws reports i-0 stopped"),
    (ClusterStatus.PROVISIONING, ("pending",), None, None),  # booting: lifecycle's, not a loss
    (ClusterStatus.UP, (), GoneKind.ENDED, "aws reports cluster up"),  # the cloud lists none of its machines
    (ClusterStatus.TERMINATED, ("pending",), GoneKind.ENDED, "aws reports cluster terminated"),
])
def test_the_one_gone_rule_reads_what_the_cloud_reported(status: ClusterStatus, states: tuple,
                                                          kind: GoneKind | None, says: str | None) -> None:
    """One rule for recovery and sweeps (run/gone.py; issue 36.1): a typed reason, the cloud's words."""
    found = judge(cluster(status, *states))
    assert (found.kind if found else None) is kind
    assert (str(found) if found else None) == says


class _Lc:
    """What `gone.ask` reads of a lifecycle: the state row, the cloud's answer (or its error)."""

    def __init__(self, row: bool, answer: Cluster | Exception) -> None:
        self.asked = 0
        self.answer = answer
        self.store = type("S", (), {"get_cluster": staticmethod(lambda name: object() if row else None)})()

    def refresh(self, name: str) -> Cluster:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_cluster_with_no_row_is_taken_down_without_asking_the_cloud() -> None:
    lc = _Lc(False, cluster(ClusterStatus.UP, "running"))
    assert ask(lc, "c", print) == Gone(GoneKind.TAKEN_DOWN, "c")  # type: ignore[arg-type]
    assert lc.asked == 0


def test_a_cloud_that_does_not_answer_is_said_and_counts_as_not_gone() -> None:
    from cloudtrain.errors import CloudtrainError

    said: list[str] = []
    lc = _Lc(True, CloudtrainError("throttled"))
    assert ask(lc, "c", said.append) is None and lc.asked == 1  # type: ignore[arg-type]
    assert said == ["could not ask the cloud about c: throttled"]


@pytest.mark.parametrize(("setup", "says"), [
    ("none", "no run 'nope'"),
    ("succeeded", "succeeded already"),
])
def test_resume_refuses_what_it_cannot_pick_up(local_cloud: Any, setup: str, says: str) -> None:
    recipe = local_cloud.recipe(run="true", recover=True)
    run_id = "nope"
    if setup == "succeeded":
        done = local_cloud.run(recipe)
        assert done.ok, done.output
        run_id = done.run_dir.name
    refused = local_cloud.cli("run", str(recipe), "--resume", run_id)
    assert refused.returncode == 2 and says in refused.stderr, refused.output
    assert len([line for line in refused.stderr.splitlines() if line.startswith("error:")]) == 1
