"""`run`, `exec`, `logs`."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import click

from cloudtrain.cli import output
from cloudtrain.cli.common import cluster_option, open_lifecycle


def sigterm_as_interrupt() -> None:
    # `kill PID` should clean up exactly like Ctrl-C does.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
@cluster_option
@click.option("--down", "teardown", flag_value="down", help="Terminate the cluster afterwards.")
@click.option("--stop", "teardown", flag_value="stop", help="Stop the cluster afterwards.")
@click.option("--keep", "teardown", flag_value="keep", help="Leave the cluster running.")
@click.option("--runs-dir", type=click.Path(file_okay=False), help="Where results go (default: config runs_dir).")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the job's output.")
def run(recipe_path: str, cluster: str | None, teardown: str | None, runs_dir: str | None, quiet: bool) -> None:
    """Run RECIPE: up if needed, sync, setup, run, collect into runs/<run-id>/, tear down.

    Teardown default: down if this run created the cluster, keep it if it already existed.
    The last line printed is the run directory; the exit code is the job's success.
    """
    from cloudtrain.execution import Executor
    from cloudtrain.recipe import load_recipe

    loaded = load_recipe(recipe_path)
    display = output.RunDisplay(show_logs=not quiet)
    lc = open_lifecycle(display)
    name = cluster or loaded.recipe.name
    base = Path(runs_dir or lc.config.runs_dir).expanduser()
    sigterm_as_interrupt()
    result = Executor(lc, display).run(loaded, name, teardown or "auto", base)
    _summary(result)
    output.echo(str(result.run_dir))
    if result.status != "succeeded":
        raise SystemExit(result.exit_code if result.exit_code not in (None, 0) else 1)


def _summary(result) -> None:  # noqa: ANN001
    rows = [("run", result.run_id), ("status", result.status), ("exit code", result.exit_code),
            ("cost", output.money(result.cost_usd))]
    rows += [(f"{phase} time", f"{seconds:.1f}s") for phase, seconds in result.phases.items()]
    metrics = next(iter(sorted(result.run_dir.glob("**/metrics.json"))), None)
    if metrics is not None:
        try:
            data = json.loads(metrics.read_text())
        except (OSError, json.JSONDecodeError):
            data = {}
        for key in ("test_accuracy", "images_per_sec", "sec_per_batch", "device"):
            if key in data:
                value = data[key]
                rows.append((key, f"{value:.4g}" if isinstance(value, float) else value))
    if result.error:
        rows.append(("error", result.error))
    output.echo()
    output.table(["", ""], rows)


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--detach", "-d", is_flag=True, help="Start the command and return; follow with `logs -f`.")
def exec_(name: str, command: tuple[str, ...], detach: bool) -> None:
    """Run COMMAND on cluster NAME (rank 0), in the synced workdir: `cloudtrain exec NAME -- CMD...`."""
    from cloudtrain.attach import exec_command

    display = output.RunDisplay()
    lc = open_lifecycle(display)
    sigterm_as_interrupt()
    script = command[0] if len(command) == 1 else shlex.join(command)
    job_id, status = exec_command(lc, display, name, script, detach=detach)
    if detach:
        output.info(f"started job {job_id}; follow it with `cloudtrain logs {name} {job_id} -f`")
        return
    if status.state != "succeeded":
        raise SystemExit(status.exit_code or 1)


@click.command()
@click.argument("name")
@click.argument("job", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--resume", is_flag=True, help="Continue where the last interrupted `logs` stopped.")
def logs(name: str, job: str | None, follow: bool, resume: bool) -> None:
    """Print the log of JOB (default: the cluster's latest job) on cluster NAME."""
    from cloudtrain.attach import print_logs

    lc = open_lifecycle()
    print_logs(lc, name, job, follow=follow, resume=resume)
