"""make_plan: a pure function from recipe + catalog to placements in price order."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from cloudtrain import paths
from cloudtrain.catalog import Catalog, default_catalog
from cloudtrain.errors import NotAvailableError, UsageError
from cloudtrain.plan import Placement, Plan, make_plan, refused_field
from cloudtrain.recipe import Recipe, load_recipe

pytestmark = pytest.mark.quick

CLOUDS = ("local", "ssh", "aws")


def recipe(resources: dict[str, Any], **top: Any) -> Recipe:
    return Recipe.model_validate({"name": "p", "run": "true", "resources": {"cloud": "aws", **resources}, **top})


def plan(resources: dict[str, Any], catalog: Catalog | None = None, **top: Any) -> Plan:
    default_region = top.pop("default_region", None)
    return make_plan(recipe(resources, **top), catalog or default_catalog(), CLOUDS, default_region=default_region)


def where(p: Plan) -> list[tuple[str | None, str | None, float]]:
    return [(c.region, c.instance_type, c.hourly_price) for c in p.candidates]


# (case, resources, extra recipe fields, best (region, type, price per node), hourly cost of the cluster)
CHEAPEST = [
    ("one T4", {"accelerators": "T4:1"}, {}, ("us-east-1", "g4dn.xlarge", 0.526), 0.526),
    ("gpu name in any case", {"accelerators": "a10g"}, {}, ("us-east-1", "g5.xlarge", 1.006), 1.006),
    ("two T4 may take the 4-GPU type", {"accelerators": "T4:2", "allow_more_accelerators": True}, {},
     ("us-east-1", "g4dn.12xlarge", 3.912), 3.912),
    ("T4 with 8 vCPUs", {"accelerators": "T4:1", "cpus": 8}, {}, ("us-east-1", "g4dn.2xlarge", 0.752), 0.752),
    ("instance type given", {"instance_type": "p3.2xlarge"}, {}, ("us-east-1", "p3.2xlarge", 3.06), 3.06),
    ("type and matching gpu", {"instance_type": "g5.xlarge", "accelerators": "A10G:1"}, {}, ("us-east-1", "g5.xlarge", 1.006), 1.006),
    ("region given", {"accelerators": "T4:1", "region": "eu-west-1"}, {}, ("eu-west-1", "g4dn.xlarge", 0.587), 0.587),
    ("cpu only, smallest", {}, {}, ("us-east-1", "t3.medium", 0.0416), 0.0416),
    ("cpu by vcpus", {"cpus": 4}, {}, ("us-east-1", "c5.xlarge", 0.17), 0.17),
    ("cpu by memory", {"memory": 8}, {}, ("us-east-1", "m5.large", 0.096), 0.096),
    ("spot price", {"accelerators": "T4:1", "spot": True}, {}, ("us-east-2", "g4dn.xlarge", 0.1578), 0.1578),
    ("nodes multiply", {"accelerators": "T4:1"}, {"num_nodes": 3}, ("us-east-1", "g4dn.xlarge", 0.526), 1.578),
    ("tie goes to home region", {"accelerators": "T4:1"}, {"default_region": "us-west-2"}, ("us-west-2", "g4dn.xlarge", 0.526), 0.526),
]


@pytest.mark.parametrize(("case", "resources", "top", "best", "hourly"), CHEAPEST, ids=[c[0] for c in CHEAPEST])
def test_cheapest_fitting_offer(case: str, resources: dict, top: dict, best: tuple, hourly: float) -> None:
    p = plan(resources, **top)
    assert (p.best.region, p.best.instance_type, p.best.hourly_price) == best
    assert p.hourly_cost == pytest.approx(hourly)
    assert p.cloud == "aws" and p.best.cloud == "aws"
    assert [c.hourly_price for c in p.candidates] == sorted(c.hourly_price for c in p.candidates)


def test_candidates_fail_over_across_regions_then_bigger_types_in_price_order() -> None:
    p = plan({"accelerators": "T4:1", "allow_more_accelerators": True})
    assert where(p)[:6] == [
        ("us-east-1", "g4dn.xlarge", 0.526),
        ("us-east-2", "g4dn.xlarge", 0.526),
        ("us-west-2", "g4dn.xlarge", 0.526),
        ("eu-west-1", "g4dn.xlarge", 0.587),
        ("us-east-1", "g4dn.2xlarge", 0.752),
        ("us-east-2", "g4dn.2xlarge", 0.752),
    ]
    assert len(p.candidates) == 28  # 7 T4 types x 4 regions; each one is a distinct placement
    assert all(c.zone is None and not c.spot and c.accelerators in ("T4:1", "T4:4", "T4:8") for c in p.candidates)
    # T4:4 (g4dn.12xlarge) sits between the T4:1 sizes by price; g4dn.metal (T4:8) is the dearest.
    assert {c.accelerators for c in p.candidates} == {"T4:1", "T4:4", "T4:8"}


@pytest.mark.parametrize("spot", [True, False])
def test_failover_keeps_the_gpu_count_the_recipe_asked_for(spot: bool) -> None:
    # The issue: spot T4:1 failed over to g4dn.12xlarge (T4:4) at 7-9x the price.
    p = plan({"accelerators": "T4:1", "spot": spot})
    assert p.candidates and all(c.accelerators == "T4:1" for c in p.candidates)
    assert "g4dn.12xlarge" not in {c.instance_type for c in p.candidates}
    # The worst case is the dearest T4:1 type (g4dn.16xlarge, priced since 2026-11-28), never a T4:4.
    assert p.worst_hourly_cost == max(c.hourly_price for c in p.candidates)
    (note,) = p.notes  # and `plan` says what failover may not do, and how to allow it
    assert note.startswith("failover keeps T4:1 per node:") and "g4dn.12xlarge, T4:4" in note
    assert "resources.allow_more_accelerators: true" in note
    allowed = plan({"accelerators": "T4:1", "spot": spot, "allow_more_accelerators": True})
    assert {c.accelerators for c in allowed.candidates} == {"T4:1", "T4:4", "T4:8"}
    (note,) = allowed.notes
    assert "failover may move to more GPUs per node than T4:1" in note and "g4dn.metal (T4:8)" in note


def test_an_instance_type_says_nothing_about_gpu_failover() -> None:
    # The type is the recipe's own choice, and failover never changes it.
    assert plan({"instance_type": "g4dn.12xlarge", "accelerators": "T4:1"}).notes == ()


def test_allow_more_accelerators_needs_accelerators() -> None:
    with pytest.raises(ValueError, match="'allow_more_accelerators' needs 'accelerators'"):
        recipe({"allow_more_accelerators": True})


def test_spot_candidates_follow_spot_prices() -> None:
    p = plan({"instance_type": "g4dn.xlarge", "spot": True})
    assert where(p) == [
        ("us-east-2", "g4dn.xlarge", 0.1578),
        ("us-west-2", "g4dn.xlarge", 0.1836),
        ("us-east-1", "g4dn.xlarge", 0.2104),
        ("eu-west-1", "g4dn.xlarge", 0.2348),
    ]
    assert all(c.spot for c in p.candidates) and p.spot


def test_zone_is_carried_into_every_candidate() -> None:
    p = plan({"instance_type": "g4dn.xlarge", "region": "us-east-1", "zone": "us-east-1c"})
    assert [(c.region, c.zone) for c in p.candidates] == [("us-east-1", "us-east-1c")]


# (case, resources, extra recipe fields, error type, text the one-line message must contain)
REFUSED = [
    ("unknown gpu", {"accelerators": "T5:1"}, {}, UsageError, "did you mean 'T4'?"),
    ("unknown gpu, no close name", {"accelerators": "Z9000"}, {}, UsageError, "known GPUs: A10, A100, A10G, H100, H200, L4, L40S, P100, P4, T4, V100"),
    ("too many gpus per node", {"accelerators": "H100:16"}, {}, NotAvailableError, "at most H100:8"),
    ("gpu not in region", {"accelerators": "H100:8", "region": "eu-west-1"}, {}, NotAvailableError, "offered in us-east-1, us-east-2, us-west-2"),
    ("unknown type", {"instance_type": "g4dn.xlarg"}, {}, UsageError, "did you mean 'g4dn.xlarge'?"),
    ("type not in region", {"instance_type": "p5.48xlarge", "region": "eu-west-1"}, {}, NotAvailableError, "no offer of p5.48xlarge in eu-west-1"),
    ("type and gpu disagree", {"instance_type": "g4dn.xlarge", "accelerators": "A100:1"}, {}, UsageError, "has T4:1"),
    ("type too small", {"instance_type": "t3.medium", "cpus": 8}, {}, UsageError, "2 vCPUs"),
    ("region typo", {"accelerators": "T4:1", "region": "us-east1"}, {}, UsageError, "did you mean 'us-east-1'?"),
    ("region without prices", {"accelerators": "T4:1", "region": "ap-south-1"}, {}, NotAvailableError, "catalog covers"),
    ("cpu too big", {"cpus": 512}, {}, NotAvailableError, "no CPU offer with 512 vCPUs"),
    ("cloud not available", {"cloud": "gcp", "accelerators": "T4:1"}, {}, NotAvailableError, "'gcp' is not available yet"),
    ("ami without region or home", {"accelerators": "T4:1", "image": "ami-0123456789abcdef0"}, {}, UsageError, "set resources.region"),
    ("no type with exactly that many gpus", {"accelerators": "T4:2"}, {}, NotAvailableError,
     "no offer has exactly T4:2 per node; the nearest is g4dn.12xlarge (T4:4) at $3.912/h "
     "(ask for T4:4, or set resources.allow_more_accelerators: true)"),
    # The issue: a budget below one 60 s minimum of a p5 launched without a word ($55.04/h: $0.92 now).
    ("budget below one billed minimum", {"accelerators": "H100:8"}, {"budget": {"max_usd": 0.5}}, UsageError,
     "budget.max_usd: $0.50 left, below one billed minimum: one 60 s minimum of p5.48xlarge on aws costs $0.92 "
     "(raise budget.max_usd so that $0.92 of it is left, or choose a cheaper type)"),
    ("budget below the minimum of every node", {"accelerators": "T4:1"},
     {"num_nodes": 4, "budget": {"max_usd": 0.03}}, UsageError,
     "one 60 s minimum of g4dn.xlarge on aws x 4 nodes costs $0.0351"),
    (
        "budget refused",
        {"accelerators": "T4:1"},
        {"budget": {"max_usd": 5, "max_hours": 10}},
        UsageError,
        "costs $5.26 for 10 h, over budget.max_usd $5.00",
    ),
    (
        "budget counts every node",
        {"accelerators": "T4:1", "spot": True},
        {"num_nodes": 4, "budget": {"max_usd": 5, "max_hours": 10}},
        UsageError,
        "x 4 nodes, costs $6.31",
    ),
]


@pytest.mark.parametrize(("case", "resources", "top", "error", "text"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refusals_are_one_clear_line(case: str, resources: dict, top: dict, error: type, text: str) -> None:
    with pytest.raises(error) as caught:
        plan(resources, **top)
    line = caught.value.one_line()
    assert text in line and "\n" not in line


# Which recipe field each refusal is about, so `validate` can point at its file:line.
REFUSED_FIELD = {
    "unknown gpu": "resources.accelerators",
    "unknown gpu, no close name": "resources.accelerators",
    "too many gpus per node": "resources.accelerators",
    "gpu not in region": "resources.region",
    "unknown type": "resources.instance_type",
    "type not in region": "resources.instance_type",
    "type and gpu disagree": "resources.accelerators",
    "type too small": "resources.cpus",
    "region typo": "resources.region",
    "region without prices": "resources.region",
    "cpu too big": "resources.cpus",
    "cloud not available": "resources.cloud",
    "ami without region or home": "resources.image",
    "budget refused": "budget.max_usd",
    "no type with exactly that many gpus": "resources.accelerators",
    "budget below one billed minimum": "budget.max_usd",
    "budget below the minimum of every node": "budget.max_usd",
    "budget counts every node": "budget.max_usd",
}


@pytest.mark.parametrize(("case", "resources", "top", "error", "text"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refusals_name_the_recipe_field(case: str, resources: dict, top: dict, error: type, text: str) -> None:
    with pytest.raises(error) as caught:
        plan(resources, **top)
    assert refused_field(caught.value) == REFUSED_FIELD[case]


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"instance_type": "g5.xlarge", "memory": 64}, "resources.memory"),
        ({"accelerators": "T4:1", "memory": 1024}, "resources.memory"),
        ({"accelerators": "T4:1", "cpus": 128}, "resources.cpus"),  # more than any T4 type (g4dn.metal: 96)
        ({"memory": 100000}, "resources.memory"),
    ],
)
def test_size_refusals_name_the_size_field(resources: dict, field: str) -> None:
    with pytest.raises(UsageError) as caught:
        plan(resources)
    assert refused_field(caught.value) == field


def test_errors_from_elsewhere_name_no_field() -> None:
    assert refused_field(UsageError("x")) is None and refused_field(ValueError("x")) is None


def test_summary_states_the_cluster_price_only_for_several_nodes() -> None:
    assert plan({"accelerators": "T4:1"}).summary() == "g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h"
    assert plan({"accelerators": "T4:1"}, num_nodes=2).summary() == (
        "2 x g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h = $1.052/h"
    )


def test_budget_keeps_only_affordable_candidates() -> None:
    p = plan({"instance_type": "g4dn.xlarge", "spot": True}, budget={"max_usd": 2, "max_hours": 10})
    assert [c.region for c in p.candidates] == ["us-east-2", "us-west-2"]  # 1.58 and 1.84; the rest exceed $2
    # The worst case is at the dearest placement failover may use (us-west-2), not the first.
    assert p.estimated_cost == pytest.approx(1.84, abs=0.01)
    assert p.affordable_hours == pytest.approx(2 / 0.1578)
    assert "at most $1.84 for 10 h" in p.summary()


def test_a_budget_that_covers_one_minimum_fits() -> None:
    p = plan({"accelerators": "H100:8"}, budget={"max_usd": 0.92})  # 60 s at $55.04/h: $0.9173
    assert p.best.instance_type == "p5.48xlarge" and p.notes == ()


def test_a_worst_case_shorter_than_the_minimum_is_billed_the_minimum() -> None:
    p = plan({"instance_type": "p5.48xlarge", "region": "us-east-1"}, budget={"max_hours": 0.005})  # 18 s
    assert p.estimated_cost == pytest.approx(55.04 / 60)


def test_money_limit_without_hours_gives_a_runway() -> None:
    p = plan({"accelerators": "T4:1"}, budget={"max_usd": 1.052})
    assert p.estimated_cost is None and p.affordable_hours == pytest.approx(2.0)


@pytest.mark.parametrize("cloud", ["local", "ssh"])
def test_local_and_ssh_plans_are_free(cloud: str) -> None:
    resources = {"cloud": cloud}
    if cloud == "ssh":
        resources["hosts"] = [{"address": "10.0.0.5"}, {"address": "10.0.0.6"}]
    p = plan(resources, num_nodes=2, budget={"max_usd": 0.01, "max_hours": 100})
    assert p.candidates == (Placement(cloud, None, None, None, 0.0, False),)
    assert (p.hourly_cost, p.estimated_cost, p.affordable_hours) == (0.0, 0.0, None)
    assert "$0/h" in p.summary()


def test_ami_id_pins_the_plan_to_the_home_region() -> None:
    p = plan({"accelerators": "T4:1", "image": "ami-0123456789abcdef0"}, default_region="eu-west-1")
    assert {c.region for c in p.candidates} == {"eu-west-1"}


def test_any_cloud_plans_over_the_priced_clouds_given() -> None:
    p = plan({"cloud": "any", "accelerators": "T4:1"})
    assert p.best.cloud == "aws"
    with pytest.raises(NotAvailableError, match="cloud any"):
        make_plan(recipe({"cloud": "any"}), default_catalog(), ("local",))


def test_plan_is_pure_and_frozen() -> None:
    r = recipe({"accelerators": "T4:1"})
    first = make_plan(r, default_catalog(), CLOUDS)
    assert make_plan(r, default_catalog(), CLOUDS) == first
    with pytest.raises(FrozenInstanceError):
        first.best.hourly_price = 0  # type: ignore[misc]
    assert "g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h" in first.summary()


@pytest.mark.parametrize(
    ("name", "best"),
    [
        ("mnist-aws-t4.yaml", ("us-east-1", "g4dn.xlarge", False)),
        ("mnist-aws-spot.yaml", ("us-east-2", "g4dn.xlarge", True)),
    ],
)
def test_bundled_aws_recipes_plan(name: str, best: tuple) -> None:
    loaded = load_recipe(paths.recipes_dir() / name, env={})
    assert loaded.recipe.job is not None and loaded.recipe.job.params == {"epochs": 3}
    p = make_plan(loaded.recipe, default_catalog(), CLOUDS)
    assert (p.best.region, p.best.instance_type, p.best.spot) == best
    assert p.best.accelerators == "T4:1"


def _placements(*prices: float) -> tuple[Placement, ...]:
    return tuple(Placement("aws", f"r{i}", None, "g4dn.xlarge", price, False) for i, price in enumerate(prices))


@pytest.mark.parametrize(("prices", "nodes", "max_hours", "max_usd", "worst"), [
    ((0.1452, 0.55), 1, 3, None, 1.65),      # the case: failover may reach $0.55/h
    ((0.1452,), 1, 3, None, 0.4356),         # one placement: its price
    ((0.2, 0.3, 0.25), 2, 1, None, 0.6),     # the dearest, for every node
    ((0.2, 0.5), 1, 10, 2.0, 2.0),           # never above budget.max_usd, which the node enforces
    ((0.2, 0.5), 1, None, 2.0, None),        # no hours: a runway, not a worst case
])
def test_the_worst_case_is_over_every_placement_failover_may_use(
    prices: tuple[float, ...], nodes: int, max_hours: float | None, max_usd: float | None, worst: float | None
) -> None:
    p = Plan("aws", nodes, False, _placements(*prices), max_usd=max_usd, max_hours=max_hours)
    assert p.worst_hourly_cost == pytest.approx(max(prices) * nodes)
    assert p.estimated_cost == (None if worst is None else pytest.approx(worst))


def _data(region: str, size_gb: float | None = None, source: str = "s3://bkt-data/set") -> list[dict]:
    entry: dict[str, Any] = {"source": source, "target": "d", "region": region}
    if size_gb is not None:
        entry["size_gb"] = size_gb
    return [entry]


# (case, resources, extra recipe fields, best region): the data's transfer is part of the price.
NEXT_TO_DATA = [
    # Equal prices: the data's region wins, even over the user's own region.
    ("tie goes to the data", {"accelerators": "T4:1"}, {"data": _data("us-west-2")}, "us-west-2"),
    ("data before home region", {"accelerators": "T4:1"},
     {"data": _data("us-west-2"), "default_region": "us-east-2"}, "us-west-2"),
    # 1 TB at $0.02/GB ($20) outweighs 10 h at $0.061/h more in eu-west-1.
    ("big data moves the run", {"accelerators": "T4:1"},
     {"data": _data("eu-west-1", 1000), "budget": {"max_hours": 10}}, "eu-west-1"),
    # 10 GB ($0.20) does not: the cheaper region stays first.
    ("small data does not", {"accelerators": "T4:1"},
     {"data": _data("eu-west-1", 10), "budget": {"max_hours": 10}}, "us-east-1"),
    # Without a bounded length the hourly price decides; the data only breaks ties.
    ("no max_hours: price first", {"accelerators": "T4:1"}, {"data": _data("eu-west-1", 1000)}, "us-east-1"),
    # Another cloud's store is internet egress from every region alike: no preference.
    ("other cloud's store", {"accelerators": "T4:1"},
     {"data": _data("us-central1", 1000, "gs://bkt-data/set"), "budget": {"max_hours": 10}}, "us-east-1"),
]


@pytest.mark.parametrize(("case", "resources", "top", "region"), NEXT_TO_DATA, ids=[c[0] for c in NEXT_TO_DATA])
def test_the_plan_prefers_regions_next_to_the_data(case: str, resources: dict, top: dict, region: str) -> None:
    p = plan(resources, **top)
    assert p.best.region == region
    assert len(p.candidates) == len(plan(resources).candidates)  # an order, never a filter
