"""The scheduler's journal in the state database: its records to rows and back."""

from __future__ import annotations

import json
from collections.abc import Sequence

from cloudtrain.state import (
    StateStore,
    SweepAttemptRow,
    SweepRecord,
    SweepTrialRow,
    SweepVmRow,
)
from cloudtrain.sweep.model import Attempt, Counters, Outcome, Snapshot, Trial, TrialState, Vm, VmState


class StoreJournal:
    """`Journal` over StateStore: every step's changes in one transaction."""

    def __init__(self, store: StateStore, sweep_id: str) -> None:
        self.store = store
        self.sweep_id = sweep_id

    def save(self, trials: Sequence[Trial], attempts: Sequence[Attempt], vms: Sequence[Vm],
             counters: Counters | None) -> None:
        sid = self.sweep_id
        self.store.save_sweep_records(
            sid,
            [trial_row(sid, t) for t in trials],
            [attempt_row(sid, a) for a in attempts],
            [vm_row(sid, v) for v in vms],
            None if counters is None else {"next_slot": counters.next_slot, "boot_failures": counters.boot_failures,
                                           "stop_reason": counters.stop, "ended_reason": counters.ended},
        )


def trial_row(sweep: str, t: Trial) -> SweepTrialRow:
    return SweepTrialRow(sweep, t.number, json.dumps(dict(t.params)), t.state.value, t.attempts, t.failures, t.value,
                         t.error, t.created_at, t.ended_at)


def attempt_row(sweep: str, a: Attempt) -> SweepAttemptRow:
    return SweepAttemptRow(sweep, a.trial, a.attempt, a.vm, a.started_at, a.deadline_at, a.hourly_usd, a.state.value,
                           a.ended_at, a.value, a.error, a.stopping)


def vm_row(sweep: str, v: Vm) -> SweepVmRow:
    return SweepVmRow(sweep, v.id, v.slot, v.state.value, v.hourly_usd, v.launched_at, v.lease_end, v.ready_at,
                      v.release_at, v.gone_at, v.trial, v.attempt, v.runs, v.error)


def trial_of(row: SweepTrialRow) -> Trial:
    return Trial(number=row.number, params=tuple(json.loads(row.params).items()), state=TrialState(row.state),
                 attempts=row.attempts, failures=row.failures, value=row.value, error=row.error,
                 created_at=row.created_at, ended_at=row.ended_at)


def attempt_of(row: SweepAttemptRow) -> Attempt:
    return Attempt(trial=row.trial, attempt=row.attempt, vm=row.vm, started_at=row.started_at,
                   deadline_at=row.deadline_at, hourly_usd=row.hourly_usd, state=Outcome(row.state),
                   ended_at=row.ended_at, value=row.value, error=row.error, stopping=row.stopping)


def vm_of(row: SweepVmRow) -> Vm:
    return Vm(id=row.id, slot=row.slot, state=VmState(row.state), hourly_usd=row.hourly_usd,
              launched_at=row.launched_at, lease_end=row.lease_end, ready_at=row.ready_at, release_at=row.release_at,
              gone_at=row.gone_at, trial=row.trial, attempt=row.attempt, runs=row.runs, error=row.error)


def load_snapshot(store: StateStore, sweep: SweepRecord) -> Snapshot:
    return Snapshot(
        trials=tuple(trial_of(r) for r in store.sweep_trials(sweep.id)),
        attempts=tuple(attempt_of(r) for r in store.sweep_attempts(sweep.id)),
        vms=tuple(vm_of(r) for r in store.sweep_vms(sweep.id)),
        counters=Counters(next_slot=sweep.next_slot, boot_failures=sweep.boot_failures, stop=sweep.stop_reason,
                          ended=sweep.ended_reason),
    )
