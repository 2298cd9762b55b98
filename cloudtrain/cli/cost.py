"""`cost`: what was spent, per cluster and per run, from billed intervals."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.cluster.spend import IncarnationSpend
    from cloudtrain.state import RunRecord, StateStore


def _since(value: str | None) -> float:
    """`--since 2d`, `12h`, `30m`, or a date `2026-11-01`; default: everything."""
    if not value:
        return 0.0
    units = {"d": 86400, "h": 3600, "m": 60}
    if value[-1:] in units and value[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(value[:-1]) * units[value[-1]]
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%d"))
    except ValueError:
        from cloudtrain.errors import UsageError

        raise UsageError(f"--since {value!r}: expected a duration like 2d, 12h, 30m or a date like 2026-11-01",
                         hint="e.g. --since 7d") from None


@click.command()
@click.option("--since", "since_text", metavar="WHEN", help="Only spend after this: 7d, 12h, 30m or 2026-11-01.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-refresh", is_flag=True,
              help="Do not ask the clouds first (report the ledger as last observed; no network).")
def cost(since_text: str | None, as_json: bool, no_refresh: bool) -> None:
    """Spend per cluster and per run: compute while running (each start billed at least the cloud's
    minimum) and disks while they exist, from the ledger. Clusters still billing are first checked
    with their cloud, so a stop by the watchdog or the console is counted from when it happened."""
    from cloudtrain.cluster.spend import observe_billing
    from cloudtrain.config import load_config
    from cloudtrain.state import StateStore

    since = _since(since_text)
    store = StateStore()
    problems = [] if no_refresh else observe_billing(store, load_config())
    for problem in problems:
        output.warn(problem)
    summary = cost_summary(store, since, time.time())
    spends, clusters, runs, total = summary.spends, summary.clusters, summary.runs, summary.total_usd
    if as_json:
        output.print_json(summary.as_json(problems))
        return
    if not spends and not runs:
        output.info("nothing billed" + (f" since {since_text}" if since_text else ""))
        return
    if spends:
        output.table(["CLUSTER", "CLOUD", "STATUS", "NODE-HOURS", "SPENT", "BILLING NOW"],
                     [(c["cluster"] + (f" ({c['incarnations']}x)" if c["incarnations"] > 1 else ""), c["cloud"],
                       c["status"], f"{c['node_hours']:.2f}",
                       output.money(c["usd"]) + (" (estimate)" if c["estimated_usd"] else ""),
                       "yes" if c["billing_now"] else "no") for c in clusters])
    if runs:
        output.echo()
        output.table(["RUN", "CLUSTER", "STATUS", "COST"],
                     [(r.id, r.cluster, r.status, output.money(r.cost_usd)) for r in runs])
        outside = total - sum(r.cost_usd for r in runs)
        if spends and outside >= 0.00005:
            # Each run's cost is its share of its cluster's billed time; they add up to the total.
            output.info(f"{output.money(outside)} of the total was billed outside these runs "
                        "(boots, kept or idle clusters, billing minimums, earlier runs)")
    output.echo()
    estimated = sum(c["estimated_usd"] for c in clusters)
    if estimated:
        output.info(f"estimate: {output.money(estimated)} of it is machines of a launch whose answer was lost and "
                    "that the cloud no longer reports, booked until their deadline (the most they could have run)")
    output.info(f"total: {output.money(total)}" + ("" if not problems else " (some clusters could not be checked)"))


@dataclass(frozen=True)
class CostSummary:
    """What `cost` reports, computed once: `cost --json` and `cloudtrain report` both print this."""

    since: float
    at: float
    spends: list[IncarnationSpend]
    clusters: list[dict[str, Any]]  # per cluster name, its incarnations summed
    runs: list[RunRecord]
    total_usd: float

    def as_json(self, problems: list[str]) -> dict[str, Any]:
        from cloudtrain.cluster.spend import iso

        return {"since": self.since or None, "since_iso": iso(self.since) if self.since else None, "at": self.at,
                "at_iso": iso(self.at), "clusters": self.clusters,
                "incarnations": [s.as_json() for s in self.spends],
                "runs": [{"run": r.id, "cluster": r.cluster, "incarnation": r.incarnation, "status": r.status,
                          "usd": round(r.cost_usd, 6), "started": r.started_at, "started_iso": iso(r.started_at),
                          "ended": r.ended_at, "ended_iso": iso(r.ended_at)} for r in self.runs],
                "total_usd": round(self.total_usd, 6), "not_checked": problems}


def cost_summary(store: StateStore, since: float, now: float, run_limit: int = 1000) -> CostSummary:
    """The ledger from `since` to `now` per incarnation and per cluster name, the runs started since,
    and the total: a plain function so that every report of spend is this one computation."""
    from cloudtrain.cluster.spend import by_incarnation

    spends = by_incarnation(store, since, now)
    names: dict[str, dict] = {}
    for item in spends:
        entry = names.setdefault(item.cluster, {"cluster": item.cluster, "cloud": item.cloud, "status": "down",
                                                "usd": 0.0, "node_hours": 0.0, "billing_now": False,
                                                "incarnations": 0, "estimated_usd": 0.0})
        entry["usd"] += item.usd
        entry["estimated_usd"] += item.estimated_usd
        entry["node_hours"] += item.node_hours
        entry["billing_now"] = entry["billing_now"] or item.billing_now
        entry["incarnations"] += 1
        if item.status != "down":
            entry["status"] = item.status
    clusters = [{**c, "usd": round(c["usd"], 6), "estimated_usd": round(c["estimated_usd"], 6),
                 "node_hours": round(c["node_hours"], 4)} for c in names.values()]
    runs = [r for r in store.list_runs(limit=run_limit) if r.started_at >= since]
    return CostSummary(since, now, spends, clusters, runs, sum(s.usd for s in spends))
