"""A run that survives losing its node: relaunch elsewhere, resume from the newest checkpoint.

With `recover:` (recipe/recover.py; default on for spot) `run` goes through attempts. `Recovery` is
the run's policy under the one attempt loop (run/controller.py `Controller`): each attempt is the
pipeline's own provision -> sync -> setup -> job -> collect (run/pipeline.Executor._attempt, collecting
inside the attempt) on a new incarnation of the run's cluster name (lifecycle makes it; the ledger
bills each on its own). While an attempt runs:

- a watcher thread asks the cloud (lifecycle's refresh: describe and list by tag, which also puts
  what the cloud says in the ledger) every `recover.watch_s` whether the nodes are still there. A
  node the cloud reports gone or going (terminated, stopping, stopped: a spot reclaim, a lost host)
  ends the attempt at once: the watcher makes the pipeline's connections give up instead of waiting
  out their SSH retries;
- each epoch the job reports (the follow path tells the policy, `epoch`) makes a Puller
  (run/checkpoints.py, shared with sweeps) copy its newest checkpoint into `<run dir>/checkpoint/`;
- every line the job prints is also kept in `<run dir>/attempts/aN.log`.

When an attempt fails, the cause is settled by asking, in order: did the watcher see the node go;
does the cloud, asked once more now, say it went; did the node's watchdog record an interruption
notice (cloudtrain/node/notices.py writes NOTICE_FILE, `interruption.json`, beside its config and
SIGTERMs the job, which may write a final checkpoint: pulled now, while the node is still up). Any of them: the
attempt ended `preempted` (spot) or `lost`, the cluster is taken down (`lifecycle.down`: the cloud
confirms it gone, billing closed), and the next attempt launches on the plan made again with what
is left of the budget (`budget.max_usd` minus the spend of every attempt so far, `max_hours` minus
the time so far): the same region without the preempted zone first, then the next regions and
clouds in price order; a cloud whose machines have no zone (Azure's regional VMs) moves region.
Recovery stops (the run fails, saying why) when `max_restarts` relaunches are spent or no
placement's worst case fits what is left of the budget. A collect that failed because the node
went (the job had succeeded) is such a loss too: the next attempt resumes from the kept checkpoint,
a finished job's last one, so it only writes its results again, and collects them. Anything else (the job failed on its own,
a bad recipe, Ctrl-C) ends the run as without recovery.

The job gets CLOUDTRAIN_CHECKPOINT_DIR (per run, relative to the workdir; the recipe's own value
wins); before a relaunched job starts, the kept checkpoint is uploaded into it on every node. The
bundled job resumes from it by itself (run/prepare.job_script); a `run:` command reads it itself.
run.json's `attempts` lists every attempt: placement, incarnation, times, cost, outcome, reason,
when the loss was detected, the epoch it resumed from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.notify import hooks as notify
from cloudtrain.errors import CloudtrainError, LaunchLostError, UsageError
from cloudtrain.run.controller import AttemptOutcome, Ended, plain
from cloudtrain.run.recover_rules import NodeLostError, budget_left, next_candidates, rule_out
from cloudtrain.run.recover_watch import Tee, Watcher, lost_now
from cloudtrain.run.stop import StopToken
from cloudtrain.state import RunStatus
from cloudtrain.run import carry, checkpoints
from cloudtrain.node.protocol import NOTICE_FILE
from cloudtrain.run.checkpoints import CHECKPOINT_ENV, epoch_done

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Cluster, Lifecycle
    from cloudtrain.recipe.recover import Recover
    from cloudtrain.run.recovering import RunSoFar, Runs

ATTEMPTS_DIR = "attempts"
ATTEMPTS_FILE = "attempts.json"  # in the run directory, rewritten as attempts go (read by `run --resume`)


@dataclass
class Attempt:
    """One attempt of a recovering run, as run.json reports it."""

    number: int
    started_at: float
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    spot: bool = False
    hourly_price_usd: float = 0.0
    incarnation: str | None = None
    ended_at: float | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    reason: str | None = None
    detected_at: float | None = None  # when cloudtrain knew the node was gone (the watcher, or asking after a failure)
    resumed_from_epoch: int | None = None
    final_checkpoint_at: float | None = None  # a checkpoint written after an interruption notice, home at
    # What node 0 put in the bucket on the notice (recipe `upload:`, run/recover_upload.py): url, paths,
    # exit_code, ok, at; without the node's answer, what the bucket holds under the run's prefix
    # (answered false: objects, count, listed_at, or error); None when there was no notice or upload.
    uploaded_on_notice: dict[str, Any] | None = None
    # The run's own upload at its end (the last attempt), when this node went during it: the results
    # were home, this machine finished it or could not (run/recover_upload.FinalUpload).
    final_upload: dict[str, Any] | None = None
    cost_usd: float = 0.0

    def placement(self) -> str:
        where = "/".join(p for p in (self.cloud, self.zone or self.region) if p)
        return f"{where} ({self.instance_type}{' spot' if self.spot else ''})" if self.instance_type else where


def recovery_for(executor: Runs, r: RunSoFar, cluster_name: str) -> Recovery | None:
    """The run's Recovery, or None when it does not recover (no `recover:` in force, none left to
    give, or machines cloudtrain cannot relaunch)."""
    from cloudtrain.providers import ANY

    settings = r.loaded.recipe.recovery
    if settings is None or settings.max_restarts == 0:
        return None
    cloud = r.loaded.recipe.resources.cloud
    if cloud != ANY:
        from cloudtrain.providers.base import GivenHosts, supports

        if supports(executor.lc.provider(cloud), GivenHosts):  # the user's own machines: nowhere else to go
            return None
    return Recovery(executor, r, cluster_name, settings)


class Recovery:
    def __init__(self, executor: Runs, r: RunSoFar, cluster_name: str, settings: Recover) -> None:
        self.ex = executor
        self.r = r
        self.name = cluster_name
        self.settings = settings
        self.attempts: list[Attempt] = []
        self.kept = r.run_dir / checkpoints.KEPT
        self.rel = str(r.loaded.recipe.envs.get(CHECKPOINT_ENV) or checkpoints.run_node_dir(r.run_id))
        self.base = r.loaded  # the recipe as given (relaunches change its budget, never its envs)
        self.avoid: dict[tuple[str, str | None], tuple[str, ...]] = {}  # (cloud, region) -> zones ruled out
        self.puller: checkpoints.Puller | None = None
        self.watcher: Watcher | None = None
        self.token: StopToken | None = None  # the current attempt's stop (run/stop.py), set by its watcher
        self.notice_upload = False  # the last notice read says the node started its upload on notice
        self._log: Any = None
        self._outer: tuple[Any, StopToken | None] | None = None  # the run's reporter and stop, put back at close
        self._load_attempts()
        if CHECKPOINT_ENV not in r.loaded.recipe.envs:
            recipe = r.loaded.recipe.model_copy(update={"envs": {**r.loaded.recipe.envs, CHECKPOINT_ENV: self.rel}})
            r.loaded = r.loaded.model_copy(update={"recipe": recipe})
            self.base = r.loaded

    # the policy (run/controller.py): the Controller asks, attempt by attempt ---------------------------

    collects = True  # a node lost while collecting is relaunched like any loss

    def start(self, r: RunSoFar) -> None:
        """The run's reporter becomes the tee (each attempt's log) and its cost meter every attempt's."""
        self._outer = (self.ex.reporter, self.r.clock.stop)
        tee = Tee(self.ex.reporter, self)
        self.ex.reporter = tee
        self.r.clock.reporter = tee
        self.r.clock.spent = self.spent_so_far

    def ended(self, error: BaseException | None) -> Ended:
        """Why the attempt ended, recorded: a loss (at launch, while it ran, while collecting) or not."""
        current = self.attempts[-1]
        ended = plain(error)
        if error is None:
            lost = self._lost_while_collecting(current)
            if lost is not None:
                ended = Ended(*lost, NodeLostError(f"collect failed: {lost[1]}"))
        elif isinstance(error, CloudtrainError) and not isinstance(error, UsageError):
            lost = self._lost_at_launch(current, error) or self._lost(current)
            if lost is not None:
                ended = Ended(*lost, error)
        self._end(current, ended.outcome, ended.reason)
        return ended

    def again(self, ended: Ended) -> bool:
        """A lost attempt is relaunched (or NodeLostError says why not); anything else is final."""
        if not ended.lost:
            return False
        current = self.attempts[-1]
        notify.attempt_lost(self.ex.store, self.ex.config, self.base, self.r.run_id, self.name, current,
                            self.r.run_dir, warn=self.ex.reporter.warn)
        self._relaunch(current, ended.cause)
        return True

    def close(self) -> None:
        if self._outer is not None:
            self.ex.reporter, outer_stop = self._outer
            self.r.clock.reporter = self.ex.reporter
            self.r.clock.stop = outer_stop  # each attempt's token is its own; the run's phases go on
        if self.puller is not None:
            self.puller.close()

    def _load_attempts(self) -> None:
        """A resumed run (`run --resume`) goes on from the attempts its dead CLI recorded; one it
        left open ended with that CLI."""
        try:
            saved = json.loads((self.r.run_dir / ATTEMPTS_FILE).read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise NodeLostError(f"cannot read {self.r.run_dir / ATTEMPTS_FILE}: {exc}") from exc
        for item in saved:
            attempt = Attempt(**item)
            attempt.outcome = AttemptOutcome(attempt.outcome)
            if attempt.outcome is AttemptOutcome.RUNNING:
                attempt.outcome = AttemptOutcome.LOST
                attempt.reason = "the CLI driving it ended; picked up by `run --resume`"
                attempt.ended_at = attempt.ended_at or time.time()
            self.attempts.append(attempt)

    def save(self) -> None:
        path = self.r.run_dir / ATTEMPTS_FILE
        tmp = path.with_name(f".{ATTEMPTS_FILE}.tmp")
        tmp.write_text(json.dumps([asdict(a) for a in self.attempts], indent=1))
        tmp.replace(path)

    def begin(self) -> None:
        current = Attempt(number=len(self.attempts) + 1, started_at=time.time(),
                          resumed_from_epoch=checkpoints.kept_epoch(self.kept))
        self.attempts.append(current)
        log_dir = self.r.run_dir / ATTEMPTS_DIR
        log_dir.mkdir(exist_ok=True)
        self._log = (log_dir / f"a{current.number}.log").open("a", encoding="utf-8")
        self.puller = checkpoints.Puller(self._open_rank0, self.kept, self.base.recipe.job is not None, 0,
                                         self.ex.reporter.warn, rel=self.rel)
        self.watch()

    def watch(self) -> Watcher:
        """A new stop token and cloud watcher for what runs on the cluster now (an attempt, or the
        run's final upload, run/recover_upload.py): the pipeline checks the token between phases."""
        self.token = StopToken(self.name)
        self.r.clock.stop = self.token
        self.watcher = Watcher(self._open_lc, self.name, self.settings.watch_s, self.token,
                               lambda message: self.ex.reporter.warn(message))
        self.watcher.start()
        return self.watcher

    def _open_lc(self) -> Lifecycle:
        """The watcher's own lifecycle and store (one SQLite connection per thread)."""
        from cloudtrain.cluster.lifecycle import Lifecycle
        from cloudtrain.state import StateStore

        return Lifecycle(StateStore(self.ex.store.path), self.ex.config)

    def _end(self, current: Attempt, outcome: AttemptOutcome, reason: str | None) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        current.ended_at = time.time()
        current.outcome, current.reason = outcome, reason
        if self.r.cluster is not None:
            self._placed(current, self.r.cluster)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.save()

    @staticmethod
    def _placed(current: Attempt, cluster: Cluster) -> None:
        rec = cluster.record
        current.cloud, current.region, current.zone = rec.provider, rec.region, rec.zone
        current.instance_type, current.spot = rec.instance_type, bool(rec.spot)
        current.hourly_price_usd, current.incarnation = rec.hourly_price, rec.uid

    # why it ended --------------------------------------------------------------------------------------

    def _lost(self, current: Attempt) -> tuple[AttemptOutcome, str] | None:
        """(outcome, reason) when the attempt ended because its node went (see the module docstring)."""
        kind = (AttemptOutcome.PREEMPTED if self.r.cluster is not None and self.r.cluster.record.spot
                else AttemptOutcome.LOST)
        watcher = self.watcher
        if watcher is not None and watcher.lost is not None:
            current.detected_at = watcher.detected_at
            return kind, str(watcher.lost)
        if self.r.cluster is None:
            return None
        gone = lost_now(self.ex.lc, self.name, self.ex.reporter.warn)
        if gone is not None:
            current.detected_at = time.time()
            return kind, str(gone)
        if self.ex.store.get_cluster(self.name) is None:
            return None  # taken down by another command: no notice to read from a node that is gone
        notice = self._notice()
        if notice is not None:
            current.detected_at = time.time()
            if self._final_checkpoint():
                current.final_checkpoint_at = time.time()
            if self.r.loaded.recipe.upload and self.r.nodes:
                if self.notice_upload:
                    from cloudtrain.run.recover_upload import after_notice

                    current.uploaded_on_notice = after_notice(self)
                else:
                    self.ex.reporter.warn("the node's watchdog started no upload on the interruption notice")
            return AttemptOutcome.PREEMPTED, f"interruption notice on the node ({notice})"
        return None

    @staticmethod
    def _lost_at_launch(current: Attempt, exc: CloudtrainError) -> tuple[AttemptOutcome, str] | None:
        """(outcome, reason) when the cloud ended the machine while it started (lifecycle cleaned
        up): no cluster was handed over, so where it was comes with the error."""
        if not isinstance(exc, LaunchLostError):
            return None
        lost = exc.lost
        current.detected_at = time.time()
        current.cloud, current.region, current.zone = lost.cloud, lost.region, lost.zone
        current.instance_type, current.spot = lost.instance_type, lost.spot
        current.hourly_price_usd, current.incarnation = lost.hourly_price, lost.incarnation
        return (AttemptOutcome.PREEMPTED if lost.spot else AttemptOutcome.LOST), exc.message

    def _lost_while_collecting(self, current: Attempt) -> tuple[AttemptOutcome, str] | None:
        """(outcome, reason) when the attempt's job succeeded but its results could not be
        collected because the node went: the next attempt resumes from the kept checkpoint (a
        finished job's last one: it only writes its results again) and collects again."""
        collected = self.r.collected
        if collected is None or collected.complete or self.r.status == RunStatus.INTERRUPTED:
            return None
        lost = self._lost(current)
        if lost is None:
            return None  # the node is there: a collect that failed on its own fails the run as before
        self.r.collected = None
        self.ex.reporter.warn(f"the node went while the results were collected ({collected.error})")
        return lost[0], f"{lost[1]} (while collecting the results)"

    def _notice(self) -> str | None:
        """The interruption notice the node's watchdog recorded, if any (the node is still up)."""
        if not self.r.nodes:
            return None
        node = self.r.nodes[0]
        try:
            seen = node.transport.run(["cat", f"{node.layout.root}/{NOTICE_FILE}"], check=False,
                                      what="reading the interruption notice")
        except CloudtrainError:
            return None
        if seen.exit_code != 0:
            return None
        try:
            data = json.loads(seen.text)
        except ValueError:
            return "unreadable notice"
        # The watchdog started the upload on notice (run/recover_upload.py): worth waiting for.
        self.notice_upload = isinstance(data, dict) and bool(data.get("upload"))
        return str(data.get("detail") or data.get("kind") or "notice") if isinstance(data, dict) else "notice"

    def _final_checkpoint(self) -> bool:
        """The job was told (SIGTERM) and may have written a last checkpoint: bring it home now,
        while the node is still there. True: the node's newest checkpoint is home (this pull brought
        it, or the background puller already had: a job TERMed in an epoch's last step saves that
        epoch, which the puller may fetch first)."""
        if self.puller is None or not self.r.nodes:
            return False
        self.puller.close()
        try:
            epoch = self.puller.pull_newest(self.r.nodes[0])
        except (CloudtrainError, OSError) as exc:
            self.ex.reporter.warn(f"could not bring the final checkpoint home: {exc}")
            return False
        if epoch is not None:
            self.ex.reporter.info(f"the checkpoint written after the interruption notice is home (as epoch {epoch})")
        return epoch is not None or checkpoints.kept_epoch(self.puller.kept) is not None

    def final_upload(self, step: Callable[[], object]) -> None:
        """The run's own upload at its end, a node lost meanwhile finished from this machine
        (run/recover_upload.final_upload)."""
        from cloudtrain.run import recover_upload

        recover_upload.final_upload(self, step)

    def gone_now(self) -> tuple[str | None, float]:
        """Why the node is gone (the watcher's word, or the cloud's now) and when that was known."""
        watcher = self.watcher
        if watcher is not None and watcher.lost is not None:
            return str(watcher.lost), watcher.detected_at or time.time()
        gone = lost_now(self.ex.lc, self.name, self.ex.reporter.warn)
        return (str(gone) if gone is not None else None), time.time()

    # the next attempt ---------------------------------------------------------------------------------

    def _relaunch(self, lost: Attempt, exc: BaseException | None) -> None:
        """Take the lost cluster down and get the next attempt's plan, or raise NodeLostError."""
        from cloudtrain.cluster.nodes import close_all

        why = f"node {lost.outcome} on {lost.placement()}: {lost.reason}"
        r = self.r
        close_all(r.nodes)
        r.nodes, r.jobs_started = [], []
        if self.puller is not None:
            self.puller.close()
        with r.clock.phase("recover", why) as outcome:
            try:
                if r.cluster is not None or self.ex.store.get_cluster(self.name) is not None:
                    # The cloud confirms it gone; its billing closes. (A launch lost while starting
                    # handed no cluster over, but its row stays until down sees everything gone.)
                    self.ex.lc.down(self.name)
                r.cluster, r.created = None, False
                if lost.number > self.settings.max_restarts:
                    raise NodeLostError(f"{why}; not relaunched: recover.max_restarts ({self.settings.max_restarts}) "
                                        "relaunches used", hint="raise recover.max_restarts")
                self._next_plan(lost)
            except CloudtrainError as error:
                outcome.ok = False
                outcome.detail = error.message
                raise error from exc
            kept = checkpoints.kept_epoch(self.kept)
            outcome.detail = (f"attempt {lost.number + 1} of up to {self.settings.max_restarts + 1}; resuming from "
                              + (f"the checkpoint of epoch {kept}" if kept is not None else "the start (no checkpoint)"))

    def _next_plan(self, lost: Attempt) -> None:
        """The plan again, with what is left of the budget and without what the loss ruled out."""
        from cloudtrain.cluster.planning import plan_with_credentials

        recipe = self.base.recipe
        if recipe.budget is not None:
            left = budget_left(recipe.budget, self.spent_so_far() or 0.0, (time.time() - self.r.started) / 3600)
            recipe = recipe.model_copy(update={"budget": left})
        self.r.loaded = self.base.model_copy(update={"recipe": recipe})
        if not self.ex.lc.launches_priced(recipe):
            return  # machines with nowhere else to go (local): the same place again
        if lost.cloud is not None:
            rule_out(self.avoid, lost.cloud, lost.region, lost.zone)
        try:
            usable = plan_with_credentials(recipe, self.ex.config)
        except UsageError as exc:
            raise NodeLostError(f"not relaunched: no placement's worst case fits what is left of the budget "
                                f"({exc.message})") from exc
        candidates = next_candidates(usable.plan.candidates, self.avoid)
        self.ex.usable[self.name] = replace(usable, plan=replace(usable.plan, candidates=candidates))

    # money, logs, record ---------------------------------------------------------------------------------

    def incarnations(self) -> list[str]:
        seen = [a.incarnation for a in self.attempts if a.incarnation]
        if self.r.cluster is not None and self.r.cluster.record.uid and self.r.cluster.record.uid not in seen:
            seen.append(self.r.cluster.record.uid)
        return seen

    def spent_so_far(self, until: float | None = None) -> float | None:
        costs = [self.ex.spent(self.name, self.r.started, until, uid) for uid in self.incarnations()]
        known = [c for c in costs if c is not None]
        return sum(known) if known else None

    def settle(self, ended: float) -> tuple[float, tuple[dict[str, Any], ...]]:
        """At the end of the run: every attempt's cost (its incarnation's billed intervals), the
        total, and the run's job.log preceded by the earlier attempts' lines."""
        total = 0.0
        for a in self.attempts:
            if a.ended_at is None:
                a.ended_at = ended
            if a.incarnation is None and a is self.attempts[-1] and self.r.cluster is not None:
                self._placed(a, self.r.cluster)
            a.cost_usd = round(self.ex.spent(self.name, self.r.started, ended, a.incarnation) or 0.0, 6) \
                if a.incarnation else 0.0
            total += a.cost_usd
        if len(self.attempts) > 1:
            self._merge_logs()
        return round(total, 6), tuple(asdict(a) for a in self.attempts)

    def _merge_logs(self) -> None:
        """job.log (brought home from the last attempt's node) with every earlier attempt's lines,
        as the laptop saw them, before it; one header line per attempt."""
        run_dir = self.r.run_dir
        final = run_dir / "job.log"
        last = final.read_text(errors="replace") if final.is_file() else ""
        parts = []
        for a in self.attempts:
            ended = f"{a.outcome}" + (f": {a.reason}" if a.reason else "")
            parts.append(f"--- cloudtrain: attempt {a.number} on {a.placement() or '?'}: {ended}\n")
            if a is self.attempts[-1]:
                parts.append(last)
            else:
                path = run_dir / ATTEMPTS_DIR / f"a{a.number}.log"
                parts.append(path.read_text(errors="replace") if path.is_file() else "")
        tmp = run_dir / ".job.log.tmp"
        tmp.write_text("".join(parts))
        tmp.replace(final)

    def line(self, text: str) -> None:
        if self._log is not None:
            self._log.write(text + "\n")
            self._log.flush()

    def progress(self, event: dict[str, Any]) -> None:
        """The job's progress events (run/follow.py): an epoch done brings its checkpoint home."""
        epoch = epoch_done(event)
        if epoch is not None and self.puller is not None:
            self.puller.epoch(epoch)

    def before_job(self, nodes: Sequence[Any]) -> None:
        """Just before the job, on its nodes (the pipeline calls it): the attempt's placement
        recorded, the upload on a notice armed, and before a relaunched job the kept checkpoint into
        its CLOUDTRAIN_CHECKPOINT_DIR on every node (run/carry.py)."""
        current = self.attempts[-1]
        if self.r.cluster is not None:
            self._placed(current, self.r.cluster)  # known from here on, also to a resume after a dead CLI
            self.save()
        self._arm_upload_on_notice()
        if current.number > 1:  # a relaunched attempt's job is about to go on: the run recovered
            notify.attempt_recovered(self.ex.store, self.ex.config, self.base, self.r.run_id, self.name, current,
                                     self.r.run_dir, warn=self.ex.reporter.warn)
        if current.number == 1:
            return
        if carry.onto(nodes, self.kept, self.rel, self.ex.reporter.warn) is None:
            current.resumed_from_epoch = None  # nothing kept, or it could not be put there: it starts over

    def _arm_upload_on_notice(self) -> None:
        """With `upload:`, node 0's watchdog uploads the results and checkpoints on a notice
        (run/recover_upload.py); a node that cannot take the script only loses that."""
        from cloudtrain.run import recover_upload

        if not self.r.loaded.recipe.upload or not self.r.nodes or self.r.cluster is None:
            return
        try:
            recover_upload.arm(self.r.nodes[0], self.r.cluster.provider, self.r.loaded.recipe, self.r.run_id,
                               self.r.job_id, self.rel)
        except CloudtrainError as exc:
            self.ex.reporter.warn(f"no upload on an interruption notice: {exc.one_line()}")

    def _open_rank0(self) -> tuple[Any, Callable[[], None]]:
        """A connection of its own to rank 0, for the checkpoint puller's thread."""
        from cloudtrain.cluster.lifecycle import Lifecycle
        from cloudtrain.cluster.nodes import open_rank0
        from cloudtrain.state import StateStore

        return open_rank0(Lifecycle(StateStore(self.ex.store.path), self.ex.config), self.name)


def resume(executor: Runs, loaded: Any, run_id: str, teardown: Any, runs_dir: Path,
           env_overrides: Any = None) -> Any:
    """`cloudtrain run RECIPE --resume RUN`: a recovering run whose CLI died goes on in its run
    directory. Its machines gone (preempted, or deleted by their deadline, while no CLI ran): the
    next attempt launches and resumes from the checkpoint kept so far. Still up: refused, naming the
    commands that follow or collect what runs there."""
    from cloudtrain.errors import UsageError as Usage

    store = executor.store
    row = store.get_run(run_id)
    if row is None or not row.run_dir:
        raise Usage(f"no run {run_id!r}", hint="`cloudtrain status` lists recent runs")
    if row.status == RunStatus.RUNNING and row.driver_alive():
        raise Usage(f"run {run_id} is still driven by cloudtrain (pid {row.pid})",
                    hint="wait for it, or stop it with Ctrl-C in its terminal")
    if row.status == RunStatus.SUCCEEDED:
        raise Usage(f"run {run_id} succeeded already", hint=f"its results are in {row.run_dir}")
    if loaded.recipe.recovery is None:
        raise Usage(f"run {run_id}: the recipe has no recover: (and is not spot), so there is nothing to resume",
                    hint="add `recover: true` to the recipe")
    if row.recipe_digest and row.recipe_digest != loaded.digest:
        executor.reporter.warn(f"the recipe changed since run {run_id} started; resuming with it as it is now")
    name = row.cluster
    if store.get_cluster(name) is not None:
        from cloudtrain.run.gone import judge

        why = judge(executor.lc.refresh(name))
        if why is None:
            raise Usage(f"run {run_id}: cluster {name} is still up, its job may still be running",
                        hint=f"`cloudtrain logs {name} -f` follows it, `cloudtrain collect {name} {run_id}` brings "
                             f"its results home, `cloudtrain down {name}` ends it")
        executor.reporter.warn(f"cluster {name} went while no CLI ran ({why}): taking it down, relaunching")
        executor.lc.down(name)
    return executor.run(loaded, name, teardown, runs_dir, env_overrides, resume=row)


def kept_checkpoint(run_dir: Path) -> int | None:
    """The epoch of the checkpoint a recovering run kept, or None."""
    return checkpoints.kept_epoch(run_dir / checkpoints.KEPT)
