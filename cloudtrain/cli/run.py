"""`run`, `exec`, `logs`."""

from __future__ import annotations

import json
import re
import shlex
import signal
from pathlib import Path

import click

from cloudtrain.cli import output
from cloudtrain.cli.approve import approver, yes_option
from cloudtrain.cli.common import check_runs_dir, cluster_argument, cluster_option, open_lifecycle

# How much of a failed job's log `run` prints (in every mode, -q included).
TAIL_LINES = 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def sigterm_as_interrupt() -> None:
    # `kill PID` and a closed terminal (SIGHUP) clean up exactly like Ctrl-C does: a VM must not be
    # left running because its terminal window went away.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, handler)


def parse_env(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """`--env KEY=VALUE` (repeatable) as a dict; the last of a repeated KEY wins, like the shell."""
    from cloudtrain.errors import UsageError

    env: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise UsageError(f"--env {item!r}: expected KEY=VALUE with KEY like MY_VAR",
                             hint="e.g. --env LR=0.01; repeat --env for more")
        env[key] = value
    return env


env_option = click.option("--env", "-e", "env", multiple=True, metavar="KEY=VALUE", callback=parse_env,
                          help="Set an environment variable for the job, over the recipe's envs (repeatable).")


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
@cluster_option
@env_option
@click.option("--down", "down_", is_flag=True, help="Terminate the cluster afterwards.")
@click.option("--stop", "stop_", is_flag=True, help="Stop the cluster afterwards.")
@click.option("--keep", "keep_", is_flag=True, help="Leave the cluster running.")
@click.option("--runs-dir", type=click.Path(file_okay=False), help="Where results go (default: config runs_dir).")
@click.option("--quiet", "-q", is_flag=True,
              help="Print only what went wrong, the summary and the run directory.")
@click.option("--resume", "resume_run", metavar="RUN",
              help="Pick up RUN, a recovering run whose CLI died: relaunch from its kept checkpoint (docs/recovery.md).")
@click.option("--driver", "driver_host", metavar="HOST",
              help="Drive the run from HOST ([user@]host[:port], an SSH host with cloudtrain) instead of here; "
                   "returns once it has started (docs/driver.md).")
@click.option("--driver-key", metavar="PATH", help="The SSH key for --driver HOST (default: agent, ~/.ssh keys).")
@click.option("--driver-cloudtrain", metavar="PATH", default="cloudtrain", show_default=True,
              help="cloudtrain on the --driver host: found on its login shell's PATH, or a path (~/ is its home).")
@yes_option
def run(recipe_path: str, cluster: str | None, env: dict[str, str], down_: bool, stop_: bool, keep_: bool,
        runs_dir: str | None, quiet: bool, resume_run: str | None, yes: bool, driver_host: str | None = None,
        driver_key: str | None = None, driver_cloudtrain: str = "cloudtrain") -> None:
    """Run RECIPE: up if needed, sync, setup, run, collect into runs/<run-id>/, tear down.

    On a priced cloud, a new cluster (or a stopped one started again) is priced first and, on a
    terminal, you are asked to proceed; without a terminal pass --yes (or set `confirm: false`).

    Teardown default: the cluster is left as the run found it (down if this run created it,
    stopped again if it was stopped, kept if it was running). The last line printed is the run
    directory; the exit code is the job's success. A job or setup that fails gets the last lines
    of its log printed, with -q too.
    """
    from cloudtrain.errors import UsageError
    from cloudtrain.run.pipeline import Executor
    from cloudtrain.state import RunStatus
    from cloudtrain.recipe import load_recipe

    chosen = [flag for flag, on in (("down", down_), ("stop", stop_), ("keep", keep_)) if on]
    if len(chosen) > 1:
        raise UsageError(f"--{' and --'.join(chosen)} contradict each other", hint="give at most one of --down, --stop, --keep")
    teardown = chosen[0] if chosen else None
    if driver_host is not None:
        _run_driven(recipe_path, cluster, env, chosen, runs_dir, quiet, resume_run, yes, driver_host, driver_key,
                    driver_cloudtrain)
        return
    loaded = load_recipe(recipe_path, defer_paths=True)
    output.recipe_warnings(loaded.warnings)
    display = output.RunDisplay(quiet=quiet)
    lc = open_lifecycle(display)
    name = cluster or loaded.recipe.name
    base = Path(runs_dir or lc.config.runs_dir).expanduser()
    check_runs_dir(base, "--runs-dir" if runs_dir else "runs_dir (config)")
    sigterm_as_interrupt()
    approve = approver(yes, lc.config.confirm)
    executor = Executor(lc, display, approve)
    if resume_run:
        from cloudtrain.run.recover import resume

        result = resume(executor, loaded, resume_run, teardown or "auto", base, env)
    else:
        result = executor.run(loaded, name, teardown or "auto", base, env_overrides=env)
    if result.status != RunStatus.SUCCEEDED and result.exit_code not in (None, 0):
        _log_tail(result)  # the job or setup failed: its log says why (other failures: the summary's error)
    _summary(result)
    # Last line, in every case: where the run's logs and results are.
    output.echo(str(result.run_dir))
    # A reader that went away (`run | head`) missed the end: it is kept beside the results.
    output.keep_unshown(result.run_dir)
    if result.status == RunStatus.INTERRUPTED:
        raise SystemExit(130)
    if result.status != RunStatus.SUCCEEDED:
        raise SystemExit(result.exit_code if result.exit_code not in (None, 0) else 1)


def _run_driven(recipe_path: str, cluster: str | None, env: dict[str, str], teardown: list[str],
                runs_dir: str | None, quiet: bool, resume_run: str | None, yes: bool, host_text: str,
                key: str | None, command: str) -> None:
    """`run --driver HOST`: start the run on HOST and return (run/driver.py)."""
    from cloudtrain.config import load_config
    from cloudtrain.errors import UsageError
    from cloudtrain.recipe import load_recipe
    from cloudtrain.run.driver import DriveRequest, parse_host, start

    if resume_run:
        raise UsageError("--resume and --driver: a driven run is resumed on its driver host",
                         hint=f"`cloudtrain driver resume {resume_run}` does that (docs/driver.md)")
    host = parse_host(host_text, key)
    config = load_config()
    if not yes and config.confirm:
        # The host's `run` has no terminal to ask on; the price is this command's to approve.
        raise UsageError("--driver: the driven run has no terminal to approve its price on: pass -y/--yes",
                         hint=f"`cloudtrain plan {recipe_path}` shows the price and the worst case first")
    loaded = load_recipe(recipe_path)
    output.recipe_warnings(loaded.warnings)
    base = Path(runs_dir or config.runs_dir).expanduser()
    check_runs_dir(base, "--runs-dir" if runs_dir else "runs_dir (config)")
    from cloudtrain.names import check_cluster_name

    name = check_cluster_name(cluster or loaded.recipe.name)
    flags = tuple(f"--{flag}" for flag in teardown) + (("-q",) if quiet else ())
    request = DriveRequest(host, command, name, flags, env)
    sigterm_as_interrupt()  # `kill` or a closed terminal while it starts stops it there, as Ctrl-C does
    record = start(config, loaded, request, base, output.info)
    output.info(f"run {record.run_id} is driven by {record.host} (process {record.pid}, in {record.remote_dir}); "
                "this machine may sleep now")
    output.info(f"  cloudtrain driver status {record.run_id}    where it stands")
    output.info(f"  cloudtrain driver log {record.run_id} -f    its output, until it ends")
    output.info(f"  cloudtrain driver fetch {record.run_id}     its run directory, here, once it has ended")
    output.info(f"  cloudtrain driver cancel {record.run_id}    stop it (its cluster is taken down)")
    # Last line, as for every run: its directory here (driver.json now; everything after a fetch).
    output.echo(str(base.resolve() / record.run_id))


def failed_log(run_dir: Path, error: str | None) -> Path | None:
    """The collected log that explains a failed run: the failing node's, setup's if setup failed."""
    match = re.search(r"\bon node (\d+)\b", error or "")
    rank = int(match.group(1)) if match else 0
    prefix = "" if rank == 0 else f"node-{rank}-"
    names = ["setup.log", "job.log"] if (error or "").startswith("setup") else ["job.log", "setup.log"]
    for name in names:
        log = run_dir / f"{prefix}{name}"
        if log.is_file():
            return log
    return None


def _log_tail(result) -> None:  # noqa: ANN001
    log = failed_log(result.run_dir, result.error)
    if log is None:
        return
    lines = [shown for line in log.read_text(errors="replace").splitlines()
             if (shown := output.render_log_line(line)) is not None]
    if not lines:
        output.echo(f"{log.name} is empty")
        return
    tail = lines[-TAIL_LINES:]
    output.echo()
    output.echo(f"last {len(tail)} of {len(lines)} lines of {log}:" if len(lines) > len(tail) else f"{log}:")
    for line in tail:
        output.echo(f"  {line}")


def _summary(result) -> None:  # noqa: ANN001
    rows = [("run", result.run_id), ("status", result.status), ("exit code", result.exit_code),
            ("cost", output.money(result.cost_usd)), ("teardown", result.teardown)]
    rows += [(f"{phase} time", f"{seconds:.1f}s") for phase, seconds in result.phases.items()]
    from cloudtrain.compare import CompareError, find_metrics

    try:
        data = json.loads(find_metrics(result.run_dir).read_text())
    except (CompareError, OSError, json.JSONDecodeError):
        data = {}
    if data:
        for key in ("test_accuracy", "images_per_sec", "sec_per_batch", "device"):
            if key in data:
                value = data[key]
                rows.append((key, f"{value:.4g}" if isinstance(value, float) else value))
    if result.refused:
        rows.append(("refused", f"{len(result.refused)} unsafe result member(s), listed in run.json"))
    if result.empty_result_paths:
        # Said before the teardown too; here where a reader of the end of the output looks.
        rows.append(("empty results", f"{', '.join(result.empty_result_paths)}: nothing there on node 0 "
                                      "(run.json: empty_result_paths)"))
    if result.error:
        rows.append(("error", result.error))
    output.echo()
    output.table(["", ""], rows)


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@cluster_argument()
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--detach", "-d", is_flag=True, help="Start the command and return; follow with `logs -f`.")
@click.option("--no-sync", "no_sync", is_flag=True, help="Do not sync the recipe's workdir first.")
@env_option
def exec_(name: str, command: tuple[str, ...], detach: bool, no_sync: bool, env: dict[str, str]) -> None:
    """Run COMMAND on cluster NAME (rank 0), in the synced workdir: `cloudtrain exec NAME -- CMD...`.

    On a node where the `setup` of the recipe the cluster was made from never ran (`up` and `run`
    run it), it runs first."""
    from cloudtrain.remote.jobs import JobState
    from cloudtrain.run.attach import exec_command

    display = output.RunDisplay()
    lc = open_lifecycle(display)
    sigterm_as_interrupt()
    script = command[0] if len(command) == 1 else shlex.join(command)
    sync = not no_sync
    from cloudtrain.cluster.liveness import AliveMarks

    # While an exec that lasts holds the cluster, its machines say they are in use.
    with AliveMarks(lc.store.path, lc.config, name):
        job_id, status = exec_command(lc, display, name, script, detach=detach, sync=sync, env_overrides=env)
    if detach:
        output.info(f"started job {job_id}; follow it with `cloudtrain logs {name} {job_id} -f`")
        return
    if status.state != JobState.SUCCEEDED:
        raise SystemExit(status.exit_code or 1)


@click.command()
@cluster_argument()
@click.argument("job", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit with the job's code.")
@click.option("--resume", is_flag=True, help="Continue where the last interrupted `logs` stopped.")
@click.option("--watchdog", is_flag=True, help="Print the on-node watchdog's decisions (autostop, budget) instead.")
def logs(name: str, job: str | None, follow: bool, resume: bool, watchdog: bool = False) -> None:
    """Print the log of JOB (default: the cluster's latest job) on cluster NAME."""
    from cloudtrain.remote.jobs import JobState
    from cloudtrain.run.attach import print_logs

    lc = open_lifecycle()
    if watchdog:
        from cloudtrain.errors import UsageError
        from cloudtrain.run.attach import print_watchdog_log

        if job or follow or resume:
            raise UsageError("--watchdog prints the watchdog's log: no JOB, -f or --resume with it",
                             hint=f"`ssh {name} tail -f ~/.cloudtrain/{name}/watchdog.log` follows it")
        print_watchdog_log(lc, name, write=click.echo)
        return

    def write(line: str) -> None:
        # Progress-protocol lines read as `run` prints them; the machine stream is progress.jsonl.
        shown = output.render_log_line(line)
        if shown is not None:
            click.echo(shown)

    from cloudtrain.errors import CloudtrainError
    from cloudtrain.run.recover_logs import attempt_ended, followed_attempt, watching

    # A recovering run's job is followed one attempt at a time (run/recover_logs.py).
    followed = followed_attempt(lc.store, name) if follow and job is None else None
    try:
        with watching(followed, name):
            status = print_logs(lc, name, job, follow=follow, resume=resume, write=write)
    except KeyboardInterrupt:
        # Only the printing stops: the job runs on, and print_logs saved where it got to.
        output.interrupted_logs(name, job)
        raise SystemExit(130) from None
    except CloudtrainError as exc:
        ended = attempt_ended(followed, name, exc) if followed is not None else None
        if ended is None:
            raise
        raise ended from None
    if follow and status is not None and status.state != JobState.SUCCEEDED:
        raise SystemExit(status.exit_code or 1)


@click.command()
@cluster_argument()
@click.argument("job", required=False)
@click.option("--all", "all_jobs", is_flag=True, help="Cancel every running job of the cluster.")
def cancel(name: str, job: str | None, all_jobs: bool) -> None:
    """Stop JOB on cluster NAME (default: its latest running job) and everything it started."""
    from cloudtrain.run.attach import cancel as cancel_jobs

    lc = open_lifecycle(output.RunDisplay())
    ended = cancel_jobs(lc, name, job, all_jobs)
    if not ended:
        output.info(f"cluster {name}: no running job" + (f" {job}" if job else ""))
    for job_id, state in ended:
        output.info(f"job {job_id}: {state}")


@click.command()
@cluster_argument()
@click.argument("run_id", metavar="RUN", required=False)
@click.option("--from-bucket", is_flag=True,
              help="Fetch the results RUN uploaded (recipe `upload:`) from the bucket, with your credentials.")
def collect(name: str, run_id: str | None, from_bucket: bool) -> None:
    """Fetch RUN's results and logs from cluster NAME again (default: its latest run), verified."""
    from cloudtrain.run.collect import collect_again, empty_warning

    lc = open_lifecycle(output.RunDisplay())
    if from_bucket:
        from cloudtrain.buckets.fetch import fetch_uploaded

        output.echo(str(fetch_uploaded(lc.store, name, run_id, output.info)))
        return
    run, got = collect_again(lc, name, run_id, warn=output.warn)
    for refused in got.refused:
        output.warn(f"refused result {refused.member!r}: {refused.reason}")
    for path in got.empty_paths if got.complete else ():
        output.warn(empty_warning(path))
    # `attempts` counts round trips (results and logs are two on a clean link): not news to a user.
    output.info(f"run {run.id}: {len(got.files)} file(s) fetched and verified")
    if not got.complete:
        output.warn(f"not everything came home: {got.error}")
        output.echo(str(run.run_dir))
        raise SystemExit(1)
    output.echo(str(run.run_dir))
