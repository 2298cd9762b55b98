"""`catalog`: what the clouds sell and for how much, cheapest first; `catalog refresh` updates the prices.

The listing reads the CSVs only (bundled, plus what `refresh` wrote to $CLOUDTRAIN_HOME/catalog/);
`refresh` is the only path that imports a network module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.catalog import Catalog, Offer
    from cloudtrain.catalog.refresh import CloudResult


class _Group(click.Group):
    """A mistyped subcommand gets a did-you-mean, as top-level commands do."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in self.commands:
            import difflib

            close = difflib.get_close_matches(name, list(self.commands), n=1)
            error = click.UsageError(f"No such command {name!r}.", ctx)
            error.hint = (f"did you mean {close[0]!r}? " if close else "") + (  # type: ignore[attr-defined]
                "`cloudtrain catalog --help` lists the options and subcommands")
            raise error
        return super().resolve_command(ctx, args)


def _bad(flag: str, value: str, problem: str, choices: Sequence[str], what: str) -> Exception:
    import difflib

    from cloudtrain.errors import UsageError

    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = (f"did you mean {by_lower[close[0]]!r}?" if close
            else f"{what}: {', '.join(choices)}" if choices else None)
    return UsageError(f"{flag} {value!r}: {problem}", hint=hint)


def _parse_gpu(value: str, known: Sequence[str]) -> tuple[str, int]:
    name, _, count_text = value.partition(":")
    count = 1
    if count_text:
        if not count_text.isdigit() or int(count_text) < 1:
            from cloudtrain.errors import UsageError

            raise UsageError(f"--gpu {value!r}: expected GPU or GPU:COUNT with a COUNT of 1 or more", hint="e.g. --gpu T4:2")
        count = int(count_text)
    by_lower = {n.lower(): n for n in known}
    if name.lower() not in by_lower:
        raise _bad("--gpu", name, "the catalog cloudtrain knows has no such GPU (`cloudtrain catalog refresh` updates it)",
                   known, "known GPUs")
    return by_lower[name.lower()], count


def select(catalog: Catalog, *, gpu: str | None, clouds: Sequence[str], regions: Sequence[str],
           spot: bool) -> list[Offer]:
    """The offers a listing shows, cheapest first (by the spot price with `spot`); bad values raise
    UsageError with a did-you-mean."""
    known_clouds = catalog.clouds()
    for cloud in clouds:
        if cloud not in known_clouds:
            raise _bad("--cloud", cloud, "no offers of that cloud in the catalog", known_clouds, "the catalog has")
    in_scope = clouds or known_clouds
    known_regions = sorted({r for c in in_scope for r in catalog.regions(c)})
    for region in regions:
        if region not in known_regions:
            owner = sorted({o.cloud for o in catalog.offers if o.region == region})
            problem = (f"a region of {', '.join(owner)}, not of {', '.join(in_scope)}" if owner
                       else "no offers in that region in the catalog")
            raise _bad("--region", region, problem, known_regions, "regions")
    name, count = _parse_gpu(gpu, catalog.accelerator_names()) if gpu else (None, 0)
    offers = catalog.query(cloud=clouds or None, accelerator=name, min_accelerators=count, spot=spot)
    if not spot:  # sold there, price not known: listed last, never as a price
        offers += catalog.unpriced(cloud=clouds or None, accelerator=name, min_accelerators=count)
    if regions:
        offers = [o for o in offers if o.region in set(regions)]
    return offers


def _price(value: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:,.4f}".rstrip("0")
    return "$" + (text + "00" if text.endswith(".") else text)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:g} GiB"


def _priced(offer: Offer, today: dt.date) -> str:
    if offer.price is None:
        return "-"
    text = offer.price_date.isoformat() if offer.price_date else "unknown"
    return f"{text} STALE" if offer.stale(today) else text


# What the repository can tell about its undated bundled rows (gcp.csv, azure.csv): their commits
# record neither a source nor the day the prices were taken, so no date is made up for them.
_UNDATED_BUNDLED = "bundled prices written without a recorded source or date"


def _source(offer: Offer) -> str:
    if offer.price is None:
        return "price unknown"
    if offer.source == "refreshed":
        return "refreshed"
    return "bundled" if offer.price_date else "bundled, undated"


@click.group(cls=_Group, invoke_without_command=True)
@click.option("--gpu", metavar="GPU[:COUNT]", help="Only this GPU model (any case), with at least COUNT of them.")
@click.option("--cloud", "clouds", multiple=True, metavar="CLOUD", help="Only this cloud (repeatable).")
@click.option("--region", "regions", multiple=True, metavar="REGION", help="Only this region (repeatable).")
@click.option("--spot", is_flag=True, help="Only offers sold as spot, cheapest spot price first.")
@click.option("-n", "--limit", type=click.IntRange(min=1), metavar="N", help="Show only the N cheapest.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def catalog(ctx: click.Context, gpu: str | None, clouds: tuple[str, ...], regions: tuple[str, ...], spot: bool,
            limit: int | None, as_json: bool) -> None:
    """Instance types with their GPUs, sizes and hourly prices, cheapest first.

    Prices older than 90 days (or of unknown date) are marked STALE; `cloudtrain catalog refresh`
    updates them from dstack's gpuhunt catalog.
    """
    if ctx.invoked_subcommand is not None:
        if gpu or clouds or regions or spot or limit or as_json:
            from cloudtrain.errors import UsageError

            raise UsageError(f"`catalog {ctx.invoked_subcommand}` takes its own options, after its name",
                             hint=f"`cloudtrain catalog {ctx.invoked_subcommand} --help` lists them")
        return
    from cloudtrain.catalog import STALE_AFTER_DAYS, Catalog

    offers = select(Catalog(), gpu=gpu, clouds=clouds, regions=regions, spot=spot)
    shown = offers[:limit] if limit else offers
    today = dt.date.today()
    if as_json:
        output.print_json({"stale_after_days": STALE_AFTER_DAYS, "offers": [{
            "cloud": o.cloud, "region": o.region, "zone": o.zone, "instance_type": o.instance_type,
            "gpu": o.accelerator, "gpu_count": o.accelerator_count, "gpu_memory_gib": o.gpu_memory_gib,
            "vcpus": o.vcpus, "memory_gib": o.memory_gib, "price": o.price, "spot_price": o.spot_price,
            "price_date": o.price_date.isoformat() if o.price_date else None, "stale": o.stale(today),
            "source": o.source, "price_source": o.price_source, "price_note": o.price_note,
        } for o in shown]})
        return
    if not shown:
        output.info("no offers match")
        return
    zones = any(o.zone for o in shown)
    headers = ["CLOUD", "REGION", *(["ZONE"] if zones else []), "INSTANCE TYPE", "GPU", "GPU MEM", "VCPUS", "RAM",
               "ON-DEMAND/H", "SPOT/H", "PRICE DATE", "SOURCE"]
    rows = [[o.cloud, o.region, *([o.zone] if zones else []), o.instance_type, o.accelerators, _gib(o.gpu_memory_gib),
             o.vcpus, _gib(o.memory_gib), _price(o.price) if o.price is not None else "unknown", _price(o.spot_price),
             _priced(o, today), _source(o)]
            for o in shown]
    output.table(headers, rows)
    from cloudtrain.catalog import PRICE_UNKNOWN

    unknown = [o for o in shown if o.price is None]
    if unknown:
        output.info(f"{len(unknown)} offer(s) with {PRICE_UNKNOWN}; plans never use them")
    for cloud in dict.fromkeys(o.cloud for o in shown
                               if o.price is not None and o.source != "refreshed" and not o.price_date):
        output.info(f"{cloud}: {_UNDATED_BUNDLED}; "
                    f"`cloudtrain catalog refresh --cloud {cloud}` replaces them with dated prices")
    if len(shown) < len(offers):
        output.info(f"({len(offers) - len(shown)} more; without -n all are shown)")
    stale = [o for o in shown if o.price is not None and o.stale(today)]
    if stale:
        output.warn(f"{len(stale)} of {len(shown)} prices are older than {STALE_AFTER_DAYS} days or undated (STALE); "
                    "`cloudtrain catalog refresh` updates them")


@catalog.command(short_help="Update the prices from dstack's gpuhunt catalog.")
@click.option("--cloud", "clouds", multiple=True, metavar="CLOUD", help="Only this cloud (repeatable; default: all).")
@click.option("--region", "regions", multiple=True, metavar="REGION",
              help="Refresh these regions (repeatable; may add new ones). Default: the regions the catalog covers.")
@click.option("--all-regions", is_flag=True, help="Every region the source lists.")
@click.option("--source", metavar="URL|DIR",
              help="A gpuhunt base URL or a directory of its CSVs (default: $GPUHUNT_CATALOG_DIR, "
                   "$GPUHUNT_CATALOG_URL, else dstack's published catalog).")
def refresh(clouds: tuple[str, ...], regions: tuple[str, ...], all_regions: bool, source: str | None) -> None:
    """Update prices from dstack's gpuhunt catalog into $CLOUDTRAIN_HOME/catalog/ (never the bundled files).

    A cloud whose download fails keeps its current prices; the command then exits 1.
    """
    from cloudtrain.catalog import STALE_AFTER_DAYS, Catalog, bundled_files
    from cloudtrain.catalog.refresh import (
        RefreshError,
        refreshable_clouds,
        resolve_source,
    )
    from cloudtrain.catalog.refresh import refresh as run_refresh
    from cloudtrain.errors import UsageError

    known = refreshable_clouds()
    for cloud in clouds:
        if cloud not in known:
            raise _bad("--cloud", cloud, "no price source for that cloud", known, "refreshable clouds")
    if regions and all_regions:
        raise UsageError("--region and --all-regions exclude each other", hint="give one of them")
    chosen = tuple(dict.fromkeys(clouds)) or known
    where = resolve_source(source)
    today = dt.date.today()
    before = _readable(Catalog())
    if before is None:  # a refreshed file edited by hand: what it covered comes from the bundled files
        before = Catalog(files=bundled_files())
    results = run_refresh(chosen, source=where, regions=regions, all_regions=all_regions, catalog=before, today=today)
    after = _readable(Catalog())
    for result in results:
        if result.ok:
            _report(result, after, today, STALE_AFTER_DAYS)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RefreshError("\n".join(str(f) for f in failed),
                           hint=f"{'its' if len(failed) == 1 else 'their'} prices are unchanged; source: {where.describe()}")


def _readable(catalog: Catalog) -> Catalog | None:
    """The catalog if its files load; else None, with a warning naming the bad file."""
    from cloudtrain.errors import ConfigError

    try:
        _ = catalog.offers
    except ConfigError as exc:
        output.warn(f"{exc.message}; refreshing its cloud replaces it")
        return None
    return catalog


def _report(result: CloudResult, after: Catalog | None, today: dt.date, stale_days: int) -> None:
    cloud = result.cloud
    dated = {"version": f"gpuhunt {result.version}",
             "last-modified": f"gpuhunt {result.version}, dated by the server's Last-Modified",
             "download": f"gpuhunt {result.version}, which carries no date: dated today",
             "file time": f"file date of {result.origin}"}[result.date_from]
    output.info(f"{cloud}: {result.offers} offers in {', '.join(result.regions)}, prices of {result.price_date}"
                f" ({dated}) -> {result.path}")
    if result.kept_offers:
        output.info(f"{cloud}: kept {result.kept_offers} refreshed offers of other regions")
    if result.skipped:
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(result.skipped.items(), key=lambda kv: -kv[1]))
        left_out = sum(result.skipped.values())
        output.info(f"{cloud}: left out {left_out} source row{'s' if left_out != 1 else ''} ({parts})")
    if result.missing_regions:
        output.warn(f"{cloud}: the source has no offers in {', '.join(result.missing_regions)}; "
                    "prices there stay as they were")
    if result.price_date and (today - result.price_date).days > stale_days:
        output.warn(f"{cloud}: the source's prices are from {result.price_date}, older than {stale_days} days")
    if after is None:
        return
    unknown = sorted({o.instance_type for o in after.offers
                      if o.cloud == cloud and o.region in result.regions and o.price is None})
    if unknown:
        output.info(f"{cloud}: {len(unknown)} type(s) the source does not price either stay 'price unknown' "
                    f"({', '.join(unknown[:6])}{' and more' if len(unknown) > 6 else ''})")
    older = [o for o in after.offers if o.cloud == cloud and o.region in result.regions and o.price is not None
             and (o.price_date is None or (result.price_date and o.price_date < result.price_date))]
    if older:
        types = sorted({o.instance_type for o in older})
        shown = ", ".join(types[:6]) + (f" and {len(types) - 6} more" if len(types) > 6 else "")
        line = f"{cloud}: {len(older)} offers are not in the source and keep their older prices ({shown})"
        if any(o.stale(today) for o in older):
            output.warn(f"{line}; those older than {stale_days} days are marked STALE by `cloudtrain catalog`")
        else:
            output.info(line)
