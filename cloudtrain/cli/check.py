"""`check`: which clouds are usable, and why not."""

from __future__ import annotations

import click

from cloudtrain.cli import output


@click.command()
@click.argument("clouds", nargs=-1, metavar="[CLOUD]...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(clouds: tuple[str, ...], as_json: bool) -> None:
    """Report which clouds are usable and why not (credentials, account, region).

    With CLOUD names, exit 1 unless every one of them is usable; without, report only.
    """
    from cloudtrain.providers.check import check_clouds
    from cloudtrain.config import load_config

    statuses = check_clouds(load_config(), clouds or None)
    if as_json:
        output.print_json([{"cloud": s.cloud, "ok": s.ok, "detail": s.detail} for s in statuses])
    else:
        output.table(["CLOUD", "STATUS", "DETAIL"], [(s.cloud, "ok" if s.ok else "no", s.detail) for s in statuses])
    if clouds and not all(s.ok for s in statuses):
        # Not ctx.exit(): with standalone_mode=False Click returns its code instead of exiting.
        raise SystemExit(1)
