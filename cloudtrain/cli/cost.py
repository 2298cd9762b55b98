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


GROUPS = ("user", "project", "cloud", "day")


@click.command()
@click.option("--since", "since_text", metavar="WHEN", help="Only spend after this: 7d, 12h, 30m or 2026-11-01.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-refresh", is_flag=True,
              help="Do not ask the clouds first (report the ledger as last observed; no network).")
@click.option("--all-users", is_flag=True, help="Every team member's spend (grouped --by user unless told otherwise).")
@click.option("--by", type=click.Choice(GROUPS), default=None,
              help="Spend per member, project, cloud or UTC day instead of per cluster.")
def cost(since_text: str | None, as_json: bool, no_refresh: bool, all_users: bool, by: str | None) -> None:
    """Spend per cluster and per run: compute while running (each start billed at least the cloud's
    minimum) and disks while they exist, from the ledger. Clusters still billing are first checked
    with their cloud, so a stop by the watchdog or the console is counted from when it happened.
    On a team database: your spend, or with --all-users every member's."""
    from cloudtrain.cluster.spend import observe_billing
    from cloudtrain.config import load_config
    from cloudtrain.providers.base import owner_id
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import incarnation_owners, is_team, run_members, who

    since = _since(since_text)
    store = StateStore()
    config = load_config()
    problems = [] if no_refresh else observe_billing(store, config)
    for problem in problems:
        output.warn(problem)
    owner = owner_id(config)
    owners = incarnation_owners(store, owner) if all_users or by or is_team(store) else {}
    # On a team database a member's report is their own unless --all-users (this machine's SQLite
    # file holds only its own): incarnations as budgets attribute them, runs by their writer.
    me = who(store, owner) if is_team(store) and not all_users else None
    summary = cost_summary(store, since, time.time(), member=me, owners=owners,
                           runs_by=run_members(store) if me is not None else None)
    if all_users or by:
        _grouped(store, summary, by or "user", owners, owner, as_json, problems, since_text)
        return
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
    _stopped_disks(store)
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


def _grouped(store: StateStore, summary: CostSummary, by: str, owners: dict[str, tuple[str, str]], owner: str,
             as_json: bool, problems: list[str], since_text: str | None) -> None:
    """`cost --all-users [--by ...]`: the same ledger, summed per member, project, cloud or UTC day."""
    from cloudtrain.cluster.spend import iso

    groups = spend_by(store, summary, by, owners, owner)
    if as_json:
        output.print_json({"since": summary.since or None, "since_iso": iso(summary.since) if summary.since else None,
                           "at": summary.at, "at_iso": iso(summary.at), "by": by,
                           "groups": [{by: key, **values} for key, values in groups.items()],
                           "total_usd": round(summary.total_usd, 6), "not_checked": problems})
        return
    if not groups:
        output.info("nothing billed" + (f" since {since_text}" if since_text else ""))
        return
    output.table([by.upper(), "SPENT", "NODE-HOURS", "CLUSTERS"],
                 [(key, output.money(v["usd"]), f"{v['node_hours']:.2f}", v["incarnations"])
                  for key, v in groups.items()])
    output.echo()
    output.info(f"total: {output.money(summary.total_usd)}" + ("" if not problems else " (some clusters could not be checked)"))


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
            for day, start, end in _days(max(summary.since, record.started_at), summary.at):
                start = max(start, summary.since)
                # Additive windows (BillingRecord.billed_seconds): the days add up to the period.
                seconds = record.billed_seconds(end, start) if record.kind == "running" else 0.0
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


def _days(start: float, end: float) -> list[tuple[str, float, float]]:
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


def _stopped_disks(store: StateStore) -> None:
    """A stopped cluster still bills its disks, every day until someone deletes it (issue 39.3): say
    how much per day, from the ledger's open disk intervals (what `cost` counts, not a second price)."""
    from cloudtrain.state import BillKind, ClusterStatus

    for record in store.list_clusters():
        if record.status != ClusterStatus.STOPPED:
            continue
        hourly = sum(i.hourly_price for i in store.billing(record.name)
                     if i.kind == BillKind.DISK and i.ended_at is None and i.incarnation in (None, record.uid))
        if hourly <= 0:
            continue
        per_day = hourly * 24.0
        output.info(f"{record.name} is stopped: its disks cost about ${per_day:.2f}/day until `cloudtrain down "
                    f"{record.name}` (`status --refresh` says when `gc --expired` deletes it, where "
                    "autostop.delete_after_stopped_days armed it)")
