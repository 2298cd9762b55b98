"""`run`, the whole pipeline: check -> provision -> prepare -> sync -> setup -> job -> collect -> teardown.

Each step lives in its own module (run/prepare.py, run/job.py, run/follow.py, run/collect.py); this
one orders them and owns what a run is: its record, its phases, and cleanup that always happens.
Teardown and collection happen in `finally`, so a failed job, an error or Ctrl-C still brings the
logs home and leaves nothing running that the policy says should be gone. Provision to job is an
attempt, run by the one Controller under the run's policy (run/controller.py: once, recovering, a
sweep trial). A recovering run collects inside each attempt instead (run/recover.py: a node lost
while collecting is relaunched), and its `finally` uses that collection.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cloudtrain import procid
from cloudtrain.notify import hooks as notify
from cloudtrain.cost import spend
from cloudtrain.shield import no_interrupts as _no_interrupts
from cloudtrain.shield import signal_name as _signal_name
from cloudtrain.run import approval
from cloudtrain.run.approval import Approver
from cloudtrain.run.collect import Collected, collect, empty_warning
from cloudtrain.run.controller import Controller, Once, Policy
from cloudtrain.errors import CloudtrainError, JobFailedError, RemoteError, UsageError
from cloudtrain.events import Reporter
from cloudtrain.remote.jobs import OPEN_STATES
from cloudtrain.run.jobstate import refresh_jobs
from cloudtrain.cluster.liveness import AliveMarks
from cloudtrain.cluster.lifecycle import Cluster, Lifecycle
from cloudtrain.cluster.nodes import Node, close_all, connect, on_all
from cloudtrain.recipe import LoadedRecipe, Recipe
from cloudtrain.providers.base import Schedules, can_stop, supports
from cloudtrain.remote.archive import Refused
from cloudtrain.run.job import end_jobs, run_job
from cloudtrain.run.prepare import job_script, prepare, sync, write_ssh_config
from cloudtrain.run.record import RunJson
from cloudtrain.run.stop import StopToken
from cloudtrain.buckets.steps import (bucket_mounts, copy_in, refresh_grants, upload, upload_destination,
                                      without_buckets)
from cloudtrain.state import ClusterStatus, RunRecord, RunStatus

Teardown = Literal["auto", "down", "stop", "keep"]
POLL_S = 0.5
# The phases of an attempt: none of them starts once the attempt's stop token is set (run/stop.py).
# Upload, recover and teardown are the run's, after or between attempts: they always go on.
ATTEMPT_PHASES = frozenset({"provision", "sync", "data", "setup", "run", "collect"})


@dataclass(frozen=True)
class RunResult:
    run_id: str
    run_dir: Path
    status: str  # succeeded | failed | interrupted
    exit_code: int | None
    cost_usd: float
    phases: dict[str, float]
    error: str | None = None
    teardown: str = "none"
    refused: tuple[Refused, ...] = ()
    empty_result_paths: tuple[str, ...] = ()  # result paths node 0 had nothing under (run.json's too)


@dataclass
class _Outcome:
    """How a phase ended when it did not raise: a phase may fail softly (collect, teardown)."""

    ok: bool = True
    detail: str = ""


@dataclass
class _PhaseClock:
    reporter: Reporter
    timings: dict[str, float] = field(default_factory=dict)
    # The run's spend so far (None while nothing bills): every phase line carries it, a cost meter.
    spent: Callable[[], float | None] = lambda: None
    # The current attempt's stop (run/stop.py), set by the run's policy (run/controller.py): a sweep
    # trial's, or each recovering attempt's own. Checked here, between phases, in the run's own thread.
    stop: StopToken | None = None

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[_Outcome]:
        if self.stop is not None and name in ATTEMPT_PHASES:
            self.stop.check()
        self.reporter.phase_start(name, detail)
        start = time.monotonic()
        outcome = _Outcome(ok=False)
        try:
            outcome.ok = True
            yield outcome
        except BaseException as exc:
            outcome.ok = False
            # A lost node ends the phase; what happens next (recover) is said once, by its own phase.
            stopped = self.stop.reason if self.stop is not None else None
            outcome.detail = outcome.detail or getattr(exc, "phase_note", "") or (stopped.note if stopped else "")
            raise
        finally:
            elapsed = time.monotonic() - start
            self.timings[name] = round(self.timings.get(name, 0.0) + elapsed, 3)
            spent = self.spent()
            meter = f"${spent:.4f} spent" if spent else ""
            detail = "; ".join(d for d in (outcome.detail, meter) if d)
            self.reporter.phase_end(name, elapsed, detail=detail, ok=outcome.ok)


@dataclass
class _Run:
    """What one `run` has done so far: cleanup undoes exactly this, and run.json reports it."""

    run_id: str
    run_dir: Path
    loaded: LoadedRecipe
    clock: _PhaseClock
    started: float
    cluster: Cluster | None = None
    created: bool = False
    nodes: list[Node] = field(default_factory=list)
    jobs_started: list[str] = field(default_factory=list)
    cluster_started: float = 0.0
    was_stopped: bool = False  # the run found the cluster stopped (and started it)
    status: str = RunStatus.FAILED
    exit_code: int | None = None
    error: str | None = None
    uploaded: str | None = None  # the bucket URL the results went to (recipe `upload:`), once tried
    recovery: Any = None  # run/recover.Recovery when the recipe recovers from lost nodes
    policy: Policy = field(default_factory=Once)  # "again or done" of its attempts (run/controller.py)
    # What a recovering run's last attempt collected (inside the attempt, so that a node lost while
    # collecting is relaunched like any loss); _finish then does not collect a second time.
    collected: Collected | None = None
    # Another command's `down` removed the cluster under this run (Pipeline._taken_down): nothing
    # is left to end, collect from or tear down.
    gone: bool = False

    @property
    def job_id(self) -> str:
        return f"{self.run_id}-run"

    def fail(self, error: str) -> None:
        self.error = self.error or error
        if self.status == RunStatus.SUCCEEDED:
            self.status = RunStatus.FAILED


def _keep_bootstrap_log(exc: CloudtrainError, run_dir: Path, reporter: Reporter) -> None:
    """A node that could not be made ready: its whole bootstrap log goes into the run directory
    (the error shows only the failing step's last lines)."""
    from cloudtrain.errors import BootstrapError

    if isinstance(exc, BootstrapError) and exc.log:
        try:
            (run_dir / "bootstrap.log").write_text(exc.log)
        except OSError as err:
            reporter.warn(f"could not keep the bootstrap log in {run_dir}: {err}")


def new_run_id(cluster: str) -> str:
    return f"{cluster}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class Executor:
    def __init__(self, lifecycle: Lifecycle, reporter: Reporter, approve: Approver | None = None) -> None:
        self.lc = lifecycle
        self.store = lifecycle.store
        self.config = lifecycle.config
        self.reporter = reporter
        # Asked before anything starts billing (cli/approve.py); None: the caller approved already
        # (a sweep approves its budget once, not every VM).
        self.approve = approve
        self._restarted: set[str] = set()  # clusters found stopped behind our back and started again
        # cluster -> UsablePlan checked before anything existed (a recovering run narrows it)
        self.usable: dict[str, Any] = {}

    # run -----------------------------------------------------------------------------------------

    def check(self, loaded: LoadedRecipe, cluster_name: str, teardown: Teardown) -> None:
        """Every static check, before a run directory, state row, key or cloud call exists."""
        from cloudtrain.cluster.lifecycle import check_stop_possible
        from cloudtrain.names import check_cluster_name
        from cloudtrain.preflight import preflight

        check_cluster_name(cluster_name)
        preflight(loaded, self.config)
        existing = self.store.get_cluster(cluster_name)
        if teardown == "stop":
            spot = loaded.recipe.resources.spot or bool(existing and existing.spot)
            check_stop_possible(self.lc.provider(loaded.recipe.resources.cloud), spot)
        if existing is None and self.lc.launches_priced(loaded.recipe):
            # Missing credentials are bad input: one line, exit 2, before any run directory exists.
            # The plan made with them is the one the launch uses (no second credentials call).
            from cloudtrain.cluster.planning import plan_with_credentials

            self.usable[cluster_name] = usable = plan_with_credentials(loaded.recipe, self.config)
            if self.approve is not None:
                self.approve(approval.for_launch(cluster_name, loaded.recipe, usable))
        elif (existing is not None and existing.status == ClusterStatus.STOPPED and self.approve is not None
              and self.lc.provider(existing.provider).traits.priced):
            self.approve(approval.for_start(cluster_name, loaded.recipe, existing.provider, existing.region,
                                            existing.instance_type, existing.num_nodes, existing.hourly_price))

    def run(self, loaded: LoadedRecipe, cluster_name: str, teardown: Teardown, runs_dir: Path,
            env_overrides: Mapping[str, str] | None = None, resume: RunRecord | None = None,
            policy: Policy | None = None) -> RunResult:
        """`env_overrides` (`run --env KEY=VALUE`) replace or add to the recipe's envs for this run;
        like envs they are exported for setup and the job and never written to state or run.json.
        `resume`: a recovering run whose CLI died goes on, in its own row and run directory
        (run/recover.resume checks it may). `policy`: its controller's (a sweep trial's,
        run/controller.Trial); None: the recipe's (recovering with `recover:`, else once)."""
        if env_overrides:
            recipe = loaded.recipe.model_copy(update={"envs": {**loaded.recipe.envs, **env_overrides}})
            loaded = loaded.model_copy(update={"recipe": recipe})
        recipe = loaded.recipe
        self.check(loaded, cluster_name, teardown)
        if self.store.get_cluster(cluster_name) is not None:
            # Refused before a run row or directory exists: a refused run is no failed run. (lc.up
            # checks again under the cluster's lock, for a run that starts meanwhile.)
            self.lc.refuse_if_busy(cluster_name)
        if resume is not None and resume.run_dir:
            r = _Run(resume.id, Path(resume.run_dir), loaded, _PhaseClock(self.reporter), resume.started_at)
            r.run_dir.mkdir(parents=True, exist_ok=True)
            self.store.update_run(resume.id, status=RunStatus.RUNNING, ended_at=None, error=None, pid=os.getpid(),
                                  driver=procid.identity())
        else:
            r = self._new_run(loaded, cluster_name, runs_dir)
        # This run's incarnation only, also once `down` removed its row: never the spend of an
        # earlier cluster of the same name (the meter must say what `cost` says of this run).
        r.clock.spent = lambda: (self.spent(cluster_name, r.started, incarnation=r.cluster.record.uid)
                                 if r.cluster is not None else None)
        run_id, run_dir = r.run_id, r.run_dir
        notify.run_started(self.store, self.config, loaded, run_id, cluster_name, run_dir, warn=self.reporter.warn)
        usage_error: UsageError | None = None
        # While this run holds the cluster its machines say so on their tags: `gc` from another
        # state of this owner leaves them alone (cluster/liveness.py).
        marks = AliveMarks(self.store.path, self.lc.config, cluster_name)
        marks.start()
        try:
            from cloudtrain.run.recover import recovery_for

            if policy is None:
                # A lost node relaunches elsewhere and the job resumes from its newest checkpoint;
                # the results are collected inside the attempt, so that a loss while collecting is
                # one like any other (docs/recovery.md).
                r.recovery = recovery_for(self, r, cluster_name)
            r.policy = policy or r.recovery or Once()
            attempt = self._attempt_and_collect if r.policy.collects else self._attempt
            Controller(r.policy).run(r, lambda: attempt(r, cluster_name))
            self._upload(r)
            r.status, r.exit_code = RunStatus.SUCCEEDED, 0
        except KeyboardInterrupt:
            from cloudtrain.shield import defer_interrupts

            defer_interrupts()  # a second Ctrl-C is reported, never obeyed, until the command exits
            r.status, r.error = RunStatus.INTERRUPTED, "interrupted by the user"
            self.reporter.warn("interrupted: stopping the job, collecting logs, tearing down")
            end_jobs(self.store, self.reporter, r.nodes, r.jobs_started)
        except JobFailedError as exc:
            r.exit_code, r.error = exc.job_exit_code, exc.message
            if exc.cancelled:
                r.status = RunStatus.CANCELLED
            if self._taken_down(r):
                r.error = None  # the job ended because its cluster went: _gone says so
            else:
                end_jobs(self.store, self.reporter, r.nodes, r.jobs_started)
            if r.job_id in r.jobs_started and r.uploaded is None and not r.gone:
                self._upload(r, failed_job=True)  # a failed job's checkpoints matter as much
        except CloudtrainError as exc:
            r.error = exc.one_line()
            usage_error = exc if isinstance(exc, UsageError) else None
            _keep_bootstrap_log(exc, run_dir, self.reporter)
            if self._taken_down(r):
                r.error = None  # the job ended because its cluster went: _gone says so
            else:
                end_jobs(self.store, self.reporter, r.nodes, r.jobs_started)
        except Exception as exc:
            r.error = f"internal error: {type(exc).__name__}: {exc}"
            end_jobs(self.store, self.reporter, r.nodes, r.jobs_started)
            raise
        finally:
            try:
                result = self._finish(r, teardown)
            finally:
                marks.stop()
        if usage_error is not None:
            raise usage_error
        # Interrupted (INT, TERM or HUP, in any phase): the caller prints the run directory last
        # and exits 130.
        return result

    def _new_run(self, loaded: LoadedRecipe, cluster_name: str, runs_dir: Path) -> _Run:
        """A new run's directory and row."""
        recipe = loaded.recipe
        run_id = new_run_id(cluster_name)
        run_dir = (runs_dir / run_id).resolve()
        run_dir.mkdir(parents=True, exist_ok=False)
        r = _Run(run_id, run_dir, loaded, _PhaseClock(self.reporter), time.time())
        self.store.insert_run(RunRecord(
            id=run_id, cluster=cluster_name, recipe_path=str(loaded.path.resolve()), recipe_digest=loaded.digest,
            run_dir=str(run_dir), status=RunStatus.RUNNING, exit_code=None, provider=recipe.resources.cloud,
            instance_type=None, hourly_price=0.0, cost_usd=0.0, started_at=r.started, ended_at=None,
            pid=os.getpid(), result_paths=json.dumps(recipe.result_paths()), driver=procid.identity(),
        ))
        return r

    def _attempt(self, r: _Run, cluster_name: str) -> None:
        """Provision, sync, setup and the job: what a run does once (or, recovering, once per attempt)."""
        loaded, recipe, run_id = r.loaded, r.loaded.recipe, r.run_id
        with r.clock.phase("provision", recipe.resources.cloud):
            before = self.store.get_cluster(cluster_name)
            r.was_stopped = before is not None and before.status == ClusterStatus.STOPPED
            r.cluster, r.created = self.lc.up(recipe, cluster_name, str(loaded.path.resolve()), loaded.digest,
                                              run_id=run_id, usable=self.usable.get(cluster_name))
            r.cluster_started = time.time()
            r.nodes = self._ready_nodes(r.cluster, recipe, r.created)
            if cluster_name in self._restarted:
                r.was_stopped = True  # its watchdog had stopped it: "as the run found it" is stopped
        with r.clock.phase("sync"):
            on_all(r.nodes, lambda n: sync(n, without_buckets(loaded), self.reporter))
        self._copy_in(r)
        # A scheduler (Slurm) runs setup and the job as one batch job on the nodes it allocates.
        scheduler = r.cluster.provider if r.cluster is not None else None
        batch_job = scheduler.batch_job if supports(scheduler, Schedules) else None  # type: ignore[union-attr]
        if recipe.setup and batch_job is None:
            with r.clock.phase("setup"):
                run_job(self.store, self.reporter, r.nodes, run_id, f"{run_id}-setup", recipe.setup + "\n",
                        recipe, "setup", r.jobs_started, stop=r.clock.stop)
            from cloudtrain.run import setup_once

            setup_once.mark_done(r.nodes, recipe)  # an `exec` afterwards need not run it again
        with r.clock.phase("run"):
            # The policy's step on the job's nodes (a reporter only displays): a recovering run's
            # next attempt gets its kept checkpoint, a sweep trial checks its reserve and gets the
            # checkpoint its lost attempt kept (run/controller.py).
            r.policy.before_job(r.nodes)
            script = job_script(recipe)
            if batch_job is not None:
                script = batch_job(recipe, script, recipe.setup, r.job_id, cluster_name)
            # The attempt's token (a sweep trial's, or this recovering attempt's): a stop ends the
            # job's retry and poll waits at once, not after their backoff (run/follow.py `pause`).
            # The job's progress events go to the policy beside the reporter (its checkpoint puller).
            run_job(self.store, self.reporter, r.nodes, run_id, r.job_id, script, recipe, "job", r.jobs_started,
                    stop=r.clock.stop, on_event=r.policy.progress)

    def _attempt_and_collect(self, r: _Run, cluster_name: str) -> None:
        """A recovering run's attempt: the job, then its results home while the cloud watcher is
        still on (run/recover.py decides whether a collect that failed lost its node)."""
        r.collected = None
        self._attempt(r, cluster_name)
        r.collected = self._collect(r)
        if r.status == RunStatus.INTERRUPTED:  # Ctrl-C while collecting: the run ends, as in _finish
            raise KeyboardInterrupt

    def _copy_in(self, r: _Run) -> None:
        """The recipe's bucket data: every node copies it itself, with its own identity (docs/data.md)."""
        if r.cluster is not None and not r.created:
            refresh_grants(r.cluster, r.loaded.recipe)  # a reused cluster's identity: this recipe's buckets
        if bucket_mounts(r.loaded.recipe) and r.cluster is not None:
            with r.clock.phase("data"):
                copy_in(self.store, self.reporter, r.nodes, r.cluster.provider, r.run_id, r.loaded.recipe,
                        r.jobs_started, stop=r.clock.stop)

    def _upload(self, r: _Run, failed_job: bool = False) -> None:
        """`upload:` in the recipe: node 0 puts the results in the bucket, with its own identity."""
        recipe = r.loaded.recipe
        if not recipe.upload or r.cluster is None or not r.nodes:
            return
        r.uploaded = str(upload_destination(recipe, r.run_id))
        provider = r.cluster.provider

        def step() -> None:
            # No stop token: a stopped attempt's results still go to the bucket (as they come home).
            upload(self.store, self.reporter, r.nodes, provider, r.run_id, recipe, r.jobs_started)
        try:
            with r.clock.phase("upload"):
                if r.recovery is not None and not failed_job:
                    r.recovery.final_upload(step)  # a node lost meanwhile: the laptop finishes the upload
                else:
                    step()
        except CloudtrainError as exc:
            if not failed_job:
                raise
            self.reporter.warn(f"upload after the failed job: {exc.one_line()}")

    def _finish(self, r: _Run, teardown: Teardown) -> RunResult:
        recipe = r.loaded.recipe
        collected = Collected()
        if r.collected is not None:
            collected = r.collected  # collected inside the recovering run's last attempt
        elif r.nodes and self._taken_down(r):
            collected = Collected(error="the cluster was taken down")  # said once, by _gone
        elif r.nodes:
            collected = self._collect(r)
        with _no_interrupts() as signals:
            result = self._teardown_and_record(r, teardown, collected, signals)
        return result

    def _taken_down(self, r: _Run) -> bool:
        """Whether another command's `down` removed this run's cluster. Its `down` holds the
        cluster's lock from ending the jobs to removing the row, so a job that ended under it is
        seen here as a cluster gone, not as a node to collect from (settled() waits for the lock)."""
        if r.cluster is None or not r.jobs_started:
            return False
        if not r.gone:
            current = self.lc.settled(r.cluster.record.name)
            r.gone = current is None or current.uid != r.cluster.record.uid
        return r.gone

    def _collect(self, r: _Run) -> Collected:
        """Bring results home. Whatever goes wrong here (a signal, the laptop's disk full, the run
        directory deleted) is recorded and never skips teardown; results not home keep the node."""
        try:
            with r.clock.phase("collect") as outcome:
                # A machine known gone (the attempt's stop token says so) is not waited for.
                gone = r.clock.stop.gone if r.clock.stop is not None else None
                collected = collect(r.nodes, r.run_id, r.loaded.recipe.result_paths(), r.run_dir,
                                    window_s=self.config.ssh.connect_retries_s, warn=self.reporter.warn, gone=gone)
                outcome.ok = collected.complete
            return collected
        except KeyboardInterrupt:
            r.status, r.error = RunStatus.INTERRUPTED, "interrupted while collecting results"
            self.reporter.warn("interrupted while collecting: results stay on the node; tearing down safely")
            return Collected(error="interrupted")
        except Exception as exc:  # noqa: BLE001 - recorded, reported, and teardown still runs
            detail = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
            return Collected(error=detail)

    def _say_empty_results(self, r: _Run, collected: Collected, policy: str | None) -> None:
        """A `results:` path with nothing under it is most often a typo (`outputz`): said before the
        teardown, so that nobody learns it after the node that held the files is gone. `policy`:
        the teardown about to run (None: no cluster)."""
        if not collected.complete or not collected.empty_paths:
            return
        for path in collected.empty_paths:
            self.reporter.warn(empty_warning(path))
        if r.cluster is None or len(collected.empty_paths) < len(r.loaded.recipe.result_paths()):
            return
        name = r.cluster.record.name
        if policy == "down":
            # Whatever the job wrote elsewhere goes with the teardown: the machines on a cloud, the
            # workdir on this machine or your own hosts.
            what = (f"deletes {name}'s machines with everything on them" if r.cluster.provider.traits.owns_machines
                    else f"removes {name}'s workdir with what the job wrote there")
            self.reporter.warn(f"no result path held anything: the teardown that follows {what}; to look for the "
                               f"job's files, run again with `--keep` (then `cloudtrain exec {name} -- ls`)")
        else:
            start = f"`cloudtrain start {name}`, then " if policy == "stop" else ""
            self.reporter.warn(f"no result path held anything: the job's files stay on {name}; "
                               f"{start}`cloudtrain exec {name} -- ls` shows them")

    def _teardown_and_record(self, r: _Run, teardown: Teardown, collected: Collected, signals: list[int]) -> RunResult:
        recipe = r.loaded.recipe
        if r.nodes:
            for refused in collected.refused:
                self.reporter.warn(f"refused result {refused.member!r}: {refused.reason}")
            if not collected.complete and not r.gone:
                r.fail(f"collect failed: {collected.error}")
                self.reporter.warn(f"collect failed: {collected.error}")
        policy: str | None = None
        if r.cluster is not None:
            # Auto: leave things as they were found (a cluster this run made goes, one it started is
            # stopped again, one that was running keeps running).
            auto = "down" if r.created else ("stop" if r.was_stopped else "keep")
            policy = auto if teardown == "auto" else teardown
        if r.nodes and not r.gone:
            self._say_empty_results(r, collected, policy)
        hourly = r.cluster.record.hourly_price if r.cluster else 0.0
        teardown_done = "none"
        if r.cluster is not None and policy is not None:
            # Results that are not home live only on the node: never delete it under them.
            results_at_risk = bool(r.jobs_started) and not collected.complete
            try:
                with r.clock.phase("teardown", policy) as outcome:
                    teardown_done = self._teardown(r, policy, results_at_risk)
                    done_as_asked = {"down": "down", "stop": "stopped", "keep": "kept"}[policy] == teardown_done
                    outcome.ok = done_as_asked
                    outcome.detail = "" if done_as_asked else f"cluster {teardown_done} instead of {policy}"
            # Reported loudly, and recorded in run.json below; the user must know money may be burning.
            except Exception as exc:  # noqa: BLE001
                detail = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
                r.fail(f"teardown failed: {detail}")
                teardown_done = "failed"
                self.reporter.warn(f"teardown failed: {detail} - run `cloudtrain down {r.cluster.record.name}`")
        close_all(r.nodes)
        if signals and r.status != RunStatus.INTERRUPTED:
            # A signal during cleanup was not obeyed (teardown had to finish), but it is the answer.
            r.status = RunStatus.INTERRUPTED
            r.error = r.error or f"interrupted during cleanup ({_signal_name(signals[0])})"
        ended = time.time()
        # The run's share of its cluster's billed intervals (a reused cluster bills before and after).
        cost = ((self.spent(r.cluster.record.name, r.started, ended, r.cluster.record.uid) or 0.0)
                if r.cluster else 0.0)
        attempts: tuple[dict[str, Any], ...] = ()
        if r.recovery is not None:  # every attempt's incarnation, each billed on its own
            cost, attempts = r.recovery.settle(ended)
        record = RunJson(
            run_id=r.run_id, status=r.status, exit_code=r.exit_code, error=r.error,
            recipe={"name": recipe.name, "path": str(r.loaded.path.resolve()), "digest": r.loaded.digest},
            cluster=r.cluster.record.name if r.cluster else None,
            provider=r.cluster.provider.name if r.cluster else recipe.resources.cloud,
            instance_type=r.cluster.record.instance_type if r.cluster else None,
            num_nodes=recipe.num_nodes, hourly_price_usd=hourly, cost_usd=round(cost, 6),
            phases_s=dict(r.clock.timings), started_at=r.started, ended_at=ended,
            wall_time_s=round(ended - r.started, 3), teardown=teardown_done, job_id=r.job_id,
            result_paths=tuple(recipe.result_paths()), results=tuple(sorted(collected.files)),
            empty_result_paths=collected.empty_paths,
            refused=tuple((x.member, x.reason) for x in collected.refused),
            collect_error=collected.error, collect_attempts=collected.attempts, attempts=attempts,
            upload=r.uploaded,
        )
        try:
            record.write(r.run_dir)
        except OSError as exc:
            # The laptop's disk is full or the run directory went away: say so; the row below keeps it.
            r.fail(f"could not write run.json: {exc}")
            self.reporter.warn(f"could not write {r.run_dir}/run.json: {exc}")
        self.store.update_run(
            r.run_id, status=r.status, exit_code=r.exit_code, ended_at=ended, cost_usd=cost,
            instance_type=record.instance_type, hourly_price=hourly, error=r.error,
        )
        # The run's end is decided: told to notify: targets (bounded, never fails or holds the run).
        notify.run_ended(self.store, self.config, r.recovery.base if r.recovery else r.loaded, record, r.run_dir,
                         warn=self.reporter.warn)
        return RunResult(r.run_id, r.run_dir, r.status, r.exit_code, cost, dict(r.clock.timings), r.error,
                         teardown_done, collected.refused, collected.empty_paths)

    def spent(self, cluster: str, since: float, until: float | None = None,
               incarnation: str | None = None) -> float | None:
        """What this run's cluster incarnation billed while the run went on (never a predecessor's
        of the same name)."""
        if incarnation is None:
            record = self.store.get_cluster(cluster)
            incarnation = record.uid if record is not None else None
        intervals = [i for i in self.store.billing(cluster, since=since)
                     if incarnation is None or i.incarnation == incarnation]
        return spend(intervals, since=since, until=until).usd if intervals else None

    def _teardown(self, r: _Run, policy: str, results_at_risk: bool) -> str:
        assert r.cluster is not None
        name = r.cluster.record.name
        provider = r.cluster.provider
        current = None if r.gone else self.lc.settled(name)
        if current is None or current.uid != r.cluster.record.uid:
            return self._gone(r, results_at_risk)
        if policy in ("down", "stop"):
            other = self._other_live_work(r)
            if other is not None:
                self.reporter.warn(f"cluster {name} kept: {other} is still running on it "
                                   f"(`cloudtrain cancel {name} --all`, then `cloudtrain down {name}`)")
                return "kept"
        if results_at_risk and policy == "down":
            where = f"`cloudtrain collect {name} {r.run_id}` fetches them, `cloudtrain down {name}` removes it"
            if provider.traits.priced and can_stop(provider, bool(r.cluster.record.spot)):
                self.lc.stop(name)
                self.reporter.warn(f"results not collected: cluster {name} stopped (disks kept, compute not billed) "
                                   f"instead of deleted; `cloudtrain start {name}` then {where}")
                return "stopped"
            self.reporter.warn(f"results not collected: cluster {name} kept so they are not lost; {where}")
            return "kept"
        if policy == "down":
            # False: another command's `down` held the cluster's lock and removed it while this
            # run read it above (it ended the job that this run saw end).
            return "down" if self.lc.down(name) else self._gone(r, results_at_risk)
        if policy == "stop":
            self.lc.stop(name)
            return "stopped"
        self.reporter.info(f"cluster {name} kept; `cloudtrain down {name}` removes it")
        return "kept"

    def _gone(self, r: _Run, results_at_risk: bool) -> str:
        """`down` from another terminal (with --yes) ended the cluster under this run: nothing is left
        to tear down or to collect from, and saying "kept, collect fetches them" would be false."""
        assert r.cluster is not None
        name = r.cluster.record.name
        lost = "; the results and logs it held that were not home went with it" if results_at_risk else ""
        self.reporter.warn(f"cluster {name} was taken down by another command while this run went on{lost}")
        r.fail(f"cluster {name} was taken down during the run")
        return "gone"

    def _other_live_work(self, r: _Run) -> str | None:
        """Another run or job still using the cluster (a teardown now would kill it)."""
        assert r.cluster is not None
        name = r.cluster.record.name
        runs = self.lc.live_runs(name, except_run=r.run_id)
        if runs:
            return f"run {runs[0].id}"
        try:
            rows = refresh_jobs(self.store, name, r.nodes)
        except CloudtrainError:
            rows = self.store.list_jobs(name)
        live = [j for j in rows if j.status in OPEN_STATES and j.id not in r.jobs_started]
        return f"job {live[0].id}" if live else None

    # node preparation ----------------------------------------------------------------------------

    def up(self, loaded: LoadedRecipe, cluster_name: str,
           deadline_at: float | None = None, setup: bool = False) -> tuple[Cluster, bool]:
        """`cloudtrain up`: provision (or reuse) and make every node ready to run the recipe.
        `deadline_at` (a sweep's lease): a new cluster's machines carry it in their launch request.
        `setup`: run the recipe's setup on every node where it has not run (run/setup_once.py)."""
        self.check(loaded, cluster_name, "keep")
        cluster, created = self.lc.up(loaded.recipe, cluster_name, str(loaded.path.resolve()), loaded.digest,
                                      usable=self.usable.get(cluster_name), deadline_at=deadline_at)
        nodes: list[Node] = []
        try:
            nodes = self._ready_nodes(cluster, loaded.recipe, created)
            # `exec` right after `up` must see the code: sync now (only changes travel later).
            on_all(nodes, lambda n: sync(n, without_buckets(loaded), self.reporter))
            if bucket_mounts(loaded.recipe):  # and the bucket data (a later run copies only what changed)
                copy_in(self.store, self.reporter, nodes, cluster.provider, new_run_id(cluster_name), loaded.recipe, [])
            if setup:
                from cloudtrain.run import setup_once

                setup_once.ensure(self.store, self.reporter, nodes, loaded.recipe, cluster_name,
                                  "once per node for this setup")
        except BaseException:
            close_all(nodes)
            if created:
                # A cluster we cannot reach or bootstrap is money burning for nothing.
                self.reporter.warn("nodes not usable; tearing the new cluster down")
                with _no_interrupts():
                    self.lc.down(cluster_name)
            raise
        close_all(nodes)
        return cluster, created

    @staticmethod
    def _may_have_acted_alone(cluster: Cluster, recipe: Recipe) -> bool:
        """A watchdog (or spot reclaim) may have stopped or deleted these nodes, and a node started
        in the last minutes gets minutes of SSH retries (remote/ssh.py): worth one cloud call."""
        from cloudtrain.remote.ssh import BOOT_GRACE_S

        if not cluster.provider.traits.remote:
            return False
        if recipe.autostop is None and recipe.budget is None and not cluster.record.spot:
            return False
        now = time.time()
        return any(n.started_at is not None and now - n.started_at < BOOT_GRACE_S for n in cluster.nodes)

    def _behind_our_back(self, fresh: Cluster, recipe: Recipe) -> Cluster:
        """A reused cluster that did not answer, as the cloud sees it now. State said up, but the
        machines may have acted alone: the on-node watchdog stops (autostop, budget) or deletes
        (autostop.down) them with no laptop around, and spot capacity is taken back. Stopped: start
        it again (billing again, so it is approved like any start). Gone: say so."""
        name = fresh.record.name
        if fresh.record.status == ClusterStatus.STOPPED:
            self.reporter.info(f"cluster {name} was stopped while cloudtrain was away (its watchdog: autostop "
                               "or budget; see `cloudtrain logs --watchdog`): starting it again")
            if self.approve is not None:
                rec = fresh.record
                self.approve(approval.for_start(name, recipe, rec.provider, rec.region, rec.instance_type,
                                                rec.num_nodes, rec.hourly_price))
            started = self.lc.start(name)
            self._restarted.add(name)
            return started
        if fresh.record.status == ClusterStatus.TERMINATED:
            raise UsageError(f"cluster {name} no longer exists: its machines were deleted while cloudtrain was "
                             "away (its watchdog's autostop.down or budget, or a spot reclaim)",
                             hint=f"`cloudtrain down {name}` forgets it; then run again for a new one")
        return fresh

    def _ready_nodes(self, cluster: Cluster, recipe: Recipe, created: bool = True) -> list[Node]:
        """Connect to every node and prepare it (runtime, bootstrap, job files, ssh config).
        Returns open nodes; on failure none stays open. A reused cluster was taken from state
        without asking the cloud: if a node cannot be reached, ask once (it may have a new address)."""
        if not created and self._may_have_acted_alone(cluster, recipe):
            # Connecting to a recently started node is patient (it may be booting): ask the cloud
            # first rather than wait minutes on a machine its watchdog stopped.
            cluster = self._behind_our_back(self.lc.refresh(cluster.record.name), recipe)
        try:
            nodes = connect(list(cluster.nodes), cluster.provider, self.config)
        except RemoteError:
            if created:
                raise
            fresh = self._behind_our_back(self.lc.refresh(cluster.record.name), recipe)
            if fresh.nodes == cluster.nodes:
                raise
            cluster = fresh  # new addresses: the ssh config and the watchdog need these
            nodes = connect(list(fresh.nodes), fresh.provider, self.config)
        try:
            nodes = on_all(nodes, lambda n: prepare(n, recipe, self.reporter))
            write_ssh_config(cluster, self.config, self.reporter)
            # A scheduler enforces the budget's hours itself (its time limit): no watchdog there.
            if ((recipe.autostop is not None or recipe.budget is not None)
                    and not supports(cluster.provider, Schedules)):
                # From here on the nodes stop themselves when idle or over budget, laptop or not.
                from cloudtrain.run.watchdog import start_from_recipe

                start_from_recipe(self.store, cluster, nodes, recipe, self.reporter, created, self.config)
        except BaseException:
            close_all(nodes)
            raise
        return nodes


