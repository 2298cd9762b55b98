"""Spend as the reports show it (`cost`, `cost --all-users --by`, `cloudtrain report`): one
computation from the ledger, per incarnation, cluster name, run, member, project, cloud or UTC day."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.state import BillKind, ClusterStatus, StateStore

if TYPE_CHECKING:
    from cloudtrain.cluster.spend import IncarnationSpend
    from cloudtrain.state import RunRecord


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


def cost_summary(store: StateStore, since: float, now: float, run_limit: int = 1000, *, member: str | None = None,
                 owners: dict[str, tuple[str, str]] | None = None,
                 runs_by: dict[str, str] | None = None) -> CostSummary:
    """The ledger from `since` to `now` per incarnation and per cluster name, the runs started since,
    and the total: a plain function so that every report of spend is this one computation.
    `member`: only that member's incarnations (`owners`: incarnation -> (member, project)) and
    runs (`runs_by`: run id -> member)."""
    from cloudtrain.cluster.spend import by_incarnation

    spends = by_incarnation(store, since, now)
    if member is not None:
        spends = [s for s in spends if (owners or {}).get(s.incarnation, (member,))[0] == member]
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
    runs = [r for r in store.list_runs(limit=run_limit) if r.started_at >= since
            and (member is None or (runs_by or {}).get(r.id, member) == member)]
    return CostSummary(since, now, spends, clusters, runs, sum(s.usd for s in spends))


def spend_by(store: StateStore, summary: CostSummary, by: str, owners: dict[str, tuple[str, str]],
             owner: str) -> dict[str, dict[str, Any]]:
    """Spend, node-hours and incarnations per member, project, cloud or UTC day (sorted by key);
    the groups add up to the summary's total."""
    groups: dict[str, dict[str, Any]] = {}

    def add(key: str, usd: float, node_hours: float, incarnation: str) -> None:
        entry = groups.setdefault(key, {"usd": 0.0, "node_hours": 0.0, "incarnations": set()})
        entry["usd"] += usd
        entry["node_hours"] += node_hours
        entry["incarnations"].add(incarnation)

    if by == "day":
        kept = {s.incarnation for s in summary.spends}
        for record in store.billing(since=summary.since):
            key = record.incarnation or f"legacy-{record.id}"
            if key not in kept:
                continue
            for day, start, end in days(max(summary.since, record.started_at), summary.at):
                start = max(start, summary.since)
                # Additive windows (BillingRecord.billed_seconds): the days add up to the period.
                seconds = record.billed_seconds(end, start) if record.kind == BillKind.RUNNING else 0.0
                usd = record.cost(end, start)
                if usd or seconds:
                    add(day, usd, seconds / 3600, key)
    else:
        for item in summary.spends:
            member, project = owners.get(item.incarnation, (owner, "default"))
            add({"user": member, "project": project, "cloud": item.cloud}[by], item.usd, item.node_hours,
                item.incarnation)
    return {key: {"usd": round(v["usd"], 6), "node_hours": round(v["node_hours"], 4),
                  "incarnations": len(v["incarnations"])} for key, v in sorted(groups.items())}


def days(start: float, end: float) -> list[tuple[str, float, float]]:
    """The UTC days from `start`'s to `end`'s: (YYYY-MM-DD, from, until), the first from the day's
    start (a billing minimum booked at the start stays in its day)."""
    from datetime import datetime, timedelta, timezone

    day = datetime.fromtimestamp(start, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    found = []
    while day.timestamp() < end:
        following = day + timedelta(days=1)
        found.append((day.strftime("%Y-%m-%d"), day.timestamp(), min(following.timestamp(), end)))
        day = following
    return found




def stopped_disks_hourly(store: StateStore) -> list[tuple[str, float]]:
    """(cluster, USD/h) for each stopped cluster still billing its disks, from the ledger's open disk
    intervals (what `cost` counts, not a second price)."""
    found = []
    for record in store.list_clusters(status=ClusterStatus.STOPPED):
        hourly = sum(i.hourly_price for i in store.billing(record.name)
                     if i.kind == BillKind.DISK and i.ended_at is None and i.incarnation in (None, record.uid))
        if hourly > 0:
            found.append((record.name, hourly))
    return found
