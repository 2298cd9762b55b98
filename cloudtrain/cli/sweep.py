"""`cloudtrain sweep run|resume|stop|status|validate`: cost-limited sweeps (cloudtrain/sweep/)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cloudtrain.cli import output
from cloudtrain.cli.approve import ask, yes_option
from cloudtrain.cli.common import open_lifecycle
from cloudtrain.events import NullReporter

if TYPE_CHECKING:
    from cloudtrain.sweep.backend import PipelineBackend
    from cloudtrain.sweep.core import Scheduler
    from cloudtrain.sweep.model import Action, Event
    from cloudtrain.sweep.session import SweepOutcome
    from cloudtrain.sweep.spec import SweepSpec

LEADERBOARD_LINES = 10


@click.group()
def sweep() -> None:
    """Many trials of one recipe under a hard dollar budget: parameters from Optuna, warm VMs reused,
    a leaderboard, CSV and plots in runs/sweep-<id>/."""


@sweep.command("run")
@click.argument("recipe_path", metavar="RECIPE")
@click.option("--runs-dir", type=click.Path(file_okay=False), help="Where results go (default: config runs_dir).")
@yes_option
def run_cmd(recipe_path: str, runs_dir: str | None, yes: bool) -> None:
    """Run the sweep in RECIPE (a recipe with a `sweep:` section). Ctrl-C stops it cleanly; after a
    killed CLI, `cloudtrain sweep resume ID` goes on. The last line printed is the results directory.
    On a priced cloud the budget is approved first (a terminal asks; otherwise --yes or `confirm: false`)."""
    from cloudtrain.recipe import load_recipe
    from cloudtrain.sweep import session

    loaded = load_recipe(recipe_path, sweep=True)
    view = SweepDisplay()
    lc = open_lifecycle(view)
    base = Path(runs_dir or lc.config.runs_dir).expanduser()

    def approve(spec: SweepSpec) -> None:
        c = spec.costs
        ask(f"sweep {loaded.recipe.name}: up to {spec.limits.max_trials} trial(s) on up to {spec.limits.max_parallel} "
            f"VM(s) at most {output.money(c.hourly_usd)}/h each; hard budget {output.money(c.budget_usd)}",
            yes, lc.config.confirm, what="started")

    _report(session.start(lc, loaded, base, view, approve))


@sweep.command()
@click.argument("sweep_id", metavar="ID")
def resume(sweep_id: str) -> None:
    """Go on with sweep ID after its CLI was killed: re-attach to trials still running on their VMs,
    never run a trial twice."""
    from cloudtrain.sweep import session

    view = SweepDisplay()
    _report(session.resume(open_lifecycle(view), sweep_id, view))


@sweep.command()
@click.argument("sweep_id", metavar="ID")
def stop(sweep_id: str) -> None:
    """Stop sweep ID: end its running trials, release its VMs, write its results. Waits until done."""
    from cloudtrain.sweep import session

    view = SweepDisplay()
    lc = open_lifecycle(view)
    got = session.stop(lc, sweep_id, view)
    if isinstance(got, session.SweepOutcome):
        _report(got, stopping=True)
        return
    output.info(f"sweep {sweep_id}: {got.status}")
    output.echo(got.results_dir)


@sweep.command()
@click.argument("sweep_id", metavar="ID", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(sweep_id: str | None, as_json: bool) -> None:
    """List sweeps, or show sweep ID's trials."""
    from cloudtrain.state import StateStore

    store = StateStore()
    if sweep_id is None:
        rows = store.list_sweeps()
        data = [sweep_line(store, r) for r in rows]
        if as_json:
            output.print_json({"sweeps": [output.json_record(d) for d in data]})
            return
        if not data:
            output.info("no sweeps yet (`cloudtrain sweep run RECIPE`)")
            return
        output.table(["id", "name", "status", "trials", "best", "spent", "budget", "age"],
                     [(d["id"], d["name"], d["status"], d["trials"], d["best"], output.money(d["spent_usd"]),
                       output.money(d["budget_usd"]), output.age(time.time() - d["created_at"])) for d in data])
        return
    from cloudtrain.cli.common import open_lifecycle as _open
    from cloudtrain.sweep.session import get_sweep
    from cloudtrain.sweep.spec import SweepSpec
    from cloudtrain.sweep.store import attempt_of, trial_of

    row = get_sweep(_open(), sweep_id)
    spec = SweepSpec.from_json(row.spec)
    trials = [trial_of(t) for t in store.sweep_trials(row.id)]
    attempts = [attempt_of(a) for a in store.sweep_attempts(row.id)]
    line = sweep_line(store, row)
    if as_json:
        output.print_json(sweep_detail(store, row, line))
        return
    output.info(f"sweep {row.id} ({row.name}): {row.status}{' - ' + row.ended_reason if row.ended_reason else ''}; "
                f"spent {output.money(line['spent_usd'])} of {output.money(spec.costs.budget_usd)}; "
                f"results in {row.results_dir}")
    if row.error:
        output.warn(row.error)
    output.table(["trial", "state", *spec.params, spec.metric, "attempts", "error"],
                 [(t.number, t.state.value, *(_short(t.param_dict().get(p)) for p in spec.params),
                   "-" if t.value is None else f"{t.value:.4g}", t.attempts, (t.error or "")[:60]) for t in trials])


@sweep.command()
@click.argument("recipe_path", metavar="RECIPE")
def validate(recipe_path: str) -> None:
    """Check a sweep recipe without running anything: the base recipe as `validate` does, the swept
    parameters, and whether the budget covers one trial's worst case."""
    from cloudtrain.config import load_config
    from cloudtrain.recipe import load_recipe
    from cloudtrain.sweep.spec import check_sweep, lease_note, retry_line

    loaded = load_recipe(recipe_path, sweep=True)
    spec = check_sweep(loaded, load_config())
    c = spec.costs
    trials = spec.limits.max_trials
    output.info(f"{recipe_path}: ok ({loaded.recipe.name}: {spec.method} over {', '.join(spec.params)}, up to {trials} "
                f"trial(s), {spec.limits.max_parallel} at a time, metric {spec.metric} ({spec.goal}))")
    output.info(f"money: budget {output.money(c.budget_usd)}; a VM costs at most {output.money(c.hourly_usd)}/h; "
                f"one trial's worst case {output.money(c.new_vm_usd())} on a new VM "
                f"(deadline {c.deadline_s / 60:g} min on the node)")
    output.info(retry_line(loaded, spec))
    note = lease_note(loaded)
    if note is not None:
        output.warn(note)


# reporting ---------------------------------------------------------------------------------------


def _report(outcome: SweepOutcome, stopping: bool = False) -> None:
    written = outcome.written
    if written is not None:
        lines = written.leaderboard.read_text().splitlines()
        output.echo()
        for line in lines[: 3 + LEADERBOARD_LINES + 1]:
            output.echo(line)
        if len(lines) > 3 + LEADERBOARD_LINES + 1:
            output.echo(f"... {len(lines) - 4 - LEADERBOARD_LINES} more in {written.leaderboard}")
        if written.plot_error:
            output.warn(written.plot_error)
    for name in outcome.leaked:
        output.warn(f"cluster {name} could not be taken down and may be billing: `cloudtrain down {name}`")
    output.echo()
    best = outcome.best
    rows = [("sweep", outcome.sweep_id), ("status", outcome.status), ("ended", outcome.ended or "-"),
            ("spent", output.money(outcome.spent_usd))]
    if best is not None:
        params = ", ".join(f"{k}={_short(v)}" for k, v in best.params)
        rows.append(("best", f"trial {best.number}: {best.value:.4g} ({params})"))
    output.table(["", ""], rows)
    output.echo(str(outcome.results_dir))
    if outcome.interrupted and not stopping:
        raise SystemExit(130)
    if outcome.status != "done" and not stopping or best is None:
        raise SystemExit(1)


def sweep_line(store: Any, row: Any) -> dict[str, Any]:
    from cloudtrain.sweep.ledger import sweep_spend
    from cloudtrain.sweep.spec import SweepSpec

    spec = SweepSpec.from_json(row.spec)
    trials = store.sweep_trials(row.id)
    done = [t for t in trials if t.state == "succeeded" and t.value is not None]
    best = None
    if done:
        best = (max if spec.goal == "max" else min)(done, key=lambda t: t.value)
    # The ledger, per cluster incarnation: the numbers `cloudtrain cost` shows for the sweep's VMs.
    spent = sweep_spend(store, row.id, [(vm.id, vm.slot) for vm in store.sweep_vms(row.id)], time.time())
    final = sum(1 for t in trials if t.state not in ("pending", "running"))
    return {"id": row.id, "name": row.name, "status": row.status, "trials": f"{final}/{spec.limits.max_trials}",
            "best": "-" if best is None else f"{best.value:.4g} (trial {best.number})",
            "spent_usd": round(spent.usd, 6), "billing_now": spent.billing_now, "budget_usd": spec.costs.budget_usd,
            "created_at": row.created_at}


def sweep_detail(store: Any, row: Any, line: dict[str, Any] | None = None) -> dict[str, Any]:
    """`sweep status ID --json`: the sweep's line, its VMs' spend from the ledger, its trials and
    attempts; a plain function so `cloudtrain report` shows the same numbers."""
    from cloudtrain.sweep.ledger import sweep_spend
    from cloudtrain.sweep.spec import SweepSpec
    from cloudtrain.sweep.store import attempt_of, trial_of

    spec = SweepSpec.from_json(row.spec)
    line = line if line is not None else sweep_line(store, row)
    trials = [trial_of(t) for t in store.sweep_trials(row.id)]
    attempts = [attempt_of(a) for a in store.sweep_attempts(row.id)]
    vms = sweep_spend(store, row.id, [(vm.id, vm.slot) for vm in store.sweep_vms(row.id)], time.time())
    return {**output.json_record(line), "results_dir": row.results_dir, "ended": row.ended_reason, "error": row.error,
            "vms": [v.as_json() for v in vms.vms],
            "trials": [{"trial": t.number, "state": t.state.value, "params": t.param_dict(),
                        spec.metric: t.value, "attempts": t.attempts, "error": t.error}
                       for t in trials],
            "attempts": [output.json_record(
                {"trial": a.trial, "attempt": a.attempt, "vm": a.vm, "state": a.state.value,
                 "started_at": a.started_at, "ended_at": a.ended_at}) for a in attempts]}


def _short(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class SweepDisplay(NullReporter):
    """The live view: a table redrawn in place on a terminal, one line per change otherwise.
    Also the Reporter for the CLI's own lifecycle (warnings only)."""

    def __init__(self) -> None:
        self.tty = output.is_tty()
        self._live: Any = None
        self._spec: SweepSpec | None = None
        self._epochs: dict[tuple[int, int], tuple[int, float]] = {}
        self._sweep_id = ""
        self._last_draw = 0.0
        self._store: Any = None
        self._spent = (0.0, 0.0)  # (when read, USD): the ledger is read at most once a second

    # Reporter (the lifecycle's): the live table shows phases and progress; only warnings print.

    def warn(self, message: str) -> None:
        if self._live is not None:
            self._live.console.print(f"warning: {message}", style="yellow", markup=False, highlight=False)
        else:
            output.warn(message)

    # SweepView -----------------------------------------------------------------------------------

    def started(self, sweep_id: str, name: str, results_dir: Path, spec: SweepSpec, resumed: bool) -> None:
        self._spec = spec
        self._sweep_id = sweep_id
        c = spec.costs
        verb = "resuming" if resumed else "sweep"
        output.info(f"{verb} {sweep_id} ({name}): {spec.method} over {', '.join(spec.params)}; up to "
                    f"{spec.limits.max_trials} trial(s), {spec.limits.max_parallel} at a time; metric {spec.metric} "
                    f"({spec.goal}); budget {output.money(c.budget_usd)} (worst case per new trial "
                    f"{output.money(c.new_vm_usd())}, job deadline {c.deadline_s / 60:g} min)")
        output.info(f"results: {results_dir}")
        if self.tty:
            from rich.live import Live

            self._live = Live(auto_refresh=False, transient=False)
            self._live.start()

    def update(self, scheduler: Scheduler, backend: PipelineBackend, events: Sequence[Event],
               actions: Sequence[Action]) -> None:
        from cloudtrain.sweep.model import AttemptEnded, Progress

        for event in events:
            if isinstance(event, Progress):
                self._epochs[(event.trial, event.attempt)] = (event.step, event.value)
            elif isinstance(event, AttemptEnded):
                self._epochs.pop((event.trial, event.attempt), None)
        if self._live is not None:
            if time.monotonic() - self._last_draw > 0.25 or scheduler.finished:
                self._last_draw = time.monotonic()
                self._live.update(self._table(scheduler, backend), refresh=True)
            return
        for line in self._lines(scheduler, backend, events, actions):
            output.echo(line)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def _spent_usd(self, scheduler: Scheduler) -> float:
        """What the sweep's VMs were billed so far: the ledger in state, as `sweep status` and `cost` say."""
        from cloudtrain.state import StateStore
        from cloudtrain.sweep.ledger import sweep_spend

        now = time.time()
        if now - self._spent[0] >= 1.0 or scheduler.finished:
            if self._store is None:
                self._store = StateStore()
            vms = [(vm.id, vm.slot) for vm in scheduler.vms.values()]
            self._spent = (now, sweep_spend(self._store, self._sweep_id, vms, now).usd)
        return self._spent[1]

    # rendering -----------------------------------------------------------------------------------

    def _lines(self, scheduler: Scheduler, backend: PipelineBackend, events: Sequence[Event],
               actions: Sequence[Action]) -> list[str]:
        from cloudtrain.sweep.model import (
            AttemptEnded, Launch, Release, ReleaseFailed, Start, StopRequested, VmFailed, VmGone, VmReady,
        )

        spec = self._spec
        assert spec is not None
        lines = []
        money = f"[{output.money(self._spent_usd(scheduler))} spent, <= {output.money(scheduler.committed_usd())}]"
        for event in events:
            if isinstance(event, AttemptEnded):
                trial = scheduler.trials.get(event.trial)
                value = f" {spec.metric} {event.value:.4g}" if event.value is not None else ""
                state = trial.state.value if trial is not None else event.outcome.value
                why = f": {event.error}" if event.error and event.value is None else ""
                lines.append(f"trial {event.trial} attempt {event.attempt}: {event.outcome.value}{value}"
                             f"{'' if state == event.outcome.value else f' (trial {state})'}{why} {money}")
            elif isinstance(event, VmReady):
                lines.append(f"VM {event.vm} ({backend.cluster(event.vm)}) ready")
            elif isinstance(event, VmFailed):
                lines.append(f"VM {event.vm} ({backend.cluster(event.vm)}) failed: {event.error}")
            elif isinstance(event, VmGone):
                reason = "" if event.reason == "released" else f": {event.reason}"
                lines.append(f"VM {event.vm} ({backend.cluster(event.vm)}) gone{reason} {money}")
            elif isinstance(event, ReleaseFailed):
                lines.append(f"VM {event.vm} ({backend.cluster(event.vm)}) not confirmed gone: {event.error}; "
                             f"counted until its lease end, release asked again {money}")
            elif isinstance(event, StopRequested):
                lines.append(f"stopping ({event.reason}): ending running trials, releasing VMs")
        for action in actions:
            if isinstance(action, Launch):
                lines.append(f"VM {action.vm} ({backend.cluster(action.vm)}) booting {money}")
            elif isinstance(action, Start):
                params = " ".join(f"{k}={_short(v)}" for k, v in action.params)
                lines.append(f"trial {action.trial} attempt {action.attempt} on {action.vm}: {params}")
            elif isinstance(action, Release):
                lines.append(f"VM {action.vm} ({backend.cluster(action.vm)}) releasing")
        if scheduler.finished:
            lines.append(f"sweep {self._sweep_id} ended: {scheduler.counters.ended} {money}")
        return lines

    def _table(self, scheduler: Scheduler, backend: PipelineBackend) -> Any:
        from rich.table import Table

        spec = self._spec
        assert spec is not None
        states: dict[str, int] = {}
        for t in scheduler.trials.values():
            states[t.state.value] = states.get(t.state.value, 0) + 1
        title = (f"sweep {self._sweep_id}: spent {output.money(self._spent_usd(scheduler))}, at most "
                 f"{output.money(scheduler.committed_usd())} of {output.money(spec.costs.budget_usd)}; "
                 f"{len(scheduler.live_vms())} VM(s); "
                 + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
        table = Table(title=title, header_style="bold")
        for header in ("trial", "state", *spec.params, "epoch", spec.progress_metric, spec.metric, "VM", "time"):
            table.add_column(header)
        now = scheduler.clock()
        best = scheduler.best(spec.goal)
        shown = sorted(scheduler.trials.values(), key=lambda t: (t.final, -(t.number)))[:25]
        for t in sorted(shown, key=lambda t: t.number):
            running = [a for a in scheduler.running_attempts() if a.trial == t.number]
            attempt = running[0] if running else None
            epoch = self._epochs.get(attempt.key) if attempt is not None else None
            handle = backend.handles.get(attempt.key) if attempt is not None else None
            state = t.state.value if attempt is None else f"{handle.phase if handle else 'running'}"
            elapsed = f"{now - attempt.started_at:.0f}s" if attempt is not None else ""
            style = "bold green" if best is not None and t.number == best.number else None
            table.add_row(str(t.number), state, *(_short(t.param_dict().get(p)) for p in spec.params),
                          "" if epoch is None else str(epoch[0]), "" if epoch is None else f"{epoch[1]:.4g}",
                          "" if t.value is None else f"{t.value:.4g}", attempt.vm if attempt else "", elapsed,
                          style=style)
        return table
