"""`autostop`: change, live, when a running cluster stops (or deletes) itself."""

from __future__ import annotations

import click

from cloudtrain.cli import output
from cloudtrain.cli.common import cluster_argument, open_lifecycle


@click.command()
@cluster_argument()
@click.option("--idle-minutes", "-i", "idle_minutes", type=click.IntRange(min=1), metavar="MIN",
              help="Stop after MIN minutes without a job (and, by default, without an SSH session).")
@click.option("--down", "down_", is_flag=True, help="Delete the cluster instead of stopping it.")
@click.option("--wait-for", type=click.Choice(["jobs_and_ssh", "jobs", "none"]), default="jobs_and_ssh",
              show_default=True, help="What keeps the cluster up: jobs and SSH sessions, jobs only, or nothing.")
@click.option("--gpu-util-below", type=click.FloatRange(min=0, max=100, min_open=True), metavar="PCT",
              help="A job whose every GPU stayed under PCT% utilisation for the idle window counts as idle.")
@click.option("--delete-after-stopped-days", type=click.IntRange(min=1, max=3650), metavar="DAYS",
              help="Tag the machines before the stop so that `cloudtrain gc --expired` deletes them DAYS days later.")
@click.option("--cancel", is_flag=True, help="Turn autostop off (a recipe's budget stays).")
def autostop(name: str, idle_minutes: int | None, down_: bool, wait_for: str, gpu_util_below: float | None,
             delete_after_stopped_days: int | None, cancel: bool) -> None:
    """Make cluster NAME stop (or with --down, delete) itself after MIN idle minutes.

    The watchdog on every node takes the change on its next tick, and needs nothing from this
    machine afterwards. `cloudtrain logs NAME --watchdog` shows its decisions.
    """
    from cloudtrain.errors import UsageError
    from cloudtrain.run.watchdog import report, set_autostop

    if cancel and (idle_minutes is not None or down_ or gpu_util_below is not None
                   or delete_after_stopped_days is not None):
        raise UsageError("--cancel turns autostop off: no other option with it",
                         hint=f"`cloudtrain autostop {name} --cancel`")
    if gpu_util_below is not None and wait_for == "none":
        raise UsageError("--gpu-util-below judges running jobs, and --wait-for none waits for none",
                         hint="--wait-for jobs (or jobs_and_ssh), or drop --gpu-util-below")
    if not cancel and idle_minutes is None:
        raise UsageError("how long may the cluster be idle?",
                         hint=f"`cloudtrain autostop {name} -i 30` (minutes), or --cancel")
    display = output.RunDisplay()
    lc = open_lifecycle(display)
    from cloudtrain.policy import check_autostop, effective_policy

    # Before any node is asked: the floor holds for a live change as for a recipe.
    check_autostop(name, idle_minutes, cancel, effective_policy(lc.config, lc.store))
    settings, results = set_autostop(lc, name, idle_minutes, down_, wait_for, cancel, display,
                                     gpu_util_below=gpu_util_below,
                                     delete_after_stopped_days=delete_after_stopped_days)
    report(display, settings, results)
    effects = sorted({r.effect for r in results if r.effect})
    if "delete" in effects and not down_:
        display.warn("these machines cannot stop, only terminate (spot): autostop deletes them")
