"""`cloud: any` picks the cheapest catalog row over the clouds whose credentials work.

Every expected answer here comes from the catalog CSVs read by this file with its own filter
(`oracle`), never from the planner: the planner must agree with a plain reading of the rows.
Three levels:
- `make_plan` (pure) over a table of requirement cases, with some clouds left out as if their
  credentials were missing;
- `plan_with_credentials` against the wire-level fakes (moto, the fake GCE, the fake ARM), with
  the credentials of some clouds taken away: the next cloud is chosen and the skipped one named;
- the `cloudtrain plan RECIPE` command as a subprocess with its own HOME and CLOUDTRAIN_HOME.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.catalog import Catalog
from cloudtrain.config import Config
from cloudtrain.errors import CredentialsError, NotAvailableError, UsageError
from cloudtrain.plan import Plan, make_plan, refused_field
from cloudtrain.recipe import Recipe
from tests.conftest import cli_as

REPO = Path(__file__).resolve().parents[1]
CATALOG_DIR = REPO / "cloudtrain" / "catalog_data"
PRICED = ("aws", "gcp", "azure")


# ---------------------------------------------------------------------------------- the oracle

@dataclass(frozen=True)
class Row:
    cloud: str
    region: str
    instance_type: str
    gpu: str  # "" for CPU-only rows
    gpus: int
    vcpus: int
    memory: float
    price: float
    spot: float | None


def read_rows(paths: Iterable[Path]) -> list[Row]:
    rows = []
    for path in paths:
        with path.open(newline="") as handle:
            for r in csv.DictReader(handle):
                if not r["price"].strip():
                    continue  # sold there, price unknown: never a placement
                rows.append(Row(r["cloud"], r["region"], r["instance_type"], r["accelerator"], int(r["accelerator_count"] or 0),
                                int(r["vcpus"]), float(r["memory_gib"]), float(r["price"]),
                                float(r["spot_price"]) if r["spot_price"].strip() else None))
    return rows


BUNDLED = read_rows(sorted(CATALOG_DIR.glob("*.csv")))
with (CATALOG_DIR / "storage" / "minimums.csv").open(newline="") as _handle:
    MINIMUM_S = {r["cloud"]: float(r["min_billed_s"]) for r in csv.DictReader(_handle)}  # billed per start, at least


def oracle(resources: Mapping[str, Any], top: Mapping[str, Any], clouds: Sequence[str],
           rows: Sequence[Row] = BUNDLED) -> list[tuple[str, str, str, float]]:
    """(cloud, region, type, price per node) of every row that fits, cheapest first; equal prices in
    cloud, region, type order (no home region is involved in these cases)."""
    cloud = resources.get("cloud", "any")
    allowed = set(clouds) if cloud == "any" else {cloud} & set(clouds)
    wanted = resources.get("accelerators")
    name, _, count = (wanted or "").partition(":")
    spot = resources.get("spot", False)
    nodes = top.get("num_nodes", 1)
    budget = top.get("budget") or {}
    fits = []
    for row in rows:
        price = row.spot if spot else row.price
        if price is None or row.cloud not in allowed:
            continue
        if "region" in resources and row.region != resources["region"]:
            continue
        if "instance_type" in resources and row.instance_type != resources["instance_type"]:
            continue
        if wanted:
            if row.gpu.lower() != name.lower() or row.gpus < int(count or 1):
                continue
            # Exactly the GPUs per node asked for, unless the recipe allows more (or names the type).
            if (row.gpus > int(count or 1) and not resources.get("allow_more_accelerators")
                    and "instance_type" not in resources):
                continue
        elif "instance_type" not in resources and row.gpu:
            continue  # no GPU asked for: never a GPU bill
        if row.vcpus < resources.get("cpus", 0) or row.memory < resources.get("memory", 0):
            continue
        if "max_hourly_usd" in resources and price > resources["max_hourly_usd"]:
            continue
        if "max_usd" in budget and "max_hours" in budget and price * nodes * budget["max_hours"] > budget["max_usd"]:
            continue
        if "max_usd" in budget and round(price * nodes * MINIMUM_S[row.cloud] / 3600, 4) > budget["max_usd"]:
            continue  # one start's billed minimum alone is over the budget
        fits.append((row.cloud, row.region, row.instance_type, price))
    return sorted(fits, key=lambda f: (f[3], f[0], f[1], f[2]))


def recipe(resources: Mapping[str, Any], top: Mapping[str, Any] | None = None) -> Recipe:
    return Recipe.model_validate({"name": "p", "run": "true", "resources": {"cloud": "any", **resources}, **(top or {})})


def candidates(p: Plan) -> list[tuple[str, str | None, str | None, float]]:
    return [(c.cloud, c.region, c.instance_type, c.hourly_price) for c in p.candidates]


def bundled_catalog() -> Catalog:
    # The bundled files only: a refreshed catalog in some home must not change these answers.
    return Catalog(files=sorted(CATALOG_DIR.glob("*.csv")))


def test_the_oracle_reads_the_catalog_the_planner_reads() -> None:
    # Guard for the oracle itself: same rows, same prices, or every comparison below is moot.
    mine = sorted((r.cloud, r.region, r.instance_type, r.price, r.spot) for r in BUNDLED)
    theirs = sorted((o.cloud, o.region, o.instance_type, o.price, o.spot_price) for o in bundled_catalog().offers
                    if o.price is not None)
    assert mine == theirs and len(mine) > 100


# ------------------------------------------------------------------ cases that get a placement

@dataclass(frozen=True)
class Case:
    id: str
    resources: dict[str, Any]
    top: dict[str, Any] = field(default_factory=dict)
    clouds: tuple[str, ...] = PRICED  # the clouds with working credentials
    best: tuple[str, str, str, float] | None = None  # a readable check on the oracle's first row


FITS = [
    Case("T4:1 cheapest of all clouds", {"accelerators": "T4:1"}, best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("T4:1 without aws", {"accelerators": "T4:1"}, clouds=("gcp", "azure"),
         best=("azure", "eastus", "Standard_NC4as_T4_v3", 0.526)),
    Case("T4:1 without aws and azure", {"accelerators": "T4:1"}, clouds=("gcp",),
         best=("gcp", "us-central1", "n1-standard-4+t4x1", 0.539999)),
    Case("T4 alone means one", {"accelerators": "T4"}, best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("gpu name in lower case", {"accelerators": "t4:1"}, best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("T4:2 only gcp has a 2-GPU type", {"accelerators": "T4:2"},
         best=("gcp", "us-central1", "n1-standard-16+t4x2", 1.459996)),
    Case("T4:2 without gcp may take aws's 4-GPU type", {"accelerators": "T4:2", "allow_more_accelerators": True},
         clouds=("aws", "azure"), best=("aws", "us-east-1", "g4dn.12xlarge", 3.912)),
    Case("T4:2 allowed more takes gcp's 2 then 4", {"accelerators": "T4:2", "allow_more_accelerators": True},
         best=("gcp", "us-central1", "n1-standard-16+t4x2", 1.459996)),
    Case("spot T4:1 keeps T4:1 on every cloud", {"accelerators": "T4:1", "spot": True},
         best=("azure", "westus2", "Standard_NC4as_T4_v3", 0.061595)),
    # Azure bills 300 s per start, AWS and GCP 60 s: $0.005 covers one minimum of a spot T4 on
    # aws and gcp ($0.0025 on gcp), not on azure ($0.0051), whose cheaper hour is then left out.
    Case("money below azure's longer minimum", {"accelerators": "T4:1", "spot": True}, {"budget": {"max_usd": 0.005}},
         best=("gcp", "us-central1", "n1-standard-4+t4x1", 0.15)),
    Case("V100 cheapest on gcp", {"accelerators": "V100"}, best=("gcp", "us-central1", "n1-standard-8+v100x1", 2.86)),
    Case("V100 without gcp", {"accelerators": "V100:1"}, clouds=("aws", "azure"),
         best=("aws", "us-east-1", "p3.2xlarge", 3.06)),
    Case("A100:1 azure and gcp", {"accelerators": "A100:1"},
         best=("azure", "eastus", "Standard_NC24ads_A100_v4", 3.673)),
    Case("A100:8 cheapest on azure", {"accelerators": "A100:8"}, best=("azure", "eastus", "Standard_ND96asr_v4", 27.197)),
    Case("A100:8 without aws", {"accelerators": "A100:8"}, clouds=("gcp", "azure"),
         best=("azure", "eastus", "Standard_ND96asr_v4", 27.197)),
    Case("L4 only gcp", {"accelerators": "L4:1"}, best=("gcp", "us-east4", "g2-standard-4", 0.70452)),
    Case("T4 with 8 vCPUs", {"accelerators": "T4:1", "cpus": 8},
         best=("gcp", "us-central1", "n1-standard-8+t4x1", 0.729998)),
    Case("T4 with 20 GiB only azure's has the memory", {"accelerators": "T4:1", "memory": 20},
         best=("azure", "eastus", "Standard_NC4as_T4_v3", 0.526)),
    Case("T4 spot", {"accelerators": "T4:1", "spot": True}, best=("azure", "westus2", "Standard_NC4as_T4_v3", 0.061595)),
    Case("T4 spot without azure", {"accelerators": "T4:1", "spot": True}, clouds=("aws", "gcp"),
         best=("gcp", "us-central1", "n1-standard-4+t4x1", 0.15)),
    Case("T4 spot on aws only", {"accelerators": "T4:1", "spot": True}, clouds=("aws",),
         best=("aws", "us-east-2", "g4dn.xlarge", 0.1578)),
    Case("region of gcp", {"accelerators": "T4:1", "region": "europe-west4"},
         best=("gcp", "europe-west4", "n1-standard-4+t4x1", 0.5592)),
    Case("region of azure", {"accelerators": "T4:1", "region": "westeurope"},
         best=("azure", "westeurope", "Standard_NC4as_T4_v3", 0.602)),
    Case("region of aws, spot", {"accelerators": "T4:1", "region": "eu-west-1", "spot": True},
         best=("aws", "eu-west-1", "g4dn.xlarge", 0.2348)),
    Case("max hourly just above the cheapest", {"accelerators": "T4:1", "max_hourly_usd": 0.527},
         best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("max hourly exactly the cheapest", {"accelerators": "T4:1", "max_hourly_usd": 0.526},
         best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("max hourly, cheapest cloud missing", {"accelerators": "T4:1", "max_hourly_usd": 0.54}, clouds=("gcp",),
         best=("gcp", "us-central1", "n1-standard-4+t4x1", 0.539999)),
    Case("spot under a price limit", {"accelerators": "T4:1", "spot": True, "max_hourly_usd": 0.15},
         best=("azure", "westus2", "Standard_NC4as_T4_v3", 0.061595)),
    Case("cpu only, smallest", {}, best=("aws", "us-east-1", "t3.medium", 0.0416)),
    Case("cpu only without aws", {}, clouds=("gcp", "azure"), best=("azure", "eastus", "Standard_B2s", 0.0416)),
    Case("4 vCPUs and 16 GiB", {"cpus": 4, "memory": 16}, best=("gcp", "us-central1", "e2-standard-4", 0.134012)),
    Case("cpu spot, no spot price left out", {"cpus": 2, "spot": True},
         best=("azure", "eastus", "Standard_D2s_v5", 0.01056)),
    Case("3 nodes", {"accelerators": "T4:1"}, {"num_nodes": 3}, best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("budget keeps what fits", {"accelerators": "T4:1"}, {"budget": {"max_usd": 5.3, "max_hours": 10}},
         best=("aws", "us-east-1", "g4dn.xlarge", 0.526)),
    Case("budget with nodes and spot", {"accelerators": "T4:1", "spot": True},
         {"num_nodes": 2, "budget": {"max_usd": 3.0, "max_hours": 10}},
         best=("azure", "westus2", "Standard_NC4as_T4_v3", 0.061595)),
    Case("budget, cheapest cloud missing", {"accelerators": "V100:1"}, {"budget": {"max_usd": 31, "max_hours": 10}},
         clouds=("aws", "azure"), best=("aws", "us-east-1", "p3.2xlarge", 3.06)),
    Case("named cloud without instance type", {"cloud": "gcp", "accelerators": "T4:1"},
         best=("gcp", "us-central1", "n1-standard-4+t4x1", 0.539999)),
    Case("named azure, gpu and memory", {"cloud": "azure", "accelerators": "T4:1", "cpus": 8},
         best=("azure", "eastus", "Standard_NC8as_T4_v3", 0.752)),
    Case("named aws, spot", {"cloud": "aws", "accelerators": "V100", "spot": True},
         best=("aws", "us-east-1", "p3.2xlarge", 0.918)),
]


@pytest.mark.parametrize("case", FITS, ids=[c.id for c in FITS])
def test_cheapest_row_of_the_usable_clouds(case: Case) -> None:
    expected = oracle(case.resources, case.top, case.clouds)
    assert expected, "the case must fit somewhere"
    assert expected[0] == case.best  # the table's readable answer agrees with the rows
    p = make_plan(recipe(case.resources, case.top), bundled_catalog(), ("local", "ssh", *case.clouds))
    # Every fitting row, in price order across clouds, and nothing else.
    assert candidates(p) == expected
    assert p.best.cloud in case.clouds
    nodes = case.top.get("num_nodes", 1)
    assert p.num_nodes == nodes and p.hourly_cost == pytest.approx(expected[0][3] * nodes)
    assert all(c.spot == case.resources.get("spot", False) for c in p.candidates)
    hours = (case.top.get("budget") or {}).get("max_hours")
    usd = (case.top.get("budget") or {}).get("max_usd")
    worst = None if not hours else max(e[3] for e in expected) * nodes * hours
    assert p.estimated_cost == (None if worst is None else pytest.approx(min(worst, usd or worst)))


def test_cross_cloud_alternatives_interleave_by_price() -> None:
    # T4:1 on-demand: aws and azure tie at 0.526, then gcp at 0.54, then aws's eu-west-1 at 0.587.
    p = make_plan(recipe({"accelerators": "T4:1"}), bundled_catalog(), PRICED)
    clouds_in_order = [c.cloud for c in p.candidates[:8]]
    assert clouds_in_order == ["aws", "aws", "aws", "azure", "azure", "gcp", "gcp", "gcp"]
    assert [c.hourly_price for c in p.candidates] == sorted(c.hourly_price for c in p.candidates)


# ------------------------------------------------------------------------------ refusals

# (id, resources, top, usable clouds, error type, text in the one-line message, field)
REFUSED = [
    ("unknown gpu suggests", {"accelerators": "T5:1"}, {}, PRICED, UsageError, "did you mean 'T4'?",
     "resources.accelerators"),
    ("unknown gpu lists them", {"accelerators": "Z9000"}, {}, PRICED, UsageError,
     "known GPUs: A10, A100, A10G, H100, H200, L4, L40S, P100, P4, T4, V100", "resources.accelerators"),
    ("max hourly just below the cheapest", {"accelerators": "T4:1", "max_hourly_usd": 0.525}, {}, PRICED,
     NotAvailableError, "the cheapest is g4dn.xlarge (T4:1) in aws/us-east-1 at $0.526/h", "resources.max_hourly_usd"),
    ("max hourly below what the usable cloud has", {"accelerators": "T4:1", "max_hourly_usd": 0.53}, {}, ("gcp",),
     NotAvailableError, "the cheapest is n1-standard-4+t4x1 (T4:1) in gcp/us-central1", "resources.max_hourly_usd"),
    ("A100:8 type on azure only: sold in westus2, price unknown",
     {"instance_type": "Standard_ND96amsr_A100_v4", "region": "westus2"}, {}, ("azure",), NotAvailableError,
     "Standard_ND96amsr_A100_v4 in westus2: price unknown "
     "(no published price in the catalog cloudtrain knows; `cloudtrain catalog refresh`)", "resources.instance_type"),
    ("A10 type on azure: sold in westeurope, price unknown",
     {"instance_type": "Standard_NV36ads_A10_v5", "region": "westeurope"}, {}, ("aws", "azure"), NotAvailableError,
     "price unknown (no published price in the catalog cloudtrain knows", "resources.instance_type"),
    ("H200 on aws: sold, price unknown", {"accelerators": "H200:8"}, {}, ("aws",), NotAvailableError,
     "H200 on aws (p5e.48xlarge): price unknown", "resources.accelerators"),
    ("a GPU no usable cloud sells", {"accelerators": "A10:1"}, {}, ("aws", "gcp"), NotAvailableError,
     "the catalog cloudtrain knows has no A10 GPUs on aws/gcp", "resources.accelerators"),
    ("T4 with too much memory", {"accelerators": "T4:1", "memory": 4096}, {}, PRICED, NotAvailableError,
     "no offer with T4:1 and 4096 GiB", "resources.memory"),
    ("region typo", {"accelerators": "T4:1", "region": "europe-west"}, {}, PRICED, UsageError,
     "did you mean 'europe-west4'?", "resources.region"),
    ("region nobody prices", {"accelerators": "T4:1", "region": "ap-south-1"}, {}, PRICED, NotAvailableError,
     "no price data for region 'ap-south-1'", "resources.region"),
    ("budget below the cheapest", {"accelerators": "T4:1"}, {"budget": {"max_usd": 5.25, "max_hours": 10}}, PRICED,
     UsageError, "costs $5.26 for 10 h, over budget.max_usd $5.25", "budget.max_usd"),
    ("T4:2 on aws and azure: no 2-GPU type", {"accelerators": "T4:2"}, {}, ("aws", "azure"), NotAvailableError,
     "no offer has exactly T4:2 per node; the nearest is g4dn.12xlarge (T4:4)", "resources.accelerators"),
    ("budget below every cloud's minimum", {"accelerators": "T4:1", "spot": True}, {"budget": {"max_usd": 0.002}},
     PRICED, UsageError, "budget.max_usd: $0.0020 left, below one billed minimum: one 60 s minimum of "
     "n1-standard-4+t4x1 on gcp costs $0.0025", "budget.max_usd"),
    ("no usable priced cloud", {"accelerators": "T4:1"}, {}, (), NotAvailableError,
     "none of the usable clouds has offers", "resources.cloud"),
]


@pytest.mark.parametrize(("case", "resources", "top", "clouds", "error", "text", "field_name"), REFUSED,
                         ids=[r[0] for r in REFUSED])
def test_refusals_say_why_in_one_line(case: str, resources: dict, top: dict, clouds: tuple, error: type, text: str,
                                      field_name: str) -> None:
    # The oracle agrees nothing fits (the unknown GPU, the region typo: no row has that name).
    assert oracle(resources, top, clouds) == []
    with pytest.raises(error) as caught:
        make_plan(recipe(resources, top), bundled_catalog(), ("local", "ssh", *clouds))
    line = caught.value.one_line()
    assert text in line and "\n" not in line
    assert refused_field(caught.value) == field_name


# ------------------------------------------------- plan_with_credentials against the fakes

@pytest.fixture
def fakes(moto_server: Any, gce_server: Any, arm_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """All three priced clouds answer (moto, fake GCE, fake ARM); `without(*clouds)` takes a cloud's
    credentials away the way a user would lack them, and returns the config to plan with."""

    class Fakes:
        def config(self, missing: Iterable[str] = ()) -> dict[str, Any]:
            missing = set(missing)
            azure = arm_server.config()
            if "azure" in missing:
                # No subscription is how `cloud: any` meets an Azure user never set up: answered
                # without a network call (a missing service principal would probe the IMDS).
                del azure["subscription_id"]
            return {"aws": {}, "gcp": gce_server.config(), "azure": azure}

        def without(self, *clouds: str) -> Config:
            for cloud in clouds:
                for name in MISSING_ENV[cloud]:
                    monkeypatch.delenv(name, raising=False)
            return Config.model_validate(self.config(clouds))

    return Fakes()


# What each cloud's default credential chain needs from the environment; without it there are none.
MISSING_ENV = {
    "aws": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "gcp": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "azure": ("AZURE_SUBSCRIPTION_ID",),
}

# (id, resources, top, clouds without credentials)
SKIPPING = [
    ("all clouds usable", {"accelerators": "T4:1"}, {}, ()),
    ("cheapest cloud aws missing", {"accelerators": "T4:1"}, {}, ("aws",)),
    ("aws and azure missing", {"accelerators": "T4:1"}, {}, ("aws", "azure")),
    ("spot, cheapest azure missing", {"accelerators": "T4:1", "spot": True}, {}, ("azure",)),
    ("V100, cheapest gcp missing, budget", {"accelerators": "V100"}, {"budget": {"max_usd": 40, "max_hours": 10}},
     ("gcp",)),
    ("cpu only, aws missing, 2 nodes", {"cpus": 2}, {"num_nodes": 2}, ("aws",)),
]


@pytest.mark.parametrize(("case", "resources", "top", "missing"), SKIPPING, ids=[s[0] for s in SKIPPING])
def test_clouds_without_credentials_are_skipped_and_named(
    fakes: Any, case: str, resources: dict, top: dict, missing: tuple[str, ...]
) -> None:
    from cloudtrain.cluster.planning import plan_with_credentials

    config = fakes.without(*missing)
    usable = plan_with_credentials(recipe(resources, top), config)
    left = tuple(c for c in PRICED if c not in missing)
    expected = oracle(resources, top, left)
    assert candidates(usable.plan) == expected
    assert {c.cloud for c in usable.plan.candidates} <= set(usable.providers) == set(left)
    assert [cloud for cloud, _ in usable.skipped] == [c for c in PRICED if c in missing]
    assert all(why for _, why in usable.skipped)
    if missing:
        # The planner's answer really moved: over every cloud it would have been elsewhere.
        assert oracle(resources, top, PRICED)[0] != expected[0]


def test_credentials_a_cloud_rejects_are_skipped_too(fakes: Any, moto_server: Any) -> None:
    from cloudtrain.cluster.planning import plan_with_credentials

    # The keys exist but AWS answers AuthFailure: as unusable as no keys at all.
    moto_server.faults.add("AuthFailure", action=None, service=None)
    usable = plan_with_credentials(recipe({"accelerators": "T4:1"}), fakes.without())
    assert candidates(usable.plan) == oracle({"accelerators": "T4:1"}, {}, ("gcp", "azure"))
    ((cloud, why),) = usable.skipped
    assert cloud == "aws" and "AuthFailure" in why


# (id, resources, clouds without credentials, text of the planner's own refusal)
ONLY_ON_SKIPPED = [
    ("L4 is priced only on aws and gcp", {"accelerators": "L4:1"}, ("aws", "gcp"), "no L4 GPUs on azure"),
    ("P100 is priced only on gcp", {"accelerators": "P100:1"}, ("gcp",), "P100"),
    ("region of azure", {"accelerators": "T4:1", "region": "eastus"}, ("azure",), "'eastus'"),
    ("price limit only aws and azure meet", {"accelerators": "T4:1", "max_hourly_usd": 0.53}, ("aws", "azure"),
     "costs $0.53/h or less"),
]


@pytest.mark.parametrize(("case", "resources", "missing", "text"), ONLY_ON_SKIPPED, ids=[c[0] for c in ONLY_ON_SKIPPED])
def test_a_refusal_names_the_clouds_skipped_for_credentials(
    fakes: Any, case: str, resources: dict, missing: tuple[str, ...], text: str
) -> None:
    """What fits only on a cloud without credentials must say so: "no region 'eastus'" alone
    would send an Azure user hunting for a typo instead of fixing their login."""
    from cloudtrain.cluster.planning import plan_with_credentials

    left = tuple(c for c in PRICED if c not in missing)
    assert oracle(resources, {}, left) == [] and oracle(resources, {}, PRICED) != []
    with pytest.raises(UsageError) as caught:
        plan_with_credentials(recipe(resources), fakes.without(*missing))
    line = caught.value.one_line()
    assert text in line and "\n" not in line
    for cloud in missing:
        assert f"{cloud}: " in line  # named, with the reason its credentials do not work
    assert "skipped for their credentials" in line
    assert "it fits on " + "/".join(missing) + ": fix the credentials" in line
    assert refused_field(caught.value) is not None  # still points at the recipe field


def test_a_refusal_that_fits_nowhere_keeps_the_planners_hint(fakes: Any) -> None:
    from cloudtrain.cluster.planning import plan_with_credentials

    with pytest.raises(NotAvailableError) as caught:
        plan_with_credentials(recipe({"accelerators": "T4:1", "memory": 4096}), fakes.without("aws"))
    line = caught.value.one_line()
    assert "no offer with T4:1 and 4096 GiB" in line and "skipped for their credentials: aws: " in line
    assert "fix the credentials" not in line  # the recipe, not a login, is what to change
    assert refused_field(caught.value) == "resources.memory"


def test_no_usable_cloud_names_every_one(fakes: Any) -> None:
    from cloudtrain.cluster.planning import plan_with_credentials

    with pytest.raises(CredentialsError) as caught:
        plan_with_credentials(recipe({"accelerators": "T4:1"}), fakes.without(*PRICED))
    line = caught.value.one_line()
    assert "no cloud has usable credentials" in line and all(f"{c}: " in line for c in PRICED)


# ------------------------------------------------------------------- the `plan` command

@dataclass
class PlanRun:
    result: subprocess.CompletedProcess
    home: Path  # CLOUDTRAIN_HOME
    workdir: Path  # where the recipe is and the CLI ran

    def rows(self) -> list[tuple[str, ...]]:
        """(cloud, region, type, $/h/node, $/h) of the table's rows, in the order shown."""
        return [(c[1], c[2], c[4], c[7], c[8]) for c in (line.split() for line in self.result.stdout.splitlines())
                if c and c[0].isdigit()]


def shown(expected: Sequence[tuple[str, str, str, float]], nodes: int = 1) -> list[tuple[str, ...]]:
    """The oracle's rows as the table prints them (prices to 4 significant digits)."""
    return [(cloud, region, kind, f"${price:.4g}", f"${price * nodes:.4g}") for cloud, region, kind, price in expected]


def run_plan(fakes: Any, tmp_path: Path, resources: dict, top: dict, missing: Sequence[str] = (),
             args: Sequence[str] = (), catalog: dict[str, str] | None = None) -> PlanRun:
    """`cloudtrain plan RECIPE` as a user runs it: its own HOME, CLOUDTRAIN_HOME and config, the
    credentials of `missing` clouds absent from its environment and config."""
    fakes.without(*missing)
    home, user_home, workdir = tmp_path / "ct", tmp_path / "home", tmp_path / "work"
    for directory in (user_home, workdir):
        directory.mkdir(parents=True)
    for name, text in (catalog or {}).items():
        (home / "catalog").mkdir(parents=True, exist_ok=True)
        (home / "catalog" / name).write_text(text)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(fakes.config(missing)))
    path = workdir / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "run": "true", "resources": {"cloud": "any", **resources}, **top}))
    env = {**os.environ, "HOME": str(user_home), "CLOUDTRAIN_HOME": str(home), "CLOUDTRAIN_CONFIG": str(config)}
    result = cli_as(env, "plan", str(path), *args, cwd=workdir, timeout=300)
    return PlanRun(result, home, workdir)


def created(run: PlanRun) -> list[str]:
    """Files `plan` left behind: it must create nothing (no state, no run dirs)."""
    ours = {run.workdir / "recipe.yaml", *run.home.glob("catalog/*.csv")}
    return sorted(str(p) for root in (run.home, run.workdir) if root.exists() for p in root.rglob("*")
                  if p.is_file() and p not in ours)


# (id, resources, top, clouds without credentials)
CLI_CASES = [
    ("T4 all clouds, hours budget", {"accelerators": "T4:1"}, {"budget": {"max_hours": 10}}, ()),
    ("T4 aws missing, money and hours", {"accelerators": "T4:1"}, {"budget": {"max_usd": 20, "max_hours": 10}},
     ("aws",)),
    ("spot, azure and gcp missing, 2 nodes, money only", {"accelerators": "T4:1", "spot": True},
     {"num_nodes": 2, "budget": {"max_usd": 1}}, ("azure", "gcp")),
    ("V100 no budget", {"accelerators": "V100"}, {}, ()),
]


@pytest.mark.parametrize(("case", "resources", "top", "missing"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_plan_command_shows_price_alternatives_and_worst_case(
    fakes: Any, tmp_path: Path, case: str, resources: dict, top: dict, missing: tuple[str, ...]
) -> None:
    run = run_plan(fakes, tmp_path, resources, top, missing)
    assert run.result.returncode == 0, run.result.stderr
    left = tuple(c for c in PRICED if c not in missing)
    expected = oracle(resources, top, left)
    best = expected[0]
    nodes = top.get("num_nodes", 1)
    out = run.result.stdout
    # The best placement and its hourly price, then the next alternatives (-n 5: six rows) by price.
    assert f"plan: {f'{nodes} x ' if nodes > 1 else ''}{best[2]} " in out
    assert f"in {best[0]}/{best[1]} at ${best[3]:.4g}/h" in out
    assert run.rows() == shown(expected[:6], nodes)
    assert f"... and {len(expected) - 6} more placement(s)" in out
    budget = top.get("budget", {})
    hourly = best[3] * nodes
    if "max_hours" in budget:
        # At the dearest placement failover may use, never above max_usd.
        worst = max(e[3] for e in expected) * nodes * budget["max_hours"]
        worst = min(worst, budget.get("max_usd", worst))
        assert f"worst case: ${worst:.2f} (" in out
    elif "max_usd" in budget:
        assert f"budget ${budget['max_usd']:g} lasts {budget['max_usd'] / hourly:.1f} h at ${hourly:.4g}/h" in out
    else:
        assert "no budget set" in out
    skipped = [line.split(":")[1].split()[-1] for line in run.result.stderr.splitlines() if "skipping" in line]
    assert sorted(skipped) == sorted(missing)  # each cloud without credentials named, and only those
    assert created(run) == []


def test_plan_json_lists_every_candidate_and_the_skipped_clouds(fakes: Any, tmp_path: Path) -> None:
    top = {"num_nodes": 2, "budget": {"max_usd": 40, "max_hours": 10}}
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1"}, top, ("aws",), args=("--json",))
    assert run.result.returncode == 0, run.result.stderr
    data = json.loads(run.result.stdout)
    expected = oracle({"accelerators": "T4:1"}, top, ("gcp", "azure"))
    assert [(c["cloud"], c["region"], c["instance_type"], c["hourly_price"]) for c in data["candidates"]] == expected
    assert data["best"] == data["candidates"][0]
    assert data["hourly_usd"] == pytest.approx(expected[0][3] * 2)
    assert data["worst_case_usd"] == pytest.approx(min(max(e[3] for e in expected) * 2 * 10, 40))
    assert data["worst_hourly_usd"] == pytest.approx(max(e[3] for e in expected) * 2)
    assert [s["cloud"] for s in data["skipped"]] == ["aws"] and data["skipped"][0]["why"]
    assert created(run) == []


CHEAP_GCP = (  # a refreshed, dated row: it replaces the bundled (undated) row of that type there
    "cloud,region,zone,instance_type,accelerator,accelerator_count,vcpus,memory_gib,price,spot_price,gpu_memory_gib,"
    "price_date\ngcp,us-central1,,n1-standard-4+t4x1,T4,1,4,15,0.41,0.12,16,2026-12-01\n"
)


def test_plan_says_failover_keeps_the_gpu_count_and_what_the_budget_left_out(fakes: Any, tmp_path: Path) -> None:
    resources, top = {"accelerators": "T4:1", "spot": True}, {"budget": {"max_usd": 0.01}}
    run = run_plan(fakes, tmp_path, resources, top, args=("-n", "100"))
    assert run.result.returncode == 0, run.result.stderr
    expected = oracle(resources, top, PRICED)
    assert run.rows() == shown(expected) and all("T4:4" not in line for line in run.result.stdout.splitlines())
    out = run.result.stdout
    assert "failover keeps T4:1 per node: " in out and "`resources.allow_more_accelerators: true` allows them" in out
    assert "placement(s) left out: one billed minimum there costs more than budget.max_usd $0.0100" in out
    data = json.loads(run_plan(fakes, tmp_path / "json", resources, top, args=("--json",)).result.stdout)
    assert [n.split(":")[0] for n in data["notes"]] == ["failover keeps T4", "budget"]


def test_plan_refuses_a_budget_below_one_billed_minimum_in_one_line_and_exits_2(fakes: Any, tmp_path: Path) -> None:
    # The p5: 60 s at $55.04/h is $0.92, over a $0.50 budget.
    run = run_plan(fakes, tmp_path, {"cloud": "aws", "accelerators": "H100:8"}, {"budget": {"max_usd": 0.5}})
    assert run.result.returncode == 2 and run.result.stdout == ""
    (line,) = run.result.stderr.strip().splitlines()
    assert "recipe.yaml:" in line and "budget.max_usd: $0.50 left, below one billed minimum: one 60 s minimum of " \
        "p5.48xlarge on aws " in line
    assert "costs $0.92 (raise budget.max_usd so that $0.92 of it is left, or choose a cheaper type)" in line
    assert created(run) == []


@pytest.mark.parametrize("missing", [(), ("gcp",)], ids=["refreshed gcp row wins", "without gcp, the next"])
def test_plan_reads_the_users_refreshed_catalog(fakes: Any, tmp_path: Path, missing: tuple[str, ...]) -> None:
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1"}, {}, missing, catalog={"gcp.csv": CHEAP_GCP})
    assert run.result.returncode == 0, run.result.stderr
    override = read_rows([run.home / "catalog" / "gcp.csv"])
    replaced = {(r.cloud, r.region, r.instance_type) for r in override}
    rows = [r for r in BUNDLED if (r.cloud, r.region, r.instance_type) not in replaced] + override
    expected = oracle({"accelerators": "T4:1"}, {}, tuple(c for c in PRICED if c not in missing), rows)
    assert run.rows() == shown(expected[:6])
    assert expected[0][0] == ("aws" if missing else "gcp")
    assert created(run) == []


def test_plan_refusal_names_the_skipped_cloud_and_exits_2(fakes: Any, tmp_path: Path) -> None:
    # H200:8 is priced only on gcp; aws sells it without a known price (A100:8, the case before
    # Azure's A100 rows were priced, now fits on azure).
    run = run_plan(fakes, tmp_path, {"accelerators": "H200:8"}, {}, ("gcp",))
    assert run.result.returncode == 2
    assert "H200 on aws (p5e.48xlarge)" in run.result.stderr and "price unknown" in run.result.stderr
    assert "skipped for their credentials: gcp: " in run.result.stderr
    assert "cloudtrain check gcp" in run.result.stderr
    assert created(run) == []


@pytest.mark.parametrize(("resources", "clouds"), [({"accelerators": "T4:1"}, PRICED),
                                                   ({"cloud": "gcp", "accelerators": "T4:1"}, ("gcp",))],
                         ids=["any", "one named cloud"])
def test_plan_without_any_credentials_shows_the_catalogs_answer_and_exits_2(
    fakes: Any, tmp_path: Path, resources: dict, clouds: tuple[str, ...]
) -> None:
    # Pricing a recipe must not wait on a login: the catalog's plan is shown, marked as unlaunchable.
    run = run_plan(fakes, tmp_path, resources, {"budget": {"max_hours": 4}}, PRICED)
    assert run.result.returncode == 2
    assert "catalog only" in run.result.stdout and "nothing here can launch" in run.result.stdout
    expected = oracle({k: v for k, v in resources.items() if k != "cloud"}, {"budget": {"max_hours": 4}}, clouds)
    assert run.rows() == shown(expected[:6])
    assert f"worst case: ${max(e[3] for e in expected) * 4:.2f}" in run.result.stdout
    assert run.result.stderr.count("error:") == 1 and "credentials" in run.result.stderr
    assert created(run) == []


def test_plan_json_without_any_credentials_is_still_one_document(fakes: Any, tmp_path: Path) -> None:
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1"}, {"budget": {"max_hours": 4}}, PRICED, args=("--json",))
    assert run.result.returncode == 2
    data = json.loads(run.result.stdout)
    expected = oracle({"accelerators": "T4:1"}, {"budget": {"max_hours": 4}}, PRICED)
    assert data["catalog_only"] is True and "credentials" in data["error"]
    assert [(c["cloud"], c["region"], c["instance_type"], c["hourly_price"]) for c in data["candidates"]] == expected
    assert data["worst_case_usd"] == pytest.approx(max(e[3] for e in expected) * 4)
    assert run.result.stderr.count("error:") == 1
    assert created(run) == []


def test_plan_without_credentials_and_no_fitting_offer_shows_only_the_recipe_mistake(fakes: Any, tmp_path: Path) -> None:
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1", "memory": 4096}, {}, PRICED)
    assert run.result.returncode == 2 and "catalog only" not in run.result.stdout
    # The recipe is what to fix first: no login would make it fit.
    assert "resources.memory: no offer with T4:1 and 4096 GiB" in run.result.stderr
    assert run.result.stderr.count("error:") == 1


@pytest.mark.parametrize(("shown_rows", "count"), [("0", 1), ("2", 3)])
def test_plan_alternatives_flag_sets_how_many_fallbacks(fakes: Any, tmp_path: Path, shown_rows: str, count: int) -> None:
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1"}, {}, args=("-n", shown_rows))
    assert run.result.returncode == 0, run.result.stderr
    expected = oracle({"accelerators": "T4:1"}, {}, PRICED)
    assert run.rows() == shown(expected[:count])
    assert f"... and {len(expected) - count} more placement(s)" in run.result.stdout


def test_plan_refuses_a_negative_number_of_alternatives(fakes: Any, tmp_path: Path) -> None:
    # -n -1 once sliced the list from the end: a table without the best row.
    run = run_plan(fakes, tmp_path, {"accelerators": "T4:1"}, {}, args=("-n", "-1"))
    assert run.result.returncode == 2 and "-1" in run.result.stderr and "plan:" not in run.result.stdout
