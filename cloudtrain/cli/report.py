"""`report`: one HTML file of spend, what bills now, runs, sweeps (and leaks with --gc)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from cloudtrain.cli import output


@click.command()
@click.option("--since", "since_text", metavar="WHEN", help="Only spend and runs after this: 7d, 12h, 30m or 2026-11-01.")
@click.option("--output", "-o", "out", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="Where to write the page.")
@click.option("--open", "open_", is_flag=True, help="Open the page in the default browser afterwards.")
@click.option("--gc", "with_gc", is_flag=True, help="Also ask the clouds what `cloudtrain gc` would list, with $/h.")
@click.option("--all-users", is_flag=True, help="With --gc: every owner's leaks (gc --all-owners), not only yours.")
@click.option("--no-refresh", is_flag=True,
              help="Do not ask the clouds about clusters still billing first (the ledger as last observed).")
def report(since_text: str | None, out: str, open_: bool, with_gc: bool, all_users: bool, no_refresh: bool) -> None:
    """Write one self-contained HTML page (no network needed to view it): spend per day by cloud,
    cluster and owner, what bills now and budgets, runs with their metrics, sweeps, the bundled
    job's CPU-vs-GPU comparison, and with --gc the leaks. Every number is the one `cost --json`,
    `status --json`, `sweep status --json` and `gc` print."""
    from cloudtrain.cli.cost import _since
    from cloudtrain.config import load_config
    from cloudtrain.errors import UsageError
    from cloudtrain.report import write_report
    from cloudtrain.state import StateStore

    if all_users and not with_gc:
        raise UsageError("--all-users widens the leak listing, which only --gc makes",
                         hint="cloudtrain report --gc --all-users")
    since = _since(since_text)
    store = StateStore()
    config = load_config()
    problems: list[str] = []
    if not no_refresh:
        from cloudtrain.cluster.spend import observe_billing

        problems = observe_billing(store, lambda: config)
        for problem in problems:
            output.warn(problem)
    leaks = None
    if with_gc:
        from cloudtrain.cli.gc import scan
        from cloudtrain.cluster.gc import gc_clouds

        leaks = scan(config, gc_clouds(), all_users, False, Path(config.runs_dir))
        for skip in leaks.skipped:
            output.warn(f"NOT CHECKED for leaks: {skip.cloud} ({skip.reason}); it may have leaks")
    path = write_report(store, Path(out), since, time.time(), leaks, problems)
    output.info(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    if open_:
        import webbrowser

        if not webbrowser.open(path.resolve().as_uri()):
            output.warn(f"no browser could be started here: open {path} yourself")
