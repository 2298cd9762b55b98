"""`cost`: what was spent, per cluster and per run, from billed intervals."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.cluster.spend_report import CostSummary
    from cloudtrain.config import Config
    from cloudtrain.state import StateStore


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


def _load_config() -> Config:
    from cloudtrain.config import load_config

    return load_config()


# config.OWNER_PATTERN, by value: importing config is importing pydantic (tests/test_cost.py keeps
# the two equal).
OWNER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


def machine_owner(config: Callable[[], Config]) -> str:
    """This machine's owner, as providers.base.owner_id(config()) names it, without loading the
    config (pydantic: ~0.3 s of `cost --all-users`) where its `owner:` is absent or a valid name:
    the config's `owner`, else $CLOUDTRAIN_OWNER, else the login name. An `owner:` the light read
    cannot vouch for is read the full way, so a bad one fails as it always did."""
    import re

    from cloudtrain.state.location import _config

    found = _config("owner")
    if found is not None:
        if isinstance(found[0], str) and re.fullmatch(OWNER_PATTERN, found[0]):
            return found[0]
        from cloudtrain.providers.base import owner_id

        return owner_id(config())
    import getpass
    import os

    raw = os.environ.get("CLOUDTRAIN_OWNER")
    if not raw:
        try:
            raw = getpass.getuser()
        except (KeyError, OSError):
            raw = "unknown"
    # providers.base.sanitize_owner (importing the providers costs 20 ms): a valid tag value.
    return re.sub(r"[^a-z0-9_-]", "-", raw.lower()).strip("-_")[:63] or "unknown"


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
    from cloudtrain.cluster.spend_report import cost_summary
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import incarnation_owners, is_team, run_members, who

    since = _since(since_text)
    store = StateStore()
    config = functools.cache(_load_config)  # read only when an answer needs it (pydantic: ~0.3 s)
    problems = [] if no_refresh else observe_billing(store, config)
    for problem in problems:
        output.warn(problem)
    team = is_team(store)
    # Whose spend is whose matters only for a team's ledger (its rows name their member; you are
    # the database role) or a grouped report of this machine's (the config's owner).
    owner = who(store, "") if team else machine_owner(config) if all_users or by else ""
    owners = incarnation_owners(store, owner) if all_users or by or team else {}
    # On a team database a member's report is their own unless --all-users (this machine's SQLite
    # file holds only its own): incarnations as budgets attribute them, runs by their writer.
    me = who(store, owner) if team and not all_users else None
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


def _grouped(store: StateStore, summary: CostSummary, by: str, owners: dict[str, tuple[str, str]], owner: str,
             as_json: bool, problems: list[str], since_text: str | None) -> None:
    """`cost --all-users [--by ...]`: the same ledger, summed per member, project, cloud or UTC day."""
    from cloudtrain.cluster.spend import iso
    from cloudtrain.cluster.spend_report import spend_by

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


def _stopped_disks(store: StateStore) -> None:
    """A stopped cluster still bills its disks, every day until someone deletes it (issue 39.3)."""
    from cloudtrain.cluster.spend_report import stopped_disks_hourly

    for name, hourly in stopped_disks_hourly(store):
        output.info(f"{name} is stopped: its disks cost about ${hourly * 24.0:.2f}/day until `cloudtrain down "
                    f"{name}` (`status --refresh` says when `gc --expired` deletes it, where "
                    "autostop.delete_after_stopped_days armed it)")
