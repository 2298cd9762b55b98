"""Entry point. Commands load lazily so `cloudtrain --help` imports almost nothing."""

from __future__ import annotations

import importlib
import os
import sys

import click

# name -> (module, attribute, one-line help shown by --help without importing the module)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("cloudtrain.cli.run", "run", "Up if needed, sync, set up, run the job, collect results, tear down."),
    "up": ("cloudtrain.cli.cluster", "up", "Provision a cluster from a recipe (or reuse it)."),
    "exec": ("cloudtrain.cli.run", "exec_", "Run a command on an existing cluster."),
    "logs": ("cloudtrain.cli.run", "logs", "Print or follow a job's log."),
    "cancel": ("cloudtrain.cli.run", "cancel", "Stop a running job and everything it started."),
    "collect": ("cloudtrain.cli.run", "collect", "Fetch a run's results and logs again, verified."),
    "status": ("cloudtrain.cli.cluster", "status", "Show clusters, their nodes and last jobs."),
    "stop": ("cloudtrain.cli.cluster", "stop", "Stop a cluster's instances (keeps disks)."),
    "start": ("cloudtrain.cli.cluster", "start", "Start a stopped cluster."),
    "down": ("cloudtrain.cli.cluster", "down", "Terminate a cluster and everything it created."),
    "validate": ("cloudtrain.cli.recipe", "validate", "Check a recipe without running anything."),
    "schema": ("cloudtrain.cli.recipe", "schema", "Print the recipe JSON Schema (for editors)."),
    "check": ("cloudtrain.cli.check", "check", "Report which clouds are usable and why not."),
    "gc": ("cloudtrain.cli.gc", "gc", "Find (and with --yes remove) leaked instances and resources by tag."),
    "recipes": ("cloudtrain.cli.recipes", "recipes", "List the bundled recipes (run them by name)."),
    "sweep": ("cloudtrain.cli.sweep", "sweep", "Run a cost-limited sweep of a recipe: trials under a hard budget, leaderboard."),
    "catalog": ("cloudtrain.cli.catalog", "catalog", "List instance types, GPUs and hourly prices, cheapest first; `catalog refresh` updates them."),
    "autostop": ("cloudtrain.cli.autostop", "autostop", "Make a cluster stop (or --down delete) itself after MIN idle minutes; --cancel turns it off."),
    "plan": ("cloudtrain.cli.plan", "plan", "Show where a recipe would run, the price and the worst case; creates nothing."),
    "cost": ("cloudtrain.cli.cost", "cost", "What was spent, per cluster and per run (billed time x price)."),
    "driver": ("cloudtrain.cli.driver", "driver", "A run started with `run --driver HOST`: status, log, fetch, cancel."),
    "compare": ("cloudtrain.cli.compare", "compare", "Compare runs: device, sec/batch, images/s, speed-up, cost."),
    "events": ("cloudtrain.cli.events", "events", "Notifications sent to your notify: targets, with each delivery's status; --retry sends."),
    "report": ("cloudtrain.cli.report", "report", "One HTML page of spend, billing now, runs, sweeps (and leaks with --gc)."),
    "team": ("cloudtrain.cli.team", "team", "A team's shared state database (state_url): init, migrate."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(entry[0])
        return getattr(module, entry[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, _, help_text) in COMMANDS.items()])

    def resolve_command(self, ctx: click.Context, args: list[str]):  # noqa: ANN201
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            import difflib

            close = difflib.get_close_matches(name, list(COMMANDS), n=1)
            error = click.UsageError(f"No such command {name!r}.", ctx)
            error.hint = f"did you mean {close[0]!r}? `cloudtrain --help` lists the commands" if close else (  # type: ignore[attr-defined]
                "`cloudtrain --help` lists the commands")
            raise error
        return super().resolve_command(ctx, args)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="CLOUDTRAIN_DEBUG", help="Show tracebacks for errors.")
@click.version_option(package_name="cloudtrain", message="cloudtrain %(version)s")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """cloudtrain: run a training job on a GPU VM, or on this machine, and bring the results home.

    \b
    Quick start:
      cloudtrain run recipes/mnist-local.yaml
      cloudtrain status
    """
    ctx.ensure_object(dict)
    # --debug is taken out of argv by main() wherever it stands (split_debug); declared here for --help.


# tarfile's `data` extraction filter (PEP 706), which unpacks results safely, arrived in 3.11.4.
MIN_PYTHON = (3, 11, 4)


def python_too_old(version_info: tuple[int, int, int, str, int]) -> str | None:
    """The one error line for a Python older than MIN_PYTHON, else None. Imports nothing: runs on every start."""
    if tuple(version_info[:3]) >= MIN_PYTHON:
        return None
    have = ".".join(str(part) for part in version_info[:3])
    return (
        f"error: cloudtrain needs Python 3.11.4 or newer (this is {have}): results are unpacked with "
        "tarfile's 'data' filter, added in 3.11.4 (install a newer Python and reinstall cloudtrain with it; "
        "in a checkout: rm -rf .venv && PYTHON=/path/to/python3 scripts/setup.sh)"
    )


def split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """Take `--debug` out of argv wherever it stands before a `--` (after it, it belongs to the
    command `exec` runs). Returns (the rest, whether it was there)."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != "--debug"]
    return head + argv[end:], len(head) != end


def usage_line(exc: click.UsageError, args: list[str] | None = None) -> str:
    """Click's usage error as one line: what is wrong (usage; where to read more). `args` name the
    command when Click did not attach its context (errors raised while parsing options)."""
    message = exc.format_message().strip().rstrip(".")
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    hint = getattr(exc, "hint", None)
    if hint is None:
        ctx = exc.ctx
        command = next((a for a in args or [] if a in COMMANDS), None)
        if ctx is not None and ctx.command is not None and (ctx.parent is not None or command is None):
            usage = " ".join(ctx.command.collect_usage_pieces(ctx))
            hint = f"usage: {ctx.command_path} {usage}; `{ctx.command_path} --help` explains"
        elif command is not None:
            hint = f"`cloudtrain {command} --help` explains"
        else:
            hint = "`cloudtrain --help` lists the commands"
    return f"{message} ({hint})"


def main(argv: list[str] | None = None) -> None:
    # Checked before anything runs, so an old Python fails here and not half-way through a paid run.
    problem = python_too_old(sys.version_info)
    if problem is not None:
        print(problem, file=sys.stderr)
        sys.exit(2)
    # paramiko imports `invoke` (half of paramiko's import: 40-100 ms of every command that reaches
    # a node) only for ssh_config's `Match exec`, which cloudtrain never parses; the CLI never uses it.
    sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
    # A closed pipe or terminal (`run | head`) must never be what stops a cleanup (cli/streams.py).
    from cloudtrain.cli import streams

    streams.install()
    args, debug_flag = split_debug(list(argv) if argv is not None else sys.argv[1:])
    debug = debug_flag or os.environ.get("CLOUDTRAIN_DEBUG") == "1"
    try:
        # Without standalone mode Click returns ctx.exit(n)'s code instead of exiting with it.
        code = cli.main(args=args, prog_name="cloudtrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            # Bare `cloudtrain` (Click >= 8.2 reports it as an error): the help is the answer.
            click.echo(exc.ctx.get_help() if exc.ctx is not None else "")
            sys.exit(0)
        if debug:
            raise
        click.echo(f"error: {usage_line(exc, args)}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("cloudtrain: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # the one place errors become exit codes
        from cloudtrain.errors import CloudtrainError

        if debug:
            raise
        if isinstance(exc, CloudtrainError):
            # One line per problem (a recipe may have several); the hint ends the last one.
            for line in exc.one_line().splitlines():
                click.echo(f"error: {line}", err=True)
            sys.exit(exc.exit_code)
        click.echo(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
