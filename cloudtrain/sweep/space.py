"""Optuna behind the scheduler's `Sampler`: ask-and-tell sampling (grid, random, TPE) and pruning
(successive halving, Hyperband) on the per-epoch metric.

Where the study lives is decided here only (`study_location`):
- this machine's state (SQLite): under the cloudtrain home, in Optuna's journal storage (an
  append-only file with locking, safe against a killed process): an ask plus a tell costs ~1.5 ms
  there against ~22 ms in Optuna's SQLite storage, which also takes ~0.8 s to create its schema
  (benchmarks/sweep_overhead.py measures both);
- a team database (state_url): in that same PostgreSQL database, Optuna's own RDBStorage, so that
  a sweep resumed from another member's laptop goes on with the same study (trial numbers and
  what the sampler learnt). Its tables are Optuna's (studies, trials, ..., alembic_version: none
  is a name of ours, state/schema_pg.py), next to ours in the URL's schema. Members may not
  create tables (state/team.py's grants), so the admin's `team init`/`team migrate` creates them
  and their grants name them (state/optuna_tables.py, the state's part of the team database). The connection is opened
  as the state's own (state/pg.py `connect`: libpq reads the URL, ~/.pgpass or a service file;
  no password ever appears in a URL or a message).
Optuna is imported only here and in state/optuna_tables.py (Optuna's tables in the team database).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.sweep.model import ParamValue, TrialState

if TYPE_CHECKING:
    from cloudtrain.recipe import Sweep


def distributions(sweep: Sweep) -> dict[str, Any]:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for name, param in sweep.parameters.items():
        if param.listed is not None:
            out[name] = CategoricalDistribution(list(param.listed))
        elif param.uniform is not None:
            out[name] = FloatDistribution(*param.uniform)
        elif param.loguniform is not None:
            out[name] = FloatDistribution(*param.loguniform, log=True)
        else:
            assert param.integer is not None
            out[name] = IntDistribution(*param.integer)
    return out


class OptunaSampler:
    """The scheduler's Sampler over one Optuna study (see the module docstring)."""

    def __init__(self, sweep: Sweep, study: Path | str | None, study_name: str, max_epochs: int | None = None) -> None:
        """`study`: where the study lives (`study_location`): a journal file, a team database's URL,
        or None (in memory)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Re-reporting an epoch after a retry or a resume is expected; Optuna keeps the first value.
        warnings.filterwarnings("ignore", message=".*already reported.*")
        self.sweep = sweep
        self.optuna = optuna
        self.dists = distributions(sweep)
        seed = sweep.seed
        if sweep.method == "grid":
            space = {name: list(p.listed or ()) for name, p in sweep.parameters.items()}
            sampler: Any = optuna.samplers.GridSampler(space, seed=seed)
        elif sweep.method == "random":
            sampler = optuna.samplers.RandomSampler(seed=seed)
        else:
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, (sweep.max_trials or 10) // 3)))
        stopping = sweep.early_stopping
        pruner: Any = optuna.pruners.NopPruner()
        if stopping is not None and stopping.method == "successive_halving":
            pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=stopping.min_epochs,
                                                             reduction_factor=stopping.reduction_factor)
        elif stopping is not None:
            pruner = optuna.pruners.HyperbandPruner(min_resource=stopping.min_epochs,
                                                    max_resource=max_epochs if max_epochs else "auto",
                                                    reduction_factor=stopping.reduction_factor)
        self.storage = open_storage(study)
        try:
            self.study = optuna.create_study(storage=self.storage, sampler=sampler, pruner=pruner,
                                             study_name=study_name,
                                             direction="maximize" if sweep.goal == "max" else "minimize",
                                             load_if_exists=True)
        except BaseException:
            self.close()
            raise
        self._trials: dict[int, Any] = {}

    def close(self) -> None:
        """Give back the study's database connections (a team database's); a journal holds none."""
        engine = getattr(self.storage, "engine", None)
        if engine is not None:
            self.storage.scoped_session.remove()
            engine.dispose()

    def capacity(self) -> int | None:
        return self.sweep.grid_size()

    def ask(self) -> tuple[int, Mapping[str, ParamValue]] | None:
        trial = self.study.ask(self.dists)
        self._trials[trial.number] = trial
        return trial.number, {name: _plain(trial.params[name]) for name in self.dists}

    def report(self, trial: int, step: int, value: float) -> bool:
        handle = self._trial(trial)
        if handle is None:
            return False
        handle.report(value, step)
        return bool(handle.should_prune())

    def tell(self, trial: int, state: TrialState, value: float | None) -> None:
        states = self.optuna.trial.TrialState
        try:
            if state == TrialState.SUCCEEDED and value is not None and math.isfinite(value):
                self.study.tell(trial, value, skip_if_finished=True)
            elif state == TrialState.PRUNED:
                self.study.tell(trial, state=states.PRUNED, skip_if_finished=True)
            else:
                self.study.tell(trial, state=states.FAIL, skip_if_finished=True)
        except ValueError:
            # A trial number the study does not know (its ask was lost): nothing to tell.
            pass
        except RuntimeError as exc:
            # GridSampler calls Study.stop() once the grid is done, which only works inside optimize();
            # the tell itself was stored before that (optuna's _tell_with_warning, `finally`).
            if "Study.stop" not in str(exc):
                raise
        self._trials.pop(trial, None)

    def forget_unknown(self, known: set[int]) -> None:
        """After a crash: trials the study handed out that the sweep never recorded are failed."""
        states = self.optuna.trial.TrialState
        for frozen in self.study.get_trials(deepcopy=False, states=(states.RUNNING,)):
            if frozen.number not in known:
                self.study.tell(frozen.number, state=states.FAIL, skip_if_finished=True)

    def _trial(self, number: int) -> Any:
        handle = self._trials.get(number)
        if handle is None:
            # After a resume: rebuild the handle of a trial that is still running in the study.
            for frozen in self.study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
                if frozen.number == number:
                    handle = self.optuna.trial.Trial(self.study, frozen._trial_id)
                    self._trials[number] = handle
                    break
        return handle


def study_location(state: Path | str, sweep_id: str) -> Path | str:
    """Where sweep `sweep_id`'s Optuna study lives, for a state store at `state` (StateStore.path):
    the team database itself (its URL), else a journal file under this machine's cloudtrain home."""
    from cloudtrain.state.location import is_postgres

    if is_postgres(state):
        return str(state)
    from cloudtrain import paths

    return paths.home() / "sweeps" / sweep_id / "optuna.journal"


def open_storage(study: Path | str | None) -> Any:
    """Optuna's storage for `study_location`'s answer (None: Optuna's in-memory storage)."""
    if study is None:
        return None
    if isinstance(study, str):
        from cloudtrain.state.optuna_tables import team_storage

        return team_storage(study)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(study)))


def _plain(value: Any) -> ParamValue:
    """Optuna may hand back numpy scalars for grid values; parameters stay plain Python."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    item = getattr(value, "item", None)
    return item() if callable(item) else value
