"""The notification hooks (docs/notifications.md): the code that decides calls one here (pipeline's
run end, recovery, gc, a sweep's end); a hook stores the event in the outbox and sends it within
about a second. It never raises and never waits longer: a delivery not made stays in the outbox for
the next command (notify/send.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cloudtrain.notify.model import DEFAULT_ON, Event, EventType, budget_type, preemption_event_id, run_end_type
from cloudtrain.notify.targets import Bound, NotifyTarget, bind, file_targets

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.recipe import LoadedRecipe
    from cloudtrain.state import StateStore

__all__ = ["DEFAULT_ON", "Event", "EventType", "NotifyTarget", "emit", "run_started", "run_ended", "attempt_lost",
           "attempt_recovered", "gc_leaks", "sweep_finished"]

Warn = Callable[[str], None] | None
F = TypeVar("F", bound=Callable[..., None])
# The sweep marks its trials' runs with this env: a sweep reports once (sweep.finished), not per trial.
_TRIAL_ENV = "CLOUDTRAIN_SWEEP_ID"


def _never_fails(hook: F) -> F:
    """A notification is never why a command fails: any error is one warning line."""

    @functools.wraps(hook)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported; the command goes on
            warn = kwargs.get("warn")
            if warn is not None:
                warn(f"notify: could not record or send the event: {type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def targets_of(config: Config | None, loaded: LoadedRecipe | None = None,
               recipe_path: Path | None = None) -> list[Bound]:
    """The config's targets and the recipe's, each once."""
    found = bind(list(getattr(config, "notify", None) or ()), "config")
    if loaded is not None:
        found += bind(list(getattr(loaded.recipe, "notify", None) or ()), "recipe", loaded.path)
    elif recipe_path is not None and recipe_path.is_file():
        found += bind(file_targets(recipe_path), "recipe", recipe_path)
    unique: dict[str, Bound] = {}
    for bound in found:
        unique.setdefault(bound.ref.key(), bound)
    return list(unique.values())


def emit(store: StateStore, event_type: EventType, data: dict[str, Any], targets: list[Bound],
         warn: Warn = None, budget_s: float | None = None, event_id: str | None = None) -> Event:
    """Store the event with a delivery per target that wants it, then send what is due (this one
    and any an earlier command could not) within the budget. `event_id`: an id that another sender
    of the same happening uses too (a preemption: model.preemption_event_id)."""
    from cloudtrain.notify import outbox, send

    fields = {k: v for k, v in data.items() if v is not None}
    event = Event(event_type, fields) if event_id is None else Event(event_type, fields, id=event_id)
    outbox.enqueue(store, event, [b for b in targets if b.target.wants(event_type)])
    known = {b.ref.key(): b.target for b in targets}
    send.report(send.flush(store, send.BUDGET_S if budget_s is None else budget_s, known=known), warn)
    return event


def _run_data(run_id: str, cluster: str | None, cloud: str | None, run_dir: Path | str | None,
              **more: Any) -> dict[str, Any]:
    return {"run": run_id, "cluster": cluster, "cloud": cloud, "run_dir": str(run_dir) if run_dir else None, **more}


def _is_trial(loaded: LoadedRecipe) -> bool:
    return _TRIAL_ENV in loaded.recipe.envs


def _prewarm(targets: list[Bound]) -> None:
    """Import Apprise while the run goes on (a few hundred ms, more on a busy machine), so that the
    run's end has its whole budget for sending."""
    import sys
    import threading

    if any(b.target.apprise for b in targets) and "apprise" not in sys.modules:
        threading.Thread(target=__import__, args=("apprise",), name="notify-prewarm", daemon=True).start()


@_never_fails
def run_started(store: StateStore, config: Config, loaded: LoadedRecipe, run_id: str, cluster: str,
                run_dir: Path, warn: Warn = None) -> None:
    if not _is_trial(loaded):
        targets = targets_of(config, loaded)
        _prewarm(targets)
        emit(store, EventType.RUN_STARTED, _run_data(run_id, cluster, loaded.recipe.resources.cloud, run_dir,
                                                     status="running"), targets, warn=warn)


@_never_fails
def run_ended(store: StateStore, config: Config, loaded: LoadedRecipe, record: Any, run_dir: Path,
              warn: Warn = None) -> None:
    """`record`: the run's run.json (run/record.RunJson), written just before."""
    if _is_trial(loaded):
        return
    attempts = len(record.attempts) or None
    data = _run_data(record.run_id, record.cluster, record.provider, run_dir, status=str(record.status),
                     exit_code=record.exit_code, cost_usd=round(record.cost_usd, 6), reason=record.error,
                     attempt=attempts, instance_type=record.instance_type, teardown=record.teardown,
                     wall_time_s=record.wall_time_s)
    targets = targets_of(config, loaded)
    budget = loaded.recipe.budget
    limit = budget.max_usd if budget is not None else None
    over = budget_type(record.cost_usd, limit)
    if over is not None:
        # Before the run's end, so a reader of the stream meets the cause first.
        emit(store, over, {**data, "budget_usd": limit, "spent_usd": data["cost_usd"]}, targets, warn=warn,
             budget_s=0.0)
    emit(store, run_end_type(str(record.status)), data, targets, warn=warn)


@_never_fails
def attempt_lost(store: StateStore, config: Config, loaded: LoadedRecipe, run_id: str, cluster: str,
                 attempt: Any, run_dir: Path, warn: Warn = None) -> None:
    """A recovering run's attempt ended because its node went (run/recover.Attempt)."""
    if _is_trial(loaded):
        return
    # The node's watchdog may have told the same preemption on the cloud's notice: the same id.
    same = preemption_event_id(cluster, attempt.incarnation) if attempt.incarnation else None
    emit(store, EventType.RUN_PREEMPTED, _run_data(
        run_id, cluster, attempt.cloud, run_dir, status=attempt.outcome, attempt=attempt.number, reason=attempt.reason,
        instance_type=attempt.instance_type, region=attempt.zone or attempt.region), targets_of(config, loaded),
        warn=warn, event_id=same)


@_never_fails
def attempt_recovered(store: StateStore, config: Config, loaded: LoadedRecipe, run_id: str, cluster: str,
                      attempt: Any, run_dir: Path, warn: Warn = None) -> None:
    """A relaunched attempt's job is about to resume (from its checkpoint, when one was kept)."""
    if _is_trial(loaded):
        return
    emit(store, EventType.RUN_RECOVERED, _run_data(
        run_id, cluster, attempt.cloud, run_dir, status="running", attempt=attempt.number,
        instance_type=attempt.instance_type, region=attempt.zone or attempt.region,
        resumed_from_epoch=attempt.resumed_from_epoch), targets_of(config, loaded), warn=warn)


# `gc` on a schedule (hourly in CI) finds the same leak again each time: the same leaks are told
# again once a day, while they still cost money, not every hour.
LEAKS_REMIND_S = 24 * 3600.0


def _leak_keys(found: list[dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted((str(f["cloud"]), str(f["cluster"]), tuple(sorted(map(str, f["ids"])))) for f in found)


def _told_lately(store: StateStore, found: list[dict[str, Any]], now: float) -> bool:
    """Whether the newest gc.leaks event of the last LEAKS_REMIND_S named exactly these leaks."""
    import json

    from cloudtrain.notify import outbox

    told = [row for row in outbox.events(store, since=now - LEAKS_REMIND_S, limit=1000)
            if row.type == EventType.GC_LEAKS.value]
    if not told:
        return False
    data = json.loads(told[-1].body).get("data", {})
    return _leak_keys(data.get("leaks", [])) == _leak_keys(found)


@_never_fails
def gc_leaks(store: StateStore | None, config: Config, leaks: list[Any], hourly_usd: float, unknown: int,
             warn: Warn = None) -> None:
    """What `gc` found leaked (providers/leak.Leak), with $/h. `store`: None opens this machine's."""
    if store is None:
        from cloudtrain.state import StateStore

        store = StateStore()
    found = [{"cloud": leak.cloud, "cluster": leak.cluster, "ids": list(leak.ids), "reason": leak.reason,
              "hourly_usd": leak.hourly_usd} for leak in leaks]
    if _told_lately(store, found, time.time()):
        return
    clusters = sorted({str(leak.cluster) for leak in leaks})
    emit(store, EventType.GC_LEAKS, {"cluster": ", ".join(clusters)[:200], "leaks": found, "hourly_usd": hourly_usd,
                                     "unknown_price": unknown, "reason": f"{len(leaks)} leaked"},
         targets_of(config), warn=warn)


@_never_fails
def sweep_finished(store: StateStore, config: Config, recipe_path: str, summary: dict[str, Any],
                   warn: Warn = None) -> None:
    """A sweep's end (sweep/session.summary_of), with its budget events."""
    targets = targets_of(config, recipe_path=Path(recipe_path))
    spent, limit = float(summary.get("spent_usd") or 0.0), summary.get("budget_usd")
    data = {"sweep": summary.get("id"), "name": summary.get("name"), "status": summary.get("status"),
            "reason": summary.get("ended"), "cost_usd": spent, "budget_usd": limit, "trials": summary.get("trials")}
    over = budget_type(spent, limit, exhausted=summary.get("ended") == "budget exhausted")
    if over is not None:
        emit(store, over, {**data, "spent_usd": spent}, targets, warn=warn, budget_s=0.0)
    emit(store, EventType.SWEEP_FINISHED, data, targets, warn=warn)
