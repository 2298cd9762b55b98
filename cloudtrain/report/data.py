"""What the report shows, gathered from the functions behind `cost --json`, `status --json`,
`sweep status --json` and `gc` (never a second computation of a number they print)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.report.series import Daily, Point, cumulative, daily
from cloudtrain.state import BillingRecord, ClusterStatus, StateStore

# Runs the report lists at most (newest first); past that the file would outgrow a browser tab.
RUN_LIMIT = 20_000
# Metric columns of the runs table: the ones most runs report, at most this many.
METRIC_COLUMNS = 8
NO_OWNER = "not recorded (cluster gone)"


@dataclass(frozen=True)
class RunRow:
    id: str
    cluster: str
    cloud: str | None
    status: str
    started_at: float
    duration_s: float | None
    cost_usd: float
    run_dir: str | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class Budget:
    """A live cluster's recipe budget, as its watchdog counts it (run/watchdog.py)."""

    cluster: str
    why: str
    limit_s: float
    used_s: float
    hourly_usd: float

    @property
    def left_s(self) -> float:
        return max(0.0, self.limit_s - self.used_s)


@dataclass(frozen=True)
class Billing:
    """A cluster in state with something billing now: the ledger's open intervals' $/h."""

    cluster: str
    cloud: str
    status: str
    owner: str
    nodes: int
    instance_type: str | None
    compute_usd_h: float
    disk_usd_h: float


@dataclass(frozen=True)
class SweepView:
    detail: dict[str, Any]  # sweep_detail(): what `sweep status ID --json` prints
    spec: Any  # SweepSpec
    spend: list[Point]  # the sweep's VMs' running total over time


@dataclass(frozen=True)
class ReportData:
    at: float
    since: float
    cost: Any  # cli.cost.CostSummary
    clusters: list[Any]  # ClusterRecord: the rows `status --json` prints
    by_cloud: Daily
    by_cluster: Daily
    by_owner: Daily
    billing: list[Billing]
    budgets: list[Budget]
    runs: list[RunRow]
    metric_names: list[str]
    sweeps: list[SweepView]
    comparison: list[Any]  # compare.CompareRow of the bundled job's runs
    leaks: Any = None  # cli.gc.Scan, with --gc
    problems: list[str] = field(default_factory=list)  # clusters whose cloud could not be asked


def gather(store: StateStore, since: float, now: float, leaks: Any = None,
           problems: list[str] | None = None) -> ReportData:
    from cloudtrain.cli.cluster import status_view
    from cloudtrain.cluster.spend_report import cost_summary

    # A run whose `cloudtrain run` died is shown abandoned, by the rule (and the write) `status` applies.
    status_view(store, run_limit=RUN_LIMIT)
    clusters = store.list_clusters()
    cost = cost_summary(store, since, now, run_limit=RUN_LIMIT)
    owners = {c.uid: c.owner for c in clusters if c.uid}
    intervals = store.billing(since=since)  # the rows cost's by_incarnation sums

    def owner(item: BillingRecord) -> str:
        return owners.get(item.incarnation or "", NO_OWNER)

    runs, names = _runs(cost.runs, now)
    problems = list(problems or [])
    return ReportData(
        at=now, since=since, cost=cost, clusters=clusters,
        by_cloud=daily(intervals, since, now, lambda i: i.cloud),
        by_cluster=daily(intervals, since, now, lambda i: i.cluster).top(7),
        by_owner=daily(intervals, since, now, owner),
        billing=_billing(store, clusters), budgets=_budgets(store, clusters), runs=runs, metric_names=names,
        sweeps=_sweeps(store, now), comparison=_comparison(runs, problems), leaks=leaks, problems=problems)


def _billing(store: StateStore, clusters: list[Any]) -> list[Billing]:
    found = []
    for c in clusters:
        open_ = store.open_billing(c.uid) if c.uid else []
        if not open_ and c.status not in (ClusterStatus.UP, ClusterStatus.STOPPED):
            continue
        compute = sum(i.hourly_price for i in open_ if i.kind == "running")
        disk = sum(i.hourly_price for i in open_ if i.kind != "running")
        found.append(Billing(c.name, c.provider, c.status, c.owner, c.num_nodes, c.instance_type, compute, disk))
    return found


def _budgets(store: StateStore, clusters: list[Any]) -> list[Budget]:
    """Live clusters whose recipe (still on disk) sets a budget: its limit and what the watchdog
    counts as used (budget_limit and running_seconds, the functions the watchdog is set with)."""
    found = []
    for c in clusters:
        if c.status not in (ClusterStatus.UP, ClusterStatus.STOPPED) or not c.recipe_path:
            continue
        if not Path(c.recipe_path).is_file():
            continue
        from cloudtrain.budget import budget_limit
        from cloudtrain.errors import CloudtrainError
        from cloudtrain.recipe import load_recipe
        from cloudtrain.run.watchdog import running_seconds

        try:
            recipe = load_recipe(c.recipe_path, defer_paths=True).recipe
        except CloudtrainError:
            continue  # an edited, now invalid recipe: no budget to show, the rest of the report stands
        limit = budget_limit(recipe.budget, c.hourly_price)
        if limit is not None:
            found.append(Budget(c.name, limit[1], limit[0], running_seconds(store, c.name), c.hourly_price))
    return found


def _runs(records: list[Any], now: float) -> tuple[list[RunRow], list[str]]:
    rows = []
    counts: dict[str, int] = {}
    for r in records:
        metrics = read_metrics(r.run_dir) if r.run_dir else {}
        for name in metrics:
            counts[name] = counts.get(name, 0) + 1
        end = r.ended_at if r.ended_at is not None else (now if r.status == "running" else None)
        rows.append(RunRow(r.id, r.cluster, r.provider, r.status, r.started_at,
                           None if end is None else max(0.0, end - r.started_at), r.cost_usd, r.run_dir, metrics))
    names = sorted(counts, key=lambda n: (-counts[n], n))[:METRIC_COLUMNS]
    return rows, names


def read_metrics(run_dir: str) -> dict[str, float]:
    """The numbers of a run's metrics.json, flattened as `compare` does (compare_any.flatten);
    {} when it has none or it is unreadable (a failed run). outputs/ is looked at first, with plain
    string paths: thousands of runs make pathlib's cost and a walk of each whole run directory
    (checkpoints and all) the slowest part of the report."""
    from cloudtrain.compare import CompareError, find_metrics
    from cloudtrain.compare_any import flatten

    text = None
    for candidate in (os.path.join(run_dir, "outputs", "metrics.json"), os.path.join(run_dir, "metrics.json")):
        try:
            with open(candidate, encoding="utf-8") as handle:
                text = handle.read()
            break
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return {}  # unreadable (permissions): the run is listed without its metrics
    try:
        if text is None:
            if not os.path.isdir(run_dir):
                return {}
            text = find_metrics(Path(run_dir)).read_text()
        data = json.loads(text)
    except (CompareError, OSError, ValueError):
        return {}  # no metrics.json (a failed run), or not JSON: the run is listed without metrics
    return flatten(data) if isinstance(data, dict) else {}


def _sweeps(store: StateStore, now: float) -> list[SweepView]:
    from cloudtrain.cli.sweep import sweep_detail
    from cloudtrain.sweep.ledger import cluster_name
    from cloudtrain.sweep.spec import SweepSpec

    found = []
    for row in store.list_sweeps():
        detail = sweep_detail(store, row)
        intervals = [i for vm in store.sweep_vms(row.id) for i in store.billing(cluster_name(row.id, vm.slot))]
        found.append(SweepView(detail, SweepSpec.from_json(row.spec), cumulative(intervals, now)))
    return found


def _comparison(runs: list[RunRow], problems: list[str]) -> list[Any]:
    """The bundled job's runs, CPU and GPU side by side (compare's table), when there are such runs."""
    from cloudtrain.compare import REQUIRED, CompareError, compare_table, load_runs

    bundled = [r for r in runs if r.run_dir and all(k in r.metrics for k in REQUIRED)
               and r.status == "succeeded"]
    if not bundled:
        return []
    try:
        summaries = load_runs([Path(r.run_dir) for r in reversed(bundled) if r.run_dir][:50])
    except CompareError as exc:
        problems.append(f"CPU vs GPU left out: {exc.one_line()}")  # said on the page, the rest stands
        return []
    # CPU first: the speed-up column is against the first run.
    summaries.sort(key=lambda s: (bool(s.gpu_names), s.name))
    return compare_table(summaries)
