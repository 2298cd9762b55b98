"""`cloudtrain sweep run/resume/stop/status`: the scheduler, Optuna, the pipeline backend and state, wired.

One process drives a sweep at a time (its pid is on the sweep's row). `sweep stop` asks that
process to stop (the row's status becomes `stopping`, which the driver polls); when no process
drives it any more (killed), `stop` and `resume` take over: the backend reports what happened to
every VM and attempt meanwhile, then the scheduler goes on (or winds down).
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cloudtrain.errors import UsageError
from cloudtrain.sweep.core import Scheduler, drive
from cloudtrain.sweep.model import Action, Event, StopRequested, Trial, TrialState

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Lifecycle
    from cloudtrain.recipe import LoadedRecipe
    from cloudtrain.state import SweepRecord
    from cloudtrain.sweep.backend import PipelineBackend
    from cloudtrain.sweep.ledger import BillingSource, SweepSpend
    from cloudtrain.sweep.model import Vm
    from cloudtrain.sweep.results import Written
    from cloudtrain.sweep.spec import SweepSpec


class SweepStatus:
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"  # every trial it could afford ran
    STOPPED = "stopped"
    FAILED = "failed"  # VMs would not boot, or one could not be taken down


FINAL = frozenset({SweepStatus.DONE, SweepStatus.STOPPED, SweepStatus.FAILED})
STOP_POLL_S = 1.0


class SweepView(Protocol):
    """How the CLI shows a sweep while it runs."""

    def started(self, sweep_id: str, name: str, results_dir: Path, spec: SweepSpec, resumed: bool) -> None: ...

    def update(self, scheduler: Scheduler, backend: PipelineBackend, events: Sequence[Event],
               actions: Sequence[Action]) -> None: ...

    def warn(self, message: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SweepOutcome:
    sweep_id: str
    status: str
    ended: str | None
    results_dir: Path
    written: Written | None
    best: Trial | None
    spent_usd: float
    interrupted: bool
    leaked: tuple[str, ...]  # clusters that could not be taken down


def new_sweep_id() -> str:
    return secrets.token_hex(3)


def driver_alive(row: SweepRecord) -> bool:
    if row.pid is None or row.pid == os.getpid():
        return False
    try:
        os.kill(row.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def get_sweep(lc: Lifecycle, sweep_id: str) -> SweepRecord:
    row = lc.store.get_sweep(sweep_id)
    if row is None:
        from cloudtrain.yamlfile import did_you_mean

        known = [s.id for s in lc.store.list_sweeps(limit=200)]
        hint = did_you_mean(sweep_id, known) or ("`cloudtrain sweep status` lists them" if known else "no sweeps yet")
        raise UsageError(f"no sweep {sweep_id!r}", hint=hint)
    return row


def start(lc: Lifecycle, loaded: LoadedRecipe, runs_dir: Path, view: SweepView,
          approve: Callable[[SweepSpec], None] | None = None) -> SweepOutcome:
    """`approve` (the CLI's price prompt) sees the checked spec before anything exists; it raises
    to stop. A sweep is approved once, for its whole budget, not per VM."""
    from cloudtrain.state import SweepRecord
    from cloudtrain.sweep.spec import check_sweep

    spec = check_sweep(loaded, lc.config)
    if approve is not None and spec.costs.hourly_usd > 0:
        approve(spec)
    sweep_id = new_sweep_id()
    while lc.store.get_sweep(sweep_id) is not None:
        sweep_id = new_sweep_id()
    results_dir = (runs_dir / f"sweep-{sweep_id}").resolve()
    results_dir.mkdir(parents=True, exist_ok=False)
    now = time.time()
    row = SweepRecord(id=sweep_id, name=loaded.recipe.name, recipe_path=str(loaded.path.resolve()),
                      recipe_digest=loaded.digest, status=SweepStatus.RUNNING, pid=os.getpid(),
                      results_dir=str(results_dir), spec=spec.to_json(), created_at=now, updated_at=now)
    lc.store.insert_sweep(row)
    return _drive(lc, row, loaded, spec, view, resumed=False)


def resume(lc: Lifecycle, sweep_id: str, view: SweepView, *, stop: bool = False) -> SweepOutcome:
    from cloudtrain.recipe import load_recipe
    from cloudtrain.sweep.spec import SweepSpec

    row = get_sweep(lc, sweep_id)
    if row.status == SweepStatus.STOPPED:
        # Ctrl-C or `sweep stop`: its trials were ended and its VMs released on purpose; what it
        # found is kept. There is nothing left running to re-attach to.
        raise UsageError(f"sweep {sweep_id} was stopped (Ctrl-C or `cloudtrain sweep stop`): its trials were ended "
                         "and its machines released, so there is nothing to resume",
                         hint=f"`cloudtrain sweep status {sweep_id}` shows what it found; `cloudtrain sweep run "
                              f"{row.recipe_path}` starts a new sweep with a budget of its own")
    if row.status in FINAL:
        raise UsageError(f"sweep {sweep_id} is {row.status}", hint=f"`cloudtrain sweep status {sweep_id}` shows it")
    if driver_alive(row):
        raise UsageError(f"sweep {sweep_id} is being run by process {row.pid}",
                         hint=f"`cloudtrain sweep stop {sweep_id}` stops it")
    if not Path(row.recipe_path).is_file():
        raise UsageError(f"sweep {sweep_id}: its recipe {row.recipe_path} is gone",
                         hint="put it back to resume; `cloudtrain sweep stop` releases the VMs without it")
    loaded = load_recipe(row.recipe_path, sweep=True)
    if loaded.digest != row.recipe_digest:
        raise UsageError(f"sweep {sweep_id}: {row.recipe_path} changed since the sweep started",
                         hint="restore it to resume (trials must run the recipe they started with)")
    spec = SweepSpec.from_json(row.spec)
    lc.store.update_sweep(sweep_id, pid=os.getpid(), status=SweepStatus.STOPPING if stop else row.status)
    return _drive(lc, row, loaded, spec, view, resumed=True, stop=stop)


def stop(lc: Lifecycle, sweep_id: str, view: SweepView, wait_s: float = 3600.0) -> SweepOutcome | SweepRecord:
    """Stop a sweep: ask its driver, or (none alive) wind it down here. Returns the outcome when this
    process did the work, else the sweep's final row."""
    row = get_sweep(lc, sweep_id)
    if row.status in FINAL:
        return row
    if not driver_alive(row):
        return resume(lc, sweep_id, view, stop=True)
    lc.store.update_sweep(sweep_id, status=SweepStatus.STOPPING)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        time.sleep(STOP_POLL_S)
        row = get_sweep(lc, sweep_id)
        if row.status in FINAL:
            return row
        if not driver_alive(row):
            return resume(lc, sweep_id, view, stop=True)
    raise UsageError(f"sweep {sweep_id} is still stopping after {wait_s:.0f}s (process {row.pid})",
                     hint=f"`cloudtrain sweep status {sweep_id}` shows what it waits for")


def _drive(lc: Lifecycle, row: SweepRecord, loaded: LoadedRecipe, spec: SweepSpec, view: SweepView, *,
           resumed: bool, stop: bool = False) -> SweepOutcome:
    from cloudtrain import paths
    from cloudtrain.sweep.backend import PipelineBackend
    from cloudtrain.sweep.space import OptunaSampler
    from cloudtrain.sweep.store import StoreJournal, load_snapshot

    sweep = loaded.recipe.sweep
    assert sweep is not None
    results_dir = Path(row.results_dir)
    snapshot = load_snapshot(lc.store, row) if resumed else None
    sampler = OptunaSampler(sweep, paths.home() / "sweeps" / row.id / "optuna.journal", f"sweep-{row.id}",
                            spec.max_epochs)
    if snapshot is not None:
        sampler.forget_unknown({t.number for t in snapshot.trials})
    scheduler = Scheduler(spec.costs, spec.limits, sampler, time.time, StoreJournal(lc.store, row.id), snapshot)
    backend = PipelineBackend(row.id, loaded, spec, lc.config, results_dir, view.warn)
    view.started(row.id, row.name, results_dir, spec, resumed)
    if backend.lease_note is not None:
        view.warn(backend.lease_note)
    events: list[Event] = backend.recover(snapshot) if snapshot is not None else []
    if stop:
        events.append(StopRequested("stopped by `cloudtrain sweep stop`"))
    asked = _StopAsk(lc, row.id, already=stop)
    error: str | None = None
    with _interrupts_as_stop(asked):
        try:
            drive(scheduler, backend, events=events, poll_s=0.5, extra_events=asked.events,
                  on_step=lambda s, e, a: view.update(s, backend, e, a))
        except BaseException as exc:
            error = f"internal error: {type(exc).__name__}: {exc}"
            view.warn(f"{error}; releasing the sweep's VMs")
            _release_everything(scheduler, backend)
            lc.store.update_sweep(row.id, status=SweepStatus.FAILED, error=error, ended_at=time.time(), pid=None)
            raise
        finally:
            view.close()
    backend.join(30.0)
    return _finish(lc, row, spec, scheduler, results_dir, asked.interrupted)


def _finish(lc: Lifecycle, row: SweepRecord, spec: SweepSpec, scheduler: Scheduler, results_dir: Path,
            interrupted: bool) -> SweepOutcome:
    from cloudtrain.sweep.results import write_results

    from cloudtrain.sweep.ledger import cluster_name

    ended = scheduler.counters.ended or ""
    # Normally none: the scheduler ends only once the cloud confirmed every VM gone.
    leaked = tuple(cluster_name(row.id, v.slot) for v in scheduler.live_vms())
    if leaked:
        status = SweepStatus.FAILED
    elif ended.startswith("stopped"):
        status = SweepStatus.STOPPED
    elif ended in ("done", "budget exhausted"):
        status = SweepStatus.DONE
    else:
        status = SweepStatus.FAILED
    now = time.time()
    spent = sweep_spent(lc.store, row.id, scheduler.vms.values(), now)
    summary = summary_of(row, spec, scheduler, status, spent, now)
    written = write_results(results_dir, spec, scheduler.snapshot(), summary, now)
    error = f"could not take down {', '.join(leaked)}" if leaked else None
    lc.store.update_sweep(row.id, status=status, ended_at=now, pid=None, error=error)
    from cloudtrain.notify import hooks as notify  # sweep.finished and its budget events (bounded, never fails the sweep)

    notify.sweep_finished(lc.store, lc.config, row.recipe_path, summary, warn=lc.reporter.warn)
    return SweepOutcome(row.id, status, scheduler.counters.ended, results_dir, written, scheduler.best(spec.goal),
                        spent.usd, interrupted, leaked)


def sweep_spent(store: BillingSource, sweep_id: str, vms: Iterable[Vm], now: float) -> SweepSpend:
    """What the sweep's VMs were billed: the billed intervals in state, per cluster incarnation, the
    numbers `cloudtrain cost` shows (a VM the ledger never billed, e.g. a launch that never got an
    answer and was never seen, counts nothing: there is nothing the cloud billed that we know of)."""
    from cloudtrain.sweep.ledger import sweep_spend

    return sweep_spend(store, sweep_id, [(v.id, v.slot) for v in vms], now)


def summary_of(row: SweepRecord, spec: SweepSpec, scheduler: Scheduler, status: str, spent: SweepSpend,
               now: float) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for t in scheduler.trials.values():
        counts[t.state.value] = counts.get(t.state.value, 0) + 1
    return {
        "id": row.id, "name": row.name, "status": status, "ended": scheduler.counters.ended,
        "recipe": row.recipe_path, "method": spec.method, "metric": spec.metric, "goal": spec.goal,
        "budget_usd": spec.costs.budget_usd, "spent_usd": round(spent.usd, 6), "billing_now": spent.billing_now,
        "worst_case_usd": round(scheduler.committed_usd(), 6), "hourly_usd_quote": spec.costs.hourly_usd,
        "min_billed_s": spec.costs.min_s, "vms": [v.as_json() for v in spent.vms],
        "trial_deadline_s": spec.costs.deadline_s, "max_parallel": spec.limits.max_parallel,
        "max_trials": spec.limits.max_trials, "trials": counts, "vms_booted": len(scheduler.vms),
        "started_at": row.created_at, "ended_at": now,
    }


class _StopAsk:
    """Stops asked from outside the backend: Ctrl-C/SIGTERM here, `sweep stop` from another process."""

    def __init__(self, lc: Lifecycle, sweep_id: str, already: bool) -> None:
        self.lc = lc
        self.sweep_id = sweep_id
        self.sent = already
        self.interrupted = False
        self._signal = threading.Event()
        self._last_poll = 0.0

    def signal(self) -> None:
        self.interrupted = True
        self._signal.set()

    def events(self) -> list[Event]:
        if self.sent:
            return []
        if self._signal.is_set():
            self.sent = True
            self.lc.store.update_sweep(self.sweep_id, status=SweepStatus.STOPPING)
            return [StopRequested("interrupted")]
        if time.monotonic() - self._last_poll >= STOP_POLL_S:
            self._last_poll = time.monotonic()
            row = self.lc.store.get_sweep(self.sweep_id)
            if row is not None and row.status == SweepStatus.STOPPING:
                self.sent = True
                return [StopRequested("stopped by `cloudtrain sweep stop`")]
        return []


@contextmanager
def _interrupts_as_stop(asked: _StopAsk) -> Iterator[None]:
    """Ctrl-C or SIGTERM: stop the sweep cleanly (end trials, release VMs); repeated, just say so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        import sys

        if asked.interrupted:
            sys.stderr.write("cloudtrain: stopping the sweep: ending its trials and releasing its VMs, please wait\n")
        asked.signal()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _release_everything(scheduler: Scheduler, backend: PipelineBackend) -> None:
    """After an internal error: no VM of the sweep may be left running."""
    from cloudtrain.sweep.model import Cancel, Release

    for attempt in scheduler.running_attempts():
        backend.cancel(Cancel(attempt.vm, attempt.trial, attempt.attempt, TrialState.STOPPED.value))
    for vm in scheduler.live_vms():
        backend.release(Release(vm.id))
    backend.join(600.0)
