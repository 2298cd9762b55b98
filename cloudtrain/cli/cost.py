"""`cost`: what was spent, per cluster and per run, from billed intervals."""

from __future__ import annotations

import time

import click

from cloudtrain.cli import output


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
def cost(since_text: str | None, as_json: bool) -> None:
    """Spend per cluster (billed intervals: running at the compute price, stopped at the disk price) and per run."""
    from cloudtrain.cost import spend
    from cloudtrain.state import StateStore

    since = _since(since_text)
    store = StateStore()
    now = time.time()
    by_cluster: dict[str, list] = {}
    for item in store.billing(since=since):
        by_cluster.setdefault(item.cluster, []).append(item)
    live = {c.name: c for c in store.list_clusters()}
    clusters = []
    for name, items in sorted(by_cluster.items()):
        total = spend(items, since=since, until=now)
        clusters.append({
            "cluster": name, "cloud": items[0].cloud,
            "status": live[name].status if name in live else "down",
            "usd": round(total.usd, 6), "node_hours": round(total.billed_s / 3600, 4), "billing_now": total.running,
        })
    runs = [r for r in store.list_runs(limit=1000) if r.started_at >= since and r.cost_usd > 0]
    if as_json:
        output.print_json({"since": since or None, "clusters": clusters,
                           "runs": [{"run": r.id, "cluster": r.cluster, "usd": round(r.cost_usd, 6)} for r in runs],
                           "total_usd": round(sum(c["usd"] for c in clusters), 6)})
        return
    if not clusters:
        output.info("nothing billed" + (f" since {since_text}" if since_text else ""))
        return
    output.table(["CLUSTER", "CLOUD", "STATUS", "NODE-HOURS", "SPENT", "BILLING NOW"],
                 [(c["cluster"], c["cloud"], c["status"], f"{c['node_hours']:.2f}", output.money(c["usd"]),
                   "yes" if c["billing_now"] else "no") for c in clusters])
    if runs:
        output.echo()
        output.table(["RUN", "CLUSTER", "COST"], [(r.id, r.cluster, output.money(r.cost_usd)) for r in runs])
    output.echo()
    output.info(f"total: {output.money(sum(c['usd'] for c in clusters))}")
