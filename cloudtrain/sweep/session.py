"""`cloudtrain sweep run/resume/stop/status`: the scheduler, Optuna, the pipeline backend and state, wired.

One process drives a sweep at a time (its pid is on the sweep's row). `sweep stop` asks that
process to stop (the row's status becomes `stopping`, which the driver polls); when no process
drives it any more (killed), `stop` and `resume` take over: the backend reports what happened to
every VM and attempt meanwhile, then the scheduler goes on (or winds down).

With a team database (state_url) any member's machine may do that (`status`, `stop`, `resume`):
- who drives: the driver holds a PostgreSQL session advisory lock on the sweep for as long as it
  drives, on the CLI's one connection (state/pg.py), so another machine knows it is alive (a pid
  means nothing there), the server frees it the moment the driver is killed, and two resumes
  cannot both win. A driver whose session is lost cannot write its journal either (the same
  session), so it cannot go on behind a new driver's back;
- the Optuna study is in the same database (sweep/space.py), so the trials go on numbered as they
  were, none asked twice;
- the recipe: the path the sweep started from, else a copy of it (the same content: its digest is
  checked) under the same file name in the current directory;
- results: a machine writes them under its own runs_dir (`runs_dir/sweep-<id>`, the row says
  where they are now); trials run before the takeover keep theirs on the machine that ran them;
- VMs launched from another machine cannot be reached from this one (their SSH keys stay on the
  machine that made them, remote/keys.py): the takeover takes them down, and a trial that was
  running on one is tried again on a VM of this machine (its first attempt counts as preempted).
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
from cloudtrain.sweep.model import Action, Event, Snapshot, StopRequested, Trial, TrialState

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Lifecycle
    from cloudtrain.recipe import LoadedRecipe
    from cloudtrain.state import SweepRecord
    from cloudtrain.sweep.backend import PipelineBackend
    from cloudtrain.sweep.ledger import BillingSource, SweepSpend
    from cloudtrain.sweep.model import Vm
    from cloudtrain.sweep.results import Written
    from cloudtrain.sweep.space import OptunaSampler
    from cloudtrain.sweep.spec import SweepSpec


class SweepStatus:
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"  # every trial it could afford ran
    STOPPED = "stopped"
    FAILED = "failed"  # VMs would not boot, or one could not be taken down


FINAL = frozenset({SweepStatus.DONE, SweepStatus.STOPPED, SweepStatus.FAILED})
STOP_POLL_S = 1.0
# A team database's advisory lock on a sweep: (this, hashtext(sweep id)). Cluster locks use 0x6374
# (state/locks.py), the writers' and migration locks single bigint keys (state/pg.py): apart.
SWEEP_LOCK_SPACE = 0x6375


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
    """Whether the row's process runs on this machine (this machine's state: no other drives it)."""
    if row.pid is None or row.pid == os.getpid():
        return False
    try:
        os.kill(row.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def driven_by(lc: Lifecycle, row: SweepRecord) -> str | None:
    """Who drives the sweep now, other than this process, in words; None when nobody does. On a
    team database the holder of the sweep's lock, wherever it runs (the module's docstring)."""
    url = _team_url(lc)
    if url is None:
        return f"process {row.pid}" if driver_alive(row) else None
    from cloudtrain.state import pg

    conn = pg.open_store(url)
    try:
        found = conn.execute(
            "SELECT a.usename, l.pid = pg_backend_pid() FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ? "
            "AND l.objid::bigint = (hashtext(?)::bigint + 4294967296) % 4294967296",
            (SWEEP_LOCK_SPACE, row.id)).fetchone()
    finally:
        conn.close()
    if found is None or found[1]:
        return None
    member = f"{found[0]}'s " if found[0] else ""
    return f"{member}cloudtrain (process {row.pid} of the machine that holds it in the team database)"


def _team_url(lc: Lifecycle) -> str | None:
    from cloudtrain.state.budgets import is_team

    return str(lc.store.path) if is_team(lc.store) else None


class _Driving:
    """This process drives sweep `sweep_id`: on a team database, its lock is held on the CLI's
    session until `release` (module docstring); nothing to hold on this machine's state."""

    def __init__(self, lc: Lifecycle, sweep_id: str) -> None:
        self.sweep_id = sweep_id
        self._conn: Any = None
        url = _team_url(lc)
        if url is None:
            return
        from cloudtrain.state import pg

        conn = pg.open_store(url)
        if not conn.execute("SELECT pg_try_advisory_lock(?, hashtext(?))", (SWEEP_LOCK_SPACE, sweep_id)).fetchone()[0]:
            conn.close()
            row = get_sweep(lc, sweep_id)
            raise UsageError(f"sweep {sweep_id} is being run by {driven_by(lc, row) or 'another cloudtrain'}",
                             hint=f"`cloudtrain sweep stop {sweep_id}` stops it")
        self._conn = conn

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        from cloudtrain.state import pg

        try:
            conn.execute("SELECT pg_advisory_unlock(?, hashtext(?))", (SWEEP_LOCK_SPACE, self.sweep_id))
        except pg.StateUnavailable as exc:
            # A session that is gone has freed the lock with it.
            import logging

            logging.getLogger(__name__).debug("sweep %s: lock freed with the session (%s)", self.sweep_id, exc)
        finally:
            conn.close()


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
    # Held before the row exists: another machine never sees the new sweep without a driver.
    driving = _Driving(lc, sweep_id)
    try:
        results_dir.mkdir(parents=True, exist_ok=False)
        _remember_results(lc, sweep_id, results_dir)
        now = time.time()
        row = SweepRecord(id=sweep_id, name=loaded.recipe.name, recipe_path=str(loaded.path.resolve()),
                          recipe_digest=loaded.digest, status=SweepStatus.RUNNING, pid=os.getpid(),
                          results_dir=str(results_dir), spec=spec.to_json(), created_at=now, updated_at=now)
        lc.store.insert_sweep(row)
        return _drive(lc, row, loaded, spec, view, resumed=False)
    finally:
        driving.release()


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
    if _team_url(lc) is None and driver_alive(row):
        raise UsageError(f"sweep {sweep_id} is being run by process {row.pid}",
                         hint=f"`cloudtrain sweep stop {sweep_id}` stops it")
    driving = _Driving(lc, sweep_id)  # on a team database: refused while another machine drives it
    try:
        row = get_sweep(lc, sweep_id)  # as its last driver left it
        if row.status in FINAL:
            raise UsageError(f"sweep {sweep_id} is {row.status}", hint=f"`cloudtrain sweep status {sweep_id}` shows it")
        recipe = _recipe_here(lc, row)
        loaded = load_recipe(str(recipe), sweep=True)
        if loaded.digest != row.recipe_digest:
            raise UsageError(f"sweep {sweep_id}: {recipe} changed since the sweep started",
                             hint="restore it to resume (trials must run the recipe they started with)")
        spec = SweepSpec.from_json(row.spec)
        results_dir = _results_here(lc, row)
        if str(results_dir) != row.results_dir:
            # Another machine drove it: this one's results go under its own runs_dir.
            view.warn(f"sweep {sweep_id} was run from another machine: from now on its results are written under "
                      f"{results_dir} (trials run before stay in {row.results_dir} on that machine)")
        lc.store.update_sweep(sweep_id, pid=os.getpid(), status=SweepStatus.STOPPING if stop else row.status,
                              results_dir=str(results_dir), recipe_path=str(recipe))
        row = get_sweep(lc, sweep_id)
        return _drive(lc, row, loaded, spec, view, resumed=True, stop=stop)
    finally:
        driving.release()


def _recipe_here(lc: Lifecycle, row: SweepRecord) -> Path:
    """The sweep's recipe on this machine: where it started, else (on a team database, another
    machine may have started it) a copy under the same name in the current directory; the caller
    checks that it is the same recipe (its digest)."""
    started = Path(row.recipe_path)
    if started.is_file():
        return started
    if _team_url(lc) is None:
        raise UsageError(f"sweep {row.id}: its recipe {row.recipe_path} is gone",
                         hint="put it back to resume; `cloudtrain sweep stop` releases the VMs without it")
    copy = Path.cwd() / started.name
    if copy.is_file():
        return copy.resolve()
    raise UsageError(f"sweep {row.id}: its recipe {row.recipe_path} is not on this machine",
                     hint=f"run this from a directory that holds a copy of it named {started.name}")


def _results_here(lc: Lifecycle, row: SweepRecord) -> Path:
    """Where this machine writes the sweep's results: where they are, on this machine's state or
    when this cloudtrain home wrote them there; else (another machine did) under this machine's
    runs_dir. The home remembers the directory it wrote (`_remember_results`): the row's path
    alone cannot say which machine it is on."""
    if _team_url(lc) is None:
        return Path(row.results_dir)
    try:
        mine = _results_marker(row.id).read_text().strip()
    except FileNotFoundError:
        mine = None
    if mine == row.results_dir:
        return Path(row.results_dir)
    here = (Path(lc.config.runs_dir).expanduser() / f"sweep-{row.id}").resolve()
    here.mkdir(parents=True, exist_ok=True)
    _remember_results(lc, row.id, here)
    return here


def _results_marker(sweep_id: str) -> Path:
    from cloudtrain import paths

    return paths.home() / "sweeps" / sweep_id / "results_dir"


def _remember_results(lc: Lifecycle, sweep_id: str, results_dir: Path) -> None:
    if _team_url(lc) is None:
        return
    marker = _results_marker(sweep_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{results_dir}\n")


def stop(lc: Lifecycle, sweep_id: str, view: SweepView, wait_s: float = 3600.0) -> SweepOutcome | SweepRecord:
    """Stop a sweep: ask its driver, or (none alive) wind it down here. Returns the outcome when this
    process did the work, else the sweep's final row."""
    row = get_sweep(lc, sweep_id)
    if row.status in FINAL:
        return row
    if driven_by(lc, row) is None:
        return resume(lc, sweep_id, view, stop=True)
    lc.store.update_sweep(sweep_id, status=SweepStatus.STOPPING)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        time.sleep(STOP_POLL_S)
        row = get_sweep(lc, sweep_id)
        if row.status in FINAL:
            return row
        if driven_by(lc, row) is None:
            return resume(lc, sweep_id, view, stop=True)
    raise UsageError(f"sweep {sweep_id} is still stopping after {wait_s:.0f}s ({driven_by(lc, row) or 'its driver'})",
                     hint=f"`cloudtrain sweep status {sweep_id}` shows what it waits for")


def _drive(lc: Lifecycle, row: SweepRecord, loaded: LoadedRecipe, spec: SweepSpec, view: SweepView, *,
           resumed: bool, stop: bool = False) -> SweepOutcome:
    from cloudtrain.sweep.space import OptunaSampler, study_location

    sweep = loaded.recipe.sweep
    assert sweep is not None
    sampler = OptunaSampler(sweep, study_location(lc.store.path, row.id), f"sweep-{row.id}", spec.max_epochs)
    try:
        return _drive_with(lc, row, loaded, spec, view, sampler, resumed=resumed, stop=stop)
    finally:
        sampler.close()


def _drive_with(lc: Lifecycle, row: SweepRecord, loaded: LoadedRecipe, spec: SweepSpec, view: SweepView,
                sampler: OptunaSampler, *, resumed: bool, stop: bool) -> SweepOutcome:
    from cloudtrain.sweep.backend import PipelineBackend
    from cloudtrain.sweep.store import StoreJournal, load_snapshot

    results_dir = Path(row.results_dir)
    snapshot = load_snapshot(lc.store, row) if resumed else None
    if snapshot is not None:
        sampler.forget_unknown({t.number for t in snapshot.trials})
    scheduler = Scheduler(spec.costs, spec.limits, sampler, time.time, StoreJournal(lc.store, row.id), snapshot)
    backend = PipelineBackend(row.id, loaded, spec, lc.config, results_dir, view.warn)
    view.started(row.id, row.name, results_dir, spec, resumed)
    if backend.lease_note is not None:
        view.warn(backend.lease_note)
    events: list[Event] = []
    if snapshot is not None:
        events = backend.recover(snapshot, _unreachable_vms(lc, row.id, snapshot))
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


def _unreachable_vms(lc: Lifecycle, sweep_id: str, snapshot: Snapshot) -> dict[str, str]:
    """The sweep's live VMs that another machine launched (team database): their cloud's nodes are
    reached with a key per cluster that stays in the cloudtrain home that made it (remote/keys.py),
    so this machine can neither follow their jobs nor start one there. {VM: why} for the backend's
    recovery, which takes them down (their attempts are retried here)."""
    if _team_url(lc) is None:
        return {}
    from cloudtrain import paths
    from cloudtrain.providers import implements, traits
    from cloudtrain.providers.base import GivenHosts
    from cloudtrain.sweep.ledger import cluster_name

    found: dict[str, str] = {}
    for vm in snapshot.vms:
        name = cluster_name(sweep_id, vm.slot)
        record = lc.store.get_cluster(name) if vm.live else None
        if record is None:
            continue
        facts = traits(record.provider)
        if not facts.remote or not facts.owns_machines or implements(record.provider, GivenHosts):
            continue  # reached as this machine's own (local) or with the recipe's hosts and keys (ssh)
        # remote/keys.py `cluster_key`: the cluster's private key under the home that launched it.
        if not (paths.home() / "keys" / name / "id_ed25519").is_file():
            found[vm.id] = (f"{name} was launched from another machine, which holds its SSH key: taken down from "
                            "this one")
    return found


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
