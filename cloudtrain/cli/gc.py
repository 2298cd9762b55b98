"""`gc`: leaked instances and resources, found by tag, with what they cost per hour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.cluster.gc import Skipped, Total
    from cloudtrain.config import Config
    from cloudtrain.providers.leak import Leak
    from cloudtrain.state.team import Teammate


@click.command()
@click.option("--cloud", "clouds", multiple=True, metavar="CLOUD", help="Only these clouds (default: every cloud whose machines cloudtrain creates).")
@click.option("--yes", "-y", is_flag=True, help="Terminate and delete what is found (default: only list it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one JSON document).")
@click.option("--all-owners", is_flag=True,
              help="Everything cloudtrain-tagged, whoever launched it (default: your owner tag only).")
@click.option("--include-driven", is_flag=True,
              help="With --yes, also remove the clusters of runs driven from an SSH host that are not "
                   "fetched yet (default: listed, left alone; docs/driver.md).")
@click.option("--include-live", is_flag=True,
              help="Also count (and with --yes remove) machines whose liveness mark is fresh: a cloudtrain "
                   "command elsewhere (another state of this owner) is using them (default: listed, left alone).")
@click.option("--runs-dir", type=click.Path(file_okay=False), default=None,
              help="Where `run --driver` left its runs' driver.json (default: the config's runs_dir).")
@click.option("--expired", is_flag=True,
              help="Instead: stopped clusters past their autostop.delete_after_stopped_days, tracked here or not "
                   "(with --yes: deleted with their disks; live work never is). docs/watchdog.md has the cron line.")
def gc(clouds: tuple[str, ...], yes: bool, as_json: bool, all_owners: bool, include_driven: bool,
       include_live: bool, runs_dir: str | None, expired: bool) -> None:
    """Find what cloudtrain created but no longer tracks (by tag, even if local state is lost),
    with its estimated hourly cost. Exits 1 when something leaked and --yes was not given, or
    when a cloud could not be checked (it may have leaked: never reported as clean).

    With --expired: the stopped clusters whose delete_after_stopped_days has passed (exit 1 when
    some are due and --yes was not given, or a cloud could not be checked)."""
    from cloudtrain.cluster.gc import collect, gc_clouds
    from cloudtrain.config import load_config
    from cloudtrain.errors import UsageError

    known = gc_clouds()
    for cloud in clouds:
        if cloud not in known:
            from cloudtrain.yamlfile import did_you_mean

            raise UsageError(f"--cloud {cloud!r}: gc knows {', '.join(known)}", hint=did_you_mean(cloud, known))
    config = load_config()
    if expired:
        if include_live or include_driven:
            raise UsageError("--expired never deletes live work: no --include-live or --include-driven with it",
                             hint="`cloudtrain down CLUSTER` deletes one cluster whatever holds it")
        if all_owners:
            from cloudtrain.config import ALL_OWNERS

            config = config.model_copy(update={"owner": ALL_OWNERS})
        _expired(config, clouds or known, yes, as_json, named=clouds)
        return
    found = scan(config, clouds or known, all_owners, include_live, Path(runs_dir or config.runs_dir),
                 named=clouds)
    config, leaks, live, skipped, not_set_up, checked, cost, teammates = (
        found.config, found.leaks, found.live, found.skipped, found.not_set_up, found.checked, found.cost,
        found.teammates)
    if leaks:  # news for notify: targets (gc.leaks; bounded, never changes what gc says or exits)
        from cloudtrain.notify import hooks as notify

        notify.gc_leaks(None, config, leaks, cost.hourly_usd, cost.unknown, warn=output.warn)
    if as_json:
        removed = collect(leaks, config, include_driven, include_live) if yes and leaks else []
        document: dict[str, Any] = {
            "leaks": [{**{k: v for k, v in asdict(leak).items() if k != "items"}, "hourly_usd": leak.hourly_usd,
                       "items": [asdict(item) for item in leak.items]} for leak in leaks],
            "live": [{**{k: v for k, v in asdict(leak).items() if k != "items"}, "hourly_usd": leak.hourly_usd,
                      "items": [asdict(item) for item in leak.items]} for leak in live],
            "skipped": [asdict(skip) for skip in skipped],
            "not_set_up": [skip.cloud for skip in not_set_up],
            "teammates": [asdict(mate) for mate in teammates],
            "checked": checked,
            "complete": not skipped,
            "hourly_usd": cost.hourly_usd,
            "unknown_price": cost.unknown,
            "removed": removed,
        }
        output.print_json(document)
        if (leaks and not yes) or skipped:
            raise SystemExit(1)
        return
    _live(live)
    _teammates(teammates)
    if not_set_up:
        output.info(f"not set up here (no credentials): {', '.join(skip.cloud for skip in not_set_up)}")
    if not leaks:
        if not skipped:
            output.info("nothing leaked")
            return
        # A cloud that could not be asked may hold leaks: say what was and was not checked.
        output.info(f"nothing leaked in {', '.join(checked)}" if checked else "nothing was checked")
        _not_checked(skipped)
        raise SystemExit(1)
    output.table(["CLOUD", "CLUSTER", "KIND", "ID", "REGION", "WHAT", "$/H", "WHY"],
                 [(leak.cloud, leak.cluster, item.kind, item.id, item.region, item.detail or None,
                   _hourly(item.hourly_usd), f"{leak.reason}; {leak.evidence}" if leak.evidence else leak.reason)
                  for leak in leaks for item in leak.items])
    output.info(_total_line(cost.hourly_usd, cost.unknown))
    _not_checked(skipped)
    if not yes:
        output.info("run `cloudtrain gc --yes` to remove them")
        raise SystemExit(1)
    for line in collect(leaks, config, include_driven, include_live):
        output.info(line)
    if skipped:
        raise SystemExit(1)


@dataclass(frozen=True)
class Scan:
    """What `gc` finds and lists (before --yes removes anything); `report --gc` shows the same."""

    config: Config  # the one the clouds were asked with (every owner's with --all-owners)
    leaks: list[Leak]
    live: list[Leak]  # marked alive by a command elsewhere: listed, left alone
    skipped: list[Skipped]  # could not be checked
    not_set_up: list[Skipped]  # nothing configured here for that cloud
    checked: list[str]
    cost: Total
    # On a team database: teammates' live clusters on the clouds checked (never leaks, left alone).
    teammates: list[Teammate] = field(default_factory=list)


def scan(config: Config, clouds: Sequence[str], all_owners: bool, include_live: bool, runs_dir: Path,
         named: Sequence[str] = ()) -> Scan:
    """Ask `clouds` for what cloudtrain tagged and this state does not track. `named`: the clouds the
    user named (a named cloud with nothing set up is one that could not be checked)."""
    from cloudtrain.cluster.gc import find_leaks, total
    from cloudtrain.state import StateStore
    from cloudtrain.state.team import teammates_live

    if all_owners:
        from cloudtrain.config import ALL_OWNERS

        config = config.model_copy(update={"owner": ALL_OWNERS})  # providers then list every owner's
    asked = tuple(dict.fromkeys(clouds))
    store = StateStore()
    found, skipped = find_leaks(store, config, asked, runs_dir=runs_dir)
    # A cloud with nothing configured here (no credentials at all) holds nothing made from here:
    # unless it was named with --cloud, it is "not set up", not a cloud that could not be checked.
    not_set_up = [skip for skip in skipped if not skip.set_up and skip.cloud not in named]
    skipped = [skip for skip in skipped if skip not in not_set_up]
    # Machines a cloudtrain command elsewhere keeps marking are live work, not leaks (cluster/liveness.py).
    leaks = [leak for leak in found if include_live or not leak.live]
    live = [leak for leak in found if leak not in leaks]
    checked = [cloud for cloud in asked if cloud not in {skip.cloud for skip in skipped + not_set_up}]
    teammates = [mate for mate in teammates_live(store).values() if mate.cloud in checked]
    return Scan(config, leaks, live, skipped, not_set_up, checked, total(leaks), teammates)


def _live(live: Sequence[Leak]) -> None:
    """Not in this state, but marked alive moments ago: someone's run, shown and left alone."""
    for leak in live:
        output.info(f"in use elsewhere, left alone: {leak.cloud} {leak.cluster} ({', '.join(leak.ids)}): "
                    f"{leak.evidence}, not in this machine's state (`--include-live` counts it as a leak)")


def _teammates(teammates: Sequence[Teammate]) -> None:
    """On a team database: what of the team's state gc knows is a teammate's live work, and whose."""
    if not teammates:
        return
    by_member: dict[str, list[str]] = {}
    for mate in teammates:
        by_member.setdefault(mate.member, []).append(mate.cluster)
    whose = "; ".join(f"{member}: {', '.join(names)}" for member, names in sorted(by_member.items()))
    output.info(f"{len(teammates)} cluster(s) belong to teammates (live in the team's state), never leaks, "
                f"left alone: {whose}")


def _not_checked(skipped: Sequence[Skipped]) -> None:
    for skip in skipped:
        output.info(f"NOT CHECKED: {skip.cloud} ({skip.reason}); it may have leaks "
                    f"(`cloudtrain check {skip.cloud}` says why)")


def _usd(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:.2f}" if value >= 1 else f"${value:.4f}"


def _hourly(value: float | None) -> str:
    return "price unknown" if value is None else _usd(value)


def _total_line(hourly: float, unknown: int) -> str:
    unpriced = f" plus {unknown} item(s) of unknown price" if unknown else ""
    return f"leaks cost about {_usd(hourly)}/h{unpriced}"


def _expired(config: Config, clouds: Sequence[str], yes: bool, as_json: bool, named: Sequence[str]) -> None:
    """`gc --expired`: list the armed stopped clusters, and with --yes delete those due."""
    from cloudtrain import expiry
    from cloudtrain.cluster.gc import collect_expired, find_expired
    from cloudtrain.state import StateStore

    store = StateStore()
    at = expiry.now()
    found, skipped = find_expired(store, config, tuple(dict.fromkeys(clouds)), at=at)
    not_set_up = [skip for skip in skipped if not skip.set_up and skip.cloud not in named]
    skipped = [skip for skip in skipped if skip not in not_set_up]
    due = [item for item in found if item.delete]
    removed = collect_expired(due, store, config, output.RunDisplay()) if yes and due else []
    if as_json:
        output.print_json({
            "expired": [{**{k: v for k, v in asdict(item).items() if k != "items"},
                         "daily_usd": None if item.hourly_usd is None else item.hourly_usd * 24,
                         "items": [asdict(i) for i in item.items]} for item in found],
            "skipped": [asdict(skip) for skip in skipped], "complete": not skipped, "removed": removed,
            "now": at,
        })
    else:
        if found:
            output.table(["CLOUD", "CLUSTER", "ID", "WHAT", "$/DAY", "DELETE", "WHY"],
                         [(item.cloud, item.cluster, ", ".join(item.ids), "; ".join(i.detail for i in item.items),
                           "price unknown" if item.hourly_usd is None else _usd(item.hourly_usd * 24),
                           "yes" if item.delete else "no", item.why) for item in found])
        else:
            output.info("no stopped cluster is set to be deleted (autostop.delete_after_stopped_days)")
        _not_checked(skipped)
        if due and not yes:
            output.info(f"{len(due)} cluster(s) due: run `cloudtrain gc --expired --yes` to delete them and their disks")
        for line in removed:
            output.info(line)
    if (due and not yes) or skipped:
        raise SystemExit(1)
