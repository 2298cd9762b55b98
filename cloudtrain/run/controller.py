"""A run is attempts under one controller (issue 36.1).

One pass provision -> ready -> sync -> data -> setup -> job (-> collect) is an *attempt*
(run/pipeline.py `_attempt`). The `Controller` owns the loop around it: begin the attempt, run its
phases, have the outcome classified, ask the policy "again or done", end it. What differs between
runs is the `Policy`:

- `Once`: a plain run, one attempt, whatever happens;
- a recovering run (run/recover.py `Recovery`): a lost node ends the attempt `lost`/`preempted`,
  the cluster goes down and the next attempt launches on what is left of the plan and the budget,
  its job resumed from the kept checkpoint;
- `Trial`: one attempt of a sweep trial (sweep/backend.py): before its job the reserve is checked
  and the checkpoint its lost predecessor kept is carried over; a loss is the scheduler's to retry
  (sweep/core.py), never retried in place.

The policy also hears the job's epochs (`epoch`, called by the follow path beside the reporter,
run/follow.py): a reporter only displays and records, it steers nothing. Stopping is the attempt's
token (run/stop.py), checked between phases.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cloudtrain.errors import CloudtrainError
from cloudtrain.run.checkpoints import epoch_done

if TYPE_CHECKING:
    from cloudtrain.run.checkpoints import Puller
    from cloudtrain.run.recovering import RunSoFar
    from cloudtrain.run.stop import StopToken



class AttemptOutcome(StrEnum):
    """How an attempt ended (run.json's and attempts.json's `outcome`)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    PREEMPTED = "preempted"  # its spot machine was reclaimed
    LOST = "lost"  # its machine went otherwise


LOSSES = frozenset({AttemptOutcome.LOST, AttemptOutcome.PREEMPTED})


@dataclass(frozen=True)
class Ended:
    """How an attempt ended, as its policy classified it. `cause`: what ended it (the error, or for
    a loss seen only after a job that succeeded, the loss as an error), raised if it is not retried."""

    outcome: AttemptOutcome
    reason: str | None = None
    cause: BaseException | None = None

    @property
    def lost(self) -> bool:
        return self.outcome in LOSSES


def plain(error: BaseException | None) -> Ended:
    """An outcome without a loss to look for: succeeded, interrupted (Ctrl-C) or failed."""
    if error is None:
        return Ended(AttemptOutcome.SUCCEEDED)
    if isinstance(error, KeyboardInterrupt):
        return Ended(AttemptOutcome.INTERRUPTED, "interrupted by the user", error)
    reason = error.one_line() if isinstance(error, CloudtrainError) else f"{type(error).__name__}: {error}"
    return Ended(AttemptOutcome.FAILED, reason, error)


class Policy(Protocol):
    """What a kind of run decides around its attempts. `collects`: the attempt brings its results
    home itself (a node lost while collecting is then a loss like any other)."""

    collects: bool

    def start(self, r: RunSoFar) -> None:
        """Before the first attempt (the run's record and directory exist)."""

    def begin(self) -> None:
        """An attempt begins."""

    def before_job(self, nodes: Sequence[Any]) -> None:
        """Just before the job starts, on its nodes (after sync and setup)."""

    def progress(self, event: dict[str, Any]) -> None:
        """A progress event of the job (an epoch done: its checkpoint is written)."""

    def ended(self, error: BaseException | None) -> Ended:
        """Classify and record how the attempt ended (`error`: what it raised, or None)."""

    def again(self, ended: Ended) -> bool:
        """True: another attempt. Raises when one was wanted but cannot be had (no restarts left)."""

    def close(self) -> None:
        """After the last attempt, whatever happened."""


class Controller:
    """The attempt loop: one owner of "again or done"."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def run(self, r: RunSoFar, attempt: Callable[[], None]) -> None:
        policy = self.policy
        try:
            policy.start(r)
            while True:
                policy.begin()
                error: BaseException | None = None
                try:
                    attempt()
                except BaseException as exc:  # noqa: BLE001 - classified by the policy, re-raised below
                    error = exc
                try:
                    if policy.again(policy.ended(error)):
                        continue
                    if error is not None:
                        raise error
                    return
                finally:
                    error = None  # no reference cycle through the traceback
        finally:
            policy.close()


class Once:
    """A plain run: one attempt, its outcome final."""

    collects = False

    def start(self, r: RunSoFar) -> None:
        return None

    def begin(self) -> None:
        return None

    def before_job(self, nodes: Sequence[Any]) -> None:
        return None

    def progress(self, event: dict[str, Any]) -> None:
        return None

    def ended(self, error: BaseException | None) -> Ended:
        return plain(error)

    def again(self, ended: Ended) -> bool:
        return False

    def close(self) -> None:
        return None


class ReserveSpent(CloudtrainError):
    """A sweep attempt's provisioning, sync and setup overran the time reserved for them."""


class Trial(Once):
    """One attempt of a sweep trial. Its stop token is the scheduler's (a prune, a cancel) and its
    VM's watcher's (sweep/backend.py); the pipeline checks it between phases, collect included.
    Before the job: the reserve (`job_start_by`) is checked, and the checkpoint a lost predecessor
    kept (`carry`) goes into the job's checkpoint directory `rel` on every node (run/carry.py;
    without it the job starts over, said). Each epoch the job reports goes to the attempt's
    checkpoint `puller` and to `on_epoch` (the sweep's intermediate values, for pruning)."""

    def __init__(self, token: StopToken, job_start_by: float, rel: str, warn: Callable[[str], None],
                 puller: Puller | None = None, carry: Path | None = None,
                 on_epoch: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.token = token
        self.on_epoch = on_epoch  # each epoch's event, once (the sweep's intermediate values)
        self.epochs_heard = 0
        self.job_start_by = job_start_by
        self.rel = rel
        self.warn = warn
        self.puller = puller
        self.carry = carry

    def start(self, r: RunSoFar) -> None:
        r.clock.stop = self.token

    def before_job(self, nodes: Sequence[Any]) -> None:
        from cloudtrain.run import carry

        if time.time() > self.job_start_by:
            raise ReserveSpent("provisioning, sync and setup took longer than the time reserved for them "
                               "(sweep.reserve.setup_minutes)")
        if self.carry is not None:
            carry.onto(nodes, self.carry, self.rel, self.warn)

    def progress(self, event: dict[str, Any]) -> None:
        epoch = epoch_done(event)
        if epoch is None or epoch <= self.epochs_heard:
            return  # a job may both print and write an event: heard once
        self.epochs_heard = epoch
        if self.puller is not None:
            self.puller.epoch(epoch)
        if self.on_epoch is not None:
            self.on_epoch(event)
