"""The real Backend: each VM slot is a kept cluster, each attempt one run of the `run` pipeline.

- launch: `Executor.up` on the slot's cluster (`sw-<sweep>-<slot>`), in a thread, with the VM's lease
  in the launch request (`deadline_at`: the machine goes by then even if this CLI dies while it
  boots); a VM that is not running by `ready_by` is given up (lifecycle's wait) and whatever it left
  is taken down. Once up, every node gets the VM's lease (`Launch.lease_end`) as a hard deadline for its on-node watchdog
  (cloudtrain/run/watchdog.py `set_lease`): it deletes the machine by then, CLI or not. A VM that
  cannot take its lease is given up too. Clouds without a watchdog (`ssh`) take none (`lease_note`).
- run: `Executor.run(trial recipe, cluster, teardown "keep", runs/sweep-<id>/trials/tNNNN-aK/,
  env_overrides)` in a thread; the job gets CLOUDTRAIN_DEADLINE_S, which the node enforces
  (templates/runner.sh), and a setup that overruns its reserved time fails the attempt before the
  job starts. Per-epoch progress lines become `Progress` events. A Start that extends the VM's
  lease writes the new one to its nodes first. While the attempt runs, run's cloud watcher
  (run/recover_watch.py `Watcher`, run's one gone rule, run/gone.py) asks the cloud every `watch_s`
  whether the VM is still there, so a VM that vanishes (preempted, deleted by its lease or by
  someone) is seen within seconds: it sets the attempt's stop token (run/stop.py), whose
  connections give up, instead of the pipeline waiting out its SSH retry window; the attempt's own
  failure asks too. A VM gone under its attempt ends as `VmGone`: the scheduler retries the
  attempt as preempted. The scheduler is the one owner of that retry: a trial's recipe runs
  without the pipeline's own recovery (a spot recipe has `recover:` on by default), which would
  otherwise relaunch the same loss a second time, on a machine the scheduler does not count.
  Before the retried job starts, the checkpoint its lost attempt kept goes onto the new VM
  (run/carry.py, by the attempt's policy, run/controller.py `Trial`; run/checkpoints.py keeps it).
- cancel: the attempt's stop token is set (the pipeline starts no further phase), and the cluster's
  open jobs are cancelled (again, until the attempt's thread is over: a job may be submitted just
  after a cancel).
- release: `cloudtrain down` of the slot's cluster (retried), after its boot thread is done.
Whenever the backend says a VM is gone (`VmGone`, `VmFailed`) it is because `down` (or the cloud's
own answer) confirmed it, and the time it gives is when the ledger has its last billed interval
end: the cloud's time where the cloud reports one (cloudtrain/sweep/ledger.py `gone_at`). A
`down` that fails, or leaves something the cloud still lists, is `ReleaseFailed`: the scheduler
keeps counting the VM to its lease end and asks again; retries wait RETRY_S, doubling up to
RETRY_MAX_S.
- recover: after a killed CLI, state rows, run rows and the node's job files say what happened:
  a finished run is judged from its run directory, a job still running is followed again and
  its results collected, an attempt whose job never started is reported as such. Every VM state
  still calls up is asked for (one describe): one that is gone (its watchdog deleted it at its lease
  end while no CLI ran, or it was preempted) is reported gone, with its attempt.
Each thread opens its own StateStore (one SQLite connection per thread).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.config import Config
from cloudtrain.errors import CloudtrainError
from cloudtrain.recipe import LoadedRecipe
from cloudtrain.run import checkpoints
from cloudtrain.run.checkpoints import CHECKPOINT_ENV, Puller
from cloudtrain.run.controller import Trial
from cloudtrain.run.gone import Gone, GoneKind
from cloudtrain.run.stop import StopKind, StopToken
from cloudtrain.sweep import ledger
from cloudtrain.sweep.ledger import cluster_name
from cloudtrain.sweep.model import (
    AttemptEnded, Cancel, Event, Launch, Outcome, Progress, Release, ReleaseFailed, Snapshot, Start, VmFailed,
    VmGone, VmReady, VmState,
)
from cloudtrain.sweep.spec import DEADLINE_ENV, SweepSpec, lease_note, trial_recipe

if TYPE_CHECKING:
    from cloudtrain.run.recover_watch import Watcher

RELEASE_TRIES = 4
RETRY_S = 15.0  # the first wait before a release that failed is tried again
RETRY_MAX_S = 120.0
WATCH_S = 15.0  # how often the cloud is asked whether a busy VM is still there (without `recover.watch_s`)
log = logging.getLogger(__name__)


def attempt_dir(results_dir: Path, trial: int, attempt: int) -> Path:
    return results_dir / "trials" / f"t{trial:04d}-a{attempt}"


@dataclass
class _Handle:
    """An attempt in flight: its cluster, its stop token (run/stop.py), where it is."""

    cluster: str
    token: StopToken = field(init=False)
    phase: str = "starting"
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)  # the attempt's thread is over
    puller: Puller | None = None  # keeps the attempt's newest checkpoint on the laptop
    carry: Path | None = None  # a checkpoint carried over from a preempted attempt: uploaded before the job

    def __post_init__(self) -> None:
        self.token = StopToken(self.cluster)

    def lost_with_vm(self) -> bool:
        """Its VM went under it and whoever saw it first (the watcher, or the attempt's own failure)
        reported it (VmGone): nothing else reports this attempt."""
        return self.token.gone() is not None


class TrialReporter:
    """The pipeline's Reporter for one attempt: its phase is noted, warnings go on, chatter is
    dropped. It decides nothing: a stop is the attempt's token; the reserve, the carry, the
    checkpoint puller and the epochs' values are the attempt's policy (run/controller.py `Trial`)."""

    def __init__(self, backend: PipelineBackend, key: tuple[int, int], handle: _Handle) -> None:
        self.backend = backend
        self.key = key
        self.handle = handle

    def phase_start(self, phase: str, detail: str = "") -> None:
        self.handle.phase = phase

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        return None

    def log_line(self, line: str, node: int = 0) -> None:
        return None

    def progress(self, event: dict[str, Any]) -> None:
        return None

    def info(self, message: str) -> None:
        return None

    def warn(self, message: str) -> None:
        self.backend.warn(f"trial {self.key[0]}: {message}")


class _Quiet(TrialReporter):
    def __init__(self, backend: PipelineBackend, what: str) -> None:
        self.backend = backend
        self.what = what

    def phase_start(self, phase: str, detail: str = "") -> None:
        return None

    def warn(self, message: str) -> None:
        self.backend.warn(f"{self.what}: {message}")


class PipelineBackend:
    def __init__(self, sweep_id: str, base: LoadedRecipe, spec: SweepSpec, config: Config, results_dir: Path,
                 warn: Callable[[str], None]) -> None:
        self.sweep_id = sweep_id
        self.base = base
        self.spec = spec
        self.config = config
        self.results_dir = results_dir
        self.warn = warn
        self._events: queue.Queue[Event] = queue.Queue()
        self._boots: dict[str, threading.Thread] = {}
        self.handles: dict[tuple[int, int], _Handle] = {}
        self._threads: list[threading.Thread] = []
        self._leases: dict[str, float] = {}  # VM -> the lease end its nodes hold (as written here)
        self._release_failures: dict[str, int] = {}  # VM -> releases that failed so far (paces retries)
        # One watcher setting: a recipe's `recover.watch_s` (in force for spot) paces the sweep's watcher,
        # which owns the loss of a trial's VM (the trial runs without the pipeline's recovery).
        recovery = base.recipe.recovery
        self.watch_s = recovery.watch_s if recovery is not None else WATCH_S
        self.lease_note = lease_note(base)  # why this sweep's VMs take no lease, or None

    # plumbing --------------------------------------------------------------------------------------

    def put(self, event: Event) -> None:
        self._events.put(event)

    def _lifecycle(self):
        from cloudtrain.cluster.lifecycle import Lifecycle
        from cloudtrain.state import StateStore

        return Lifecycle(StateStore(), self.config)

    def _spawn(self, name: str, fn: Callable[[], None],
               fallback: Callable[[str], Event] | None = None) -> threading.Thread:
        """Run fn in a thread. One that dies of an unexpected error says so and, with a fallback,
        still answers the scheduler (which would otherwise wait for that VM or attempt forever)."""

        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001  a thread must never die silently
                error = f"internal error: {type(exc).__name__}: {exc}"
                self.warn(f"{name}: {error}")
                if fallback is not None:
                    self.put(fallback(error))

        thread = threading.Thread(target=body, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def cluster(self, vm: str) -> str:
        return cluster_name(self.sweep_id, int(vm.lstrip("v")))

    def busy(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, end - time.monotonic()))

    # Backend ---------------------------------------------------------------------------------------

    def launch(self, action: Launch) -> None:
        name = self.cluster(action.vm)

        def boot() -> None:
            from cloudtrain.run.pipeline import Executor
            from cloudtrain.run.watchdog import lease_until
            from cloudtrain.sweep.spec import base_recipe

            lc = self._lifecycle()
            try:
                lc.wait_timeout_s = max(30.0, action.ready_by - time.time())
                # The lease goes in the launch request itself: a VM whose CLI dies while it boots (before
                # its nodes can be given the lease) still goes by its lease end.
                deadline = None if self.lease_note is not None else lease_until(action.lease_end,
                                                                                self.spec.costs.release_s)
                cluster, _ = Executor(lc, _Quiet(self, name)).up(base_recipe(self.base), name, deadline_at=deadline)
                self._give_lease(lc, action.vm, action.lease_end)
                self.put(VmReady(action.vm, time.time(), cluster.record.hourly_price))
            except Exception as exc:  # noqa: BLE001
                why = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
                self.put(self._take_down(lc, action.vm, why, booting=True))
            finally:
                lc.store.close()

        # A boot that died may have left a VM: counted to its lease end, and taken down again.
        self._boots[action.vm] = self._spawn(f"boot {name}", boot,
                                             lambda error: ReleaseFailed(action.vm, time.time(), error))

    def run(self, action: Start) -> None:
        key = (action.trial, action.attempt)
        handle = _Handle(self.cluster(action.vm))
        self.handles[key] = handle

        def attempt() -> None:
            from cloudtrain.run.pipeline import Executor

            lc = self._lifecycle()
            outcome, value, error = Outcome.FAILED, None, None
            try:
                loaded, env = trial_recipe(self.base, dict(action.params))
                # The scheduler owns the retry of a lost attempt (on a VM it counts): not the pipeline's
                # recovery too, which a spot recipe has on by default (issue 36.1: one owner per loss).
                loaded = loaded.model_copy(update={"recipe": loaded.recipe.model_copy(update={"recover": None})})
                env.update({DEADLINE_ENV: str(int(action.job_deadline_s)), "CLOUDTRAIN_SWEEP_ID": self.sweep_id,
                            "CLOUDTRAIN_SWEEP_TRIAL": str(action.trial),
                            "CLOUDTRAIN_SWEEP_ATTEMPT": str(action.attempt),
                            CHECKPOINT_ENV: checkpoints.node_dir(action.trial)})
                runs = attempt_dir(self.results_dir, action.trial, action.attempt)
                runs.mkdir(parents=True, exist_ok=True)
                self._checkpoints(lc, handle, action.trial, action.attempt)
                # Before the job: the old lease may end before this attempt would.
                self._give_lease(lc, action.vm, action.lease_end)
                # One attempt (the scheduler retries): the reserve and the carried checkpoint before the
                # job, epochs to the checkpoint puller, the attempt's token checked between phases.
                policy = Trial(handle.token, action.job_start_by, checkpoints.node_dir(action.trial),
                               lambda message: self.warn(f"trial {action.trial}: {message}"), handle.puller,
                               handle.carry, on_epoch=lambda event: self._epoch_value(key, event))
                result = Executor(lc, TrialReporter(self, key, handle)).run(loaded, handle.cluster, "keep", runs,
                                                                            env_overrides=env, policy=policy)
                outcome, value, error = self.judge(result.run_dir, result.status, result.exit_code, result.error,
                                                   handle)
            except Exception as exc:  # noqa: BLE001  (a usage error of one trial ends that trial only)
                error = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
                outcome = Outcome.STOPPED if handle.token.is_set() else Outcome.FAILED
            if handle.puller is not None:
                handle.puller.close()
            try:
                gone = None
                if outcome == Outcome.FAILED:
                    gone = self._vanished(lc, handle.cluster)
                if gone is not None and handle.token.stop(StopKind.NODE_GONE, gone):
                    # Its VM went away under it, seen here first: the scheduler ends the attempt as
                    # preempted (and retries it).
                    self.put(self._take_down(lc, action.vm, gone))
                elif handle.lost_with_vm():
                    # The watcher saw its VM go and reported it (VmGone: the scheduler retries the
                    # attempt as preempted); one report per loss.
                    pass
                else:
                    self.put(AttemptEnded(action.trial, action.attempt, time.time(), outcome, value, error))
            finally:
                lc.store.close()
                handle.phase = "done"
                handle.done.set()

        watcher = self._watcher(action.vm, handle)

        def attempt_then_done() -> None:
            try:
                attempt()
            finally:
                handle.done.set()
                watcher.stop(join=False)  # also when the attempt died of an internal error

        handle.thread = self._spawn(
            f"trial {action.trial}", attempt_then_done,
            lambda error: AttemptEnded(action.trial, action.attempt, time.time(), Outcome.FAILED, error=error))
        self._spawn(f"watch {handle.cluster}", watcher.run)

    def _watcher(self, vm: str, handle: _Handle) -> Watcher:
        """Run's cloud watcher on the attempt's VM (run/recover_watch.py): a VM that vanished is seen
        within watch_s, not after the SSH retries of the attempt's pipeline (minutes). It sets the
        attempt's token (its connections give up); the attempt ends as preempted, its VM billed
        until the cloud says it went. Any gone counts here, a `down` behind the sweep's back too."""
        from cloudtrain.run.recover_watch import Watcher

        def lost(found: Gone) -> None:
            lc = self._lifecycle()
            try:
                self.put(self._take_down(lc, vm, self._why(found)))
            finally:
                lc.store.close()

        return Watcher(self._lifecycle, handle.cluster, self.watch_s, handle.token, self.warn, recovering=False,
                       on_gone=lost)

    def _checkpoints(self, lc: Any, handle: _Handle, trial: int, attempt: int) -> None:
        """The attempt's checkpoint keeper, and the checkpoint its preempted predecessors kept (if any),
        copied into its own directory (so a second preemption carries it on)."""
        kept = attempt_dir(self.results_dir, trial, attempt) / checkpoints.KEPT
        if attempt > 1:
            source = checkpoints.carried(lambda k: attempt_dir(self.results_dir, trial, k),
                                         lc.store.sweep_attempts(self.sweep_id), trial, attempt)
            if source is not None and not kept.exists():
                shutil.copytree(source, kept)
            if source is not None:
                handle.carry = kept
        name = handle.cluster

        def open_node() -> tuple[Any, Callable[[], None]]:
            from cloudtrain.cluster.nodes import open_rank0

            return open_rank0(self._lifecycle(), name)

        handle.puller = checkpoints.Puller(open_node, kept, self.base.recipe.job is not None, trial, self.warn)

    def _give_lease(self, lc: Any, vm: str, lease_end: float) -> None:
        """Write the VM's lease to its nodes (when it is later than what they hold): the watchdog
        there deletes the machine before lease_end, whatever happens to this process."""
        if self.lease_note is not None or lease_end <= self._leases.get(vm, float("-inf")):
            return
        from cloudtrain.cluster.nodes import close_all, connect
        from cloudtrain.errors import RemoteError
        from cloudtrain.run.watchdog import lease_until, set_lease

        name = self.cluster(vm)
        cluster = lc.get(name)
        nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
        try:
            set_lease(cluster, nodes, lease_until(lease_end, self.spec.costs.release_s), f"sweep {self.sweep_id}")
        except CloudtrainError as exc:
            raise RemoteError(f"could not give {name} its lease (the VM would outlive a dead CLI): "
                              f"{exc.one_line()}") from exc
        finally:
            close_all(nodes)
        self._leases[vm] = lease_end

    def _vanished(self, lc: Any, name: str) -> str | None:
        """Why the cluster is gone (preempted, deleted by its lease, stopped by its cloud, taken down
        behind the sweep's back), or None while it is up or nobody can tell: run's one rule
        (run/gone.py), which asks the cloud once (and so puts its answer in the ledger). Every kind
        of gone is a lost VM to a sweep; the caller takes down what is left (`_take_down`)."""
        from cloudtrain.run.gone import ask

        found = ask(lc, name, self.warn)
        return self._why(found) if found is not None else None

    @staticmethod
    def _why(found: Gone) -> str:
        """A lost VM in the sweep's words (the VM's and its attempt's reason)."""
        if found.kind is GoneKind.TAKEN_DOWN:
            return f"{found} (`cloudtrain down` behind the sweep's back)"
        return f"cluster {found.cluster} is {found.state}: {found} (preempted, or deleted by its lease)"

    def cancel(self, action: Cancel) -> None:
        handle = self.handles.get((action.trial, action.attempt))
        # The first stop wins: an attempt stopped already (its VM lost, cancelled) is not cancelled again.
        if handle is None or not handle.token.stop(StopKind.STOPPED, action.reason):
            return

        def end_jobs() -> None:
            from cloudtrain.run.attach import cancel

            lc = self._lifecycle()
            try:
                # A job submitted just after a cancel must not escape it: cancel until the attempt is over.
                while handle.thread is None or handle.thread.is_alive():
                    try:
                        cancel(lc, handle.cluster, None, all_jobs=True)
                    except CloudtrainError as exc:
                        self.warn(f"could not cancel trial {action.trial} on {handle.cluster}: {exc.one_line()}")
                    if handle.thread is not None:
                        handle.thread.join(2.0)
                    else:
                        time.sleep(0.5)
            finally:
                lc.store.close()

        self._spawn(f"cancel trial {action.trial}", end_jobs)

    def release(self, action: Release) -> None:
        name = self.cluster(action.vm)
        boot = self._boots.get(action.vm)
        failures = self._release_failures.get(action.vm, 0)

        def down() -> None:
            if boot is not None:
                boot.join()  # an `up` cannot be interrupted; take down what it made
            if failures:
                # A retry: give the cloud's trouble (throttling, an outage) time to pass.
                time.sleep(min(RETRY_MAX_S, RETRY_S * 2 ** (failures - 1)))
            lc = self._lifecycle()
            try:
                self.put(self._take_down(lc, action.vm, "released"))
            finally:
                lc.store.close()

        self._spawn(f"release {name}", down, lambda error: ReleaseFailed(action.vm, time.time(), error))

    def _take_down(self, lc: Any, vm: str, why: str, *, booting: bool = False) -> Event:
        """`down` the VM's cluster (tried RELEASE_TRIES times) and say what came of it: gone (VmGone,
        or VmFailed for a boot given up), at the time the ledger has it stop billing, or ReleaseFailed
        while the cloud may still bill it."""
        name = self.cluster(vm)
        error = None
        at: float | None = None
        for attempt in range(RELEASE_TRIES):
            try:
                lc.down(name)
                at = ledger.gone_at(lc.store, name)
                error = None
                break
            except Exception as exc:  # noqa: BLE001  whatever stopped it, the VM is not confirmed gone
                error = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
                if attempt < RELEASE_TRIES - 1:
                    time.sleep(min(30.0, 2.0 * 2 ** attempt))
        if error is not None:
            failures = self._release_failures[vm] = self._release_failures.get(vm, 0) + 1
            what = f"{why}; " if why != "released" else ""
            self.warn(f"could not take down {name} ({what}{error}); it is counted until its lease end and taken "
                      f"down again (try {failures + 1} next); `cloudtrain down {name}` does it by hand")
            return ReleaseFailed(vm, time.time(), f"{what}down failed: {error}")
        # Never billed (a machine nobody bills, or a launch that never got an answer): now.
        at = at or time.time()
        if booting:
            return VmFailed(vm, at, why)
        return VmGone(vm, at, why)

    def events(self, timeout_s: float) -> list[Event]:
        out: list[Event] = []
        try:
            out.append(self._events.get(timeout=timeout_s))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    # judging a finished run ------------------------------------------------------------------------

    def _epoch_value(self, key: tuple[int, int], event: dict[str, Any]) -> None:
        """An epoch's value of the sweep's progress metric, for the scheduler (pruning)."""
        value = event.get(self.spec.progress_metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.put(Progress(key[0], key[1], int(event["epoch"]), float(value)))

    def judge(self, run_dir: Path, status: str, exit_code: int | None, error: str | None,
              handle: _Handle | None) -> tuple[Outcome, float | None, str | None]:
        from cloudtrain.state import RunStatus

        if status == RunStatus.SUCCEEDED:
            value, problem = read_metric(run_dir, self.spec.metric)
            return Outcome.SUCCEEDED, value, problem
        if handle is not None and handle.token.is_set():
            return Outcome.STOPPED, None, error
        if exit_code == 124:
            minutes = self.spec.costs.deadline_s / 60
            return Outcome.TIMEOUT, None, f"the job reached its deadline ({minutes:g} min) and was stopped on the node"
        return Outcome.FAILED, None, error or f"{status} (exit code {exit_code})"

    # recovery --------------------------------------------------------------------------------------

    def recover(self, snapshot: Snapshot, unreachable: Mapping[str, str] | None = None) -> list[Event]:
        """`unreachable`: {VM: why} this machine cannot use (a team's other machine launched them,
        session.py): taken down as the VMs that vanished are, their attempts ended."""
        from cloudtrain.cluster.lifecycle import Lifecycle
        from cloudtrain.config import ALL_OWNERS
        from cloudtrain.state import ClusterStatus

        events: list[Event] = []
        lc = self._lifecycle()
        # Another machine's VMs, key pair and firewall carry its owner tag: taken down with every
        # owner's tags in view (as `down --force` of a teammate's cluster, cli/cluster.py).
        theirs = Lifecycle(lc.store, self.config.model_copy(update={"owner": ALL_OWNERS}), lc.reporter)
        try:
            # VMs that went away while no CLI ran (their lease ended, or preempted): state still calls
            # them up. One describe per VM.
            vanished: dict[str, str] = dict(unreachable or {})
            for vm in snapshot.vms:
                if vm.live and vm.id not in vanished:
                    why = self._vanished(lc, self.cluster(vm.id))
                    if why is not None:
                        vanished[vm.id] = why
            for attempt in snapshot.attempts:
                if attempt.running:
                    events += self._recover_attempt(lc, attempt.trial, attempt.attempt, attempt.vm,
                                                    attempt.stopping, vanished.get(attempt.vm))
            now = time.time()
            for vm in snapshot.vms:
                if not vm.live:
                    continue
                name = self.cluster(vm.id)
                record = lc.store.get_cluster(name)
                if vm.id in vanished or record is None or record.status != ClusterStatus.UP:
                    # Taken down here, and gone when the ledger says (never billed: never launched).
                    booting = vm.state == VmState.BOOTING
                    why = f"cluster {name} did not come up" if booting else (vanished.get(vm.id)
                                                                          or f"cluster {name} is gone")
                    events.append(self._take_down(theirs if vm.id in (unreachable or {}) else lc, vm.id, why,
                                                  booting=booting))
                elif vm.state == VmState.BOOTING:
                    events.append(VmReady(vm.id, now, record.hourly_price))
        finally:
            lc.store.close()
        return events

    def _recover_attempt(self, lc: Any, trial: int, number: int, vm: str, stopping: str | None,
                         vanished: str | None = None) -> list[Event]:
        from cloudtrain.state import RunStatus

        cluster = self.cluster(vm)
        # By the attempt's directory name: another machine (a team's) kept its results elsewhere.
        runs_dir = attempt_dir(self.results_dir, trial, number).resolve()
        run = next((r for r in lc.store.list_runs(cluster=cluster, limit=1000)
                    if r.run_dir and Path(r.run_dir).parent.name == runs_dir.name), None)
        now = time.time()
        if run is None:
            return [AttemptEnded(trial, number, now, Outcome.NOT_STARTED, error="the CLI died before it started")]
        handle = _Handle(cluster)
        if stopping is not None:
            handle.token.stop(StopKind.STOPPED, stopping)
        self.handles[(trial, number)] = handle
        if run.status != RunStatus.RUNNING and Path(run.run_dir or "").parent != runs_dir:
            # It ended, and its results are on the machine that ran it: nothing here to judge.
            return [AttemptEnded(trial, number, run.ended_at or now, Outcome.LOST,
                                 error=f"its results are in {run.run_dir} on another machine")]
        if run.status != RunStatus.RUNNING:
            outcome, value, error = self.judge(Path(run.run_dir or ""), run.status, run.exit_code, run.error, handle)
            return [AttemptEnded(trial, number, run.ended_at or now, outcome, value, error)]
        job = lc.store.get_job(f"{run.id}-run")
        if job is not None and vanished is not None:
            # Its job ran, but the VM and its results are gone: the VM's VmGone ends the attempt as
            # preempted (and `recover` takes down what state still holds of it).
            lc.store.update_run(run.id, status=RunStatus.ABANDONED, ended_at=now, error=vanished)
            return []
        if job is None or lc.store.get_cluster(cluster) is None:
            # The CLI died in provisioning, sync or setup: end what it left, the job never started.
            if vanished is not None:
                lc.store.update_run(run.id, status=RunStatus.ABANDONED, ended_at=now, error=vanished)
            else:
                self._end_run(lc, run, "the sweep CLI died before the job started")
            return [AttemptEnded(trial, number, now, Outcome.NOT_STARTED, error="the CLI died before the job started")]
        self._checkpoints(lc, handle, trial, number)
        watcher = self._watcher(vm, handle)
        handle.thread = self._spawn(f"reattach trial {trial}",
                                    lambda: self._reattach(trial, number, run, handle, watcher))
        self._spawn(f"watch {cluster}", watcher.run)
        return []

    def _reattach(self, trial: int, number: int, run: Any, handle: _Handle, watcher: Watcher) -> None:
        """Follow a job the dead CLI started until it ends, bring its results home, judge it."""
        from cloudtrain.cluster.nodes import close_all, connect
        from cloudtrain.run.collect import collect
        from cloudtrain.run.follow import follow

        lc = self._lifecycle()
        key = (trial, number)
        outcome, value, error = Outcome.LOST, None, None
        nodes: list = []
        try:
            cluster = lc.get(handle.cluster)
            nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
            handle.phase = "run"
            # Its epochs as in the attempt the dead CLI ran: the checkpoint puller, the values.
            epochs = Trial(handle.token, math.inf, checkpoints.node_dir(trial), self.warn, handle.puller,
                           on_epoch=lambda event: self._epoch_value(key, event))
            final = follow(nodes[0], f"{run.id}-run", 0, TrialReporter(self, key, handle), others=nodes[1:],
                           stop=handle.token, on_event=epochs.progress)
            handle.phase = "collect"
            paths = json.loads(run.result_paths) if run.result_paths else []
            run_dir = Path(run.run_dir)
            got = collect(nodes, run.id, paths, run_dir, window_s=lc.config.ssh.connect_retries_s, warn=self.warn)
            succeeded = final.state == "succeeded" and got.complete
            status = "succeeded" if succeeded else "failed"
            why = None if succeeded else (got.error and f"collect failed: {got.error}") or f"job {final.state}"
            self._record(lc, run, cluster, status, final.exit_code, why, got)
            outcome, value, error = self.judge(run_dir, status, final.exit_code, why, handle)
        except CloudtrainError as exc:
            error = f"could not follow the job again: {exc.one_line()}"
            self._end_run(lc, run, error)
        finally:
            if handle.puller is not None:
                handle.puller.close()
            close_all(nodes)
            lc.store.close()
            handle.phase = "done"
            handle.done.set()
            watcher.stop(join=False)
        if not handle.lost_with_vm():  # the watcher reported its VM gone (VmGone): one report per loss
            self.put(AttemptEnded(trial, number, time.time(), outcome, value, error))

    def _record(self, lc: Any, run: Any, cluster: Any, status: str, exit_code: int | None, error: str | None,
                got: Any) -> None:
        """run.json and the run row for a run whose own CLI died (what `run` would have written)."""
        from cloudtrain.cost import cost_usd
        from cloudtrain.run.record import RunJson

        ended = time.time()
        hourly = cluster.record.hourly_price
        cost = cost_usd(hourly, ended - run.started_at)
        RunJson(run_id=run.id, status=status, exit_code=exit_code, error=error,
                recipe={"name": self.base.recipe.name, "path": run.recipe_path or "", "digest": run.recipe_digest or ""},
                cluster=cluster.record.name, provider=cluster.provider.name, instance_type=cluster.record.instance_type,
                num_nodes=len(cluster.nodes), hourly_price_usd=hourly, cost_usd=round(cost, 6), phases_s={},
                started_at=run.started_at, ended_at=ended, wall_time_s=round(ended - run.started_at, 3),
                teardown="kept", job_id=f"{run.id}-run", result_paths=tuple(json.loads(run.result_paths or "[]")),
                results=tuple(sorted(got.files)), refused=tuple((x.member, x.reason) for x in got.refused),
                collect_error=got.error, collect_attempts=got.attempts).write(Path(run.run_dir))
        lc.store.update_run(run.id, status=status, exit_code=exit_code, ended_at=ended, cost_usd=cost,
                            hourly_price=hourly, error=error)

    def _end_run(self, lc: Any, run: Any, error: str) -> None:
        from cloudtrain.run.attach import cancel
        from cloudtrain.state import RunStatus

        try:
            if lc.store.get_cluster(run.cluster) is not None:
                cancel(lc, run.cluster, None, all_jobs=True)
        except CloudtrainError as exc:
            self.warn(f"could not end the jobs of {run.cluster}: {exc.one_line()}")
        lc.store.update_run(run.id, status=RunStatus.ABANDONED, ended_at=time.time(), error=error)


def read_metric(run_dir: Path, metric: str) -> tuple[float | None, str | None]:
    """The sweep metric from the run's metrics.json, or None and why not."""
    import math

    from cloudtrain.compare import CompareError, find_metrics

    try:
        source = find_metrics(run_dir)
        data: Mapping[str, Any] = json.loads(source.read_text())
    except (CompareError, OSError, ValueError) as exc:
        return None, f"no metrics: {exc}"
    value = data.get(metric) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, f"{source.name} has no numeric {metric!r}"
    return float(value), None
