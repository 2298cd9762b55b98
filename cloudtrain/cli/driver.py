"""`driver status|log|fetch|cancel RUN`: a run started with `run --driver HOST` (docs/driver.md)."""

from __future__ import annotations

from pathlib import Path

import click

from cloudtrain.cli import output

runs_dir_option = click.option("--runs-dir", type=click.Path(file_okay=False),
                               help="Where the run's driver.json is (default: config runs_dir).")


def _open(run_id: str, runs_dir: str | None):  # noqa: ANN202
    from cloudtrain.config import load_config
    from cloudtrain.run.driver import DriverRecord

    config = load_config()
    base = Path(runs_dir or config.runs_dir).expanduser()
    return config, base, DriverRecord.read(base, run_id)


@click.group()
def driver() -> None:
    """Look at a run started with `cloudtrain run RECIPE --driver HOST`, which HOST drives."""


@driver.command()
@click.argument("run_id", metavar="RUN")
@runs_dir_option
def status(run_id: str, runs_dir: str | None) -> None:
    """Where RUN stands on its driver host: running or ended, its attempts, its cost once ended."""
    from cloudtrain.run.driver_ops import status as drive_status

    config, _, record = _open(run_id, runs_dir)
    got = drive_status(config, record)
    seen = got.probe
    state = seen.state.value + (f" (exit code {seen.exit_code})" if seen.exit_code is not None else "")
    rows = [("run", record.run_id), ("cluster", record.cluster), ("driver host", record.host),
            ("directory there", record.remote_dir),
            ("process", f"{seen.pid}" if seen.pid else "-"), ("state", state)]
    if got.run_json:
        rows += [("status", got.run_json.get("status")), ("cost", output.money(got.run_json.get("cost_usd")))]
    output.table(["", ""], rows)
    if got.attempts:
        output.echo()
        output.table(["ATTEMPT", "WHERE", "OUTCOME", "REASON"],
                     [(a.get("number"), " ".join(str(a.get(k) or "") for k in ("cloud", "zone") if a.get(k)),
                       a.get("outcome") or "running", a.get("reason") or "") for a in got.attempts])
    # Killed (SIGKILL: 137, or any signal but Ctrl-C's and TERM's, which it handles), or gone with
    # its wrapper (the host restarted): nothing drives the run, as with a laptop CLI that died.
    killed = seen.exit_code is not None and seen.exit_code > 128 and seen.exit_code != 130
    if seen.state.value == "gone" or killed:
        output.warn(f"the driven `cloudtrain run` on {record.host} died "
                    + (f"(exit code {seen.exit_code})" if killed else "without an exit code (the host restarted?)")
                    + f": nothing relaunches its run; `cloudtrain driver resume {record.run_id}` starts it again there")


@driver.command()
@click.argument("run_id", metavar="RUN")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the driven run ends; exit with its code.")
@runs_dir_option
def log(run_id: str, follow: bool, runs_dir: str | None) -> None:
    """Print what RUN's `cloudtrain run` printed on its driver host (phases, the job's lines, summary)."""
    from cloudtrain.run.driver_ops import follow_log

    config, _, record = _open(run_id, runs_dir)
    try:
        seen = follow_log(config, record, click.echo, follow=follow)
    except KeyboardInterrupt:
        # Only the printing stops: the run goes on, driven by its host.
        output.info(f"stopped following; run {run_id} goes on on {record.host}")
        raise SystemExit(130) from None
    if follow and seen.exit_code not in (None, 0):
        raise SystemExit(seen.exit_code)
    if follow and seen.exit_code is None:
        raise SystemExit(1)  # gone without an exit code


@driver.command()
@click.argument("run_id", metavar="RUN")
@runs_dir_option
def fetch(run_id: str, runs_dir: str | None) -> None:
    """Bring RUN's directory home from its driver host, once it has ended, verified; safe to repeat."""
    from cloudtrain.run.driver_ops import fetch as fetch_run

    config, base, record = _open(run_id, runs_dir)
    got = fetch_run(config, record, base)
    for member in got.refused:
        output.warn(f"refused {member!r} (unsafe name or link)")
    output.info(f"run {run_id}: {got.files} file(s) fetched from {record.host}")
    output.echo(str(got.run_dir))


@driver.command()
@click.argument("run_id", metavar="RUN")
@runs_dir_option
def cancel(run_id: str, runs_dir: str | None) -> None:
    """Stop RUN: its driver host's `cloudtrain run` ends the job and takes the cluster down."""
    from cloudtrain.run.driver_ops import cancel as cancel_run

    config, _, record = _open(run_id, runs_dir)
    seen = cancel_run(config, record, output.info)
    if seen.exit_code is not None:
        output.info(f"run {run_id}: ended (exit code {seen.exit_code}); "
                    f"`cloudtrain driver fetch {run_id}` brings it home")
    else:
        output.info(f"run {run_id}: {seen.state.value}: nothing to stop")


@driver.command()
@click.argument("run_id", metavar="RUN")
@runs_dir_option
def resume(run_id: str, runs_dir: str | None) -> None:
    """Start RUN's `cloudtrain run` again on its driver host after it died: `run --resume` there."""
    from cloudtrain.run.driver_ops import resume as resume_run

    config, base, record = _open(run_id, runs_dir)
    resumed = resume_run(config, record, base, output.info)
    output.info(f"run {run_id} is driven by {record.host} again (process {resumed.pid})")
