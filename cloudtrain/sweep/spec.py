"""From a sweep recipe to what the scheduler needs: checks, the money model, each trial's recipe.

`check_sweep` is the sweep's preflight: the base recipe passes the same checks as `run` (with the
same file:line errors), every swept parameter is checked against what it feeds (a bundled job's
parameter schema, or an environment variable name), and the plan's price gives the worst case of
one VM. The plan is the trial's as it runs (`trial_base`: the pipeline's recovery off), so it
promises no relaunch; `retry_line` says what the sweep does with a lost trial instead. Nothing is
created.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from cloudtrain.errors import RecipeError
from cloudtrain.sweep.model import Costs, Limits, ParamValue
from cloudtrain.yamlfile import did_you_mean, line_of

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.plan import Plan
    from cloudtrain.recipe import LoadedRecipe, Sweep

# What the bundled job reports per epoch (its progress lines), for early stopping.
EPOCH_KEYS = ("loss", "accuracy", "val_loss", "val_accuracy")
DEADLINE_ENV = "CLOUDTRAIN_DEADLINE_S"


@dataclass(frozen=True)
class SweepSpec:
    """Fixed when the sweep starts and stored with it: a resume uses this, not a re-read recipe."""

    costs: Costs
    limits: Limits
    method: str
    metric: str
    goal: str  # min | max
    progress_metric: str  # the per-epoch value reported for early stopping and shown live
    params: tuple[str, ...]
    log_params: tuple[str, ...]  # loguniform ones: plotted on a log axis
    max_epochs: int | None
    early_stopping: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SweepSpec:
        data = json.loads(text)
        data["costs"] = Costs(**data["costs"])
        data["limits"] = Limits(**data["limits"])
        for key in ("params", "log_params"):
            data[key] = tuple(data[key])
        return cls(**data)


def base_recipe(loaded: LoadedRecipe) -> LoadedRecipe:
    """The recipe without its sweep section: what every trial runs, with its parameters."""
    return loaded.model_copy(update={"recipe": loaded.recipe.model_copy(update={"sweep": None})})


def trial_base(loaded: LoadedRecipe) -> LoadedRecipe:
    """The recipe a trial runs, before its parameters: the base recipe with the pipeline's recovery
    off. The scheduler owns a lost trial's retry (`sweep.max_retries`, on a VM it counts against the
    budget); a recipe's `recover:` (on by default for spot) would relaunch the same loss a second
    time, on a machine the scheduler does not count (issue 36.1; sweep/backend.py runs it so)."""
    base = base_recipe(loaded)
    return base.model_copy(update={"recipe": base.recipe.model_copy(update={"recover": None})})


def trial_plan(loaded: LoadedRecipe, config: Config) -> Plan | None:
    """The preflight of a trial as it runs (`trial_base`), and its plan on priced clouds. Planned
    from the recipe as written, a spot sweep's plan would say `recover: up to 3 relaunch(es)`."""
    from cloudtrain.preflight import preflight

    return preflight(trial_base(loaded), config)


def retry_line(loaded: LoadedRecipe, spec: SweepSpec) -> str:
    """What happens to a trial whose attempt fails or whose VM is lost: what a lone run's plan says
    as `recover: up to N relaunch(es)`, which a sweep's trials do not do."""
    retries = spec.limits.max_retries
    if retries:
        line = (f"retries: the sweep runs a failed, preempted or lost trial again, up to {retries} time(s), "
                f"on a VM it counts against the budget (a preempted or lost one carries its kept checkpoint over)")
    else:
        line = "retries: none (sweep.max_retries: 0): a failed, preempted or lost trial ends failed"
    recovery = loaded.recipe.recovery
    if recovery is not None and recovery.max_restarts:
        line += f"; the recipe's recover: (up to {recovery.max_restarts} relaunch(es)) does not apply to trials"
    return line


def check_sweep(loaded: LoadedRecipe, config: Config) -> SweepSpec:
    """Every static check of a sweep recipe; raises one located line, like `validate`."""
    sweep = loaded.recipe.sweep
    if sweep is None:
        raise RecipeError(f"{loaded.path}: no 'sweep' section: `cloudtrain run` runs a single job",
                          hint="add sweep: {parameters: ..., budget_usd: ..., metric: ..., goal: max}")
    plan = trial_plan(loaded, config)
    _check_params(loaded, sweep)
    recipe = loaded.recipe
    progress_metric = _progress_metric(loaded, sweep)
    hourly = min_s = 0.0
    if plan is not None:
        from cloudtrain.cost import billing_minimum_s

        # Failover may land on any candidate placement: admission must assume the dearest price and
        # the longest minimum billed time per start of the clouds it may land on.
        hourly = max(p.hourly_price for p in plan.candidates) * recipe.num_nodes
        min_s = max(billing_minimum_s(p.cloud) for p in plan.candidates)
    reserve = sweep.reserve
    costs = Costs(budget_usd=sweep.budget_usd, hourly_usd=hourly, boot_s=reserve.boot_minutes * 60,
                  prep_s=reserve.setup_minutes * 60, deadline_s=sweep.trial_deadline_minutes * 60,
                  post_s=reserve.collect_minutes * 60, release_s=reserve.release_minutes * 60, min_s=min_s)
    grid = sweep.grid_size()
    max_trials = min(x for x in (sweep.max_trials, grid) if x is not None)
    limits = Limits(max_trials=max_trials, max_parallel=sweep.max_parallel, max_retries=sweep.max_retries,
                    max_boot_failures=max(3, sweep.max_parallel))
    if costs.new_vm_usd() > costs.budget_usd:
        raise RecipeError(
            _located(loaded, ("sweep", "budget_usd"),
                     f"${sweep.budget_usd:g} does not cover one trial's worst case: ${costs.new_vm_usd():.2f} "
                     f"(${hourly:.4g}/h x ({_minutes(costs.boot_s)} boot + {_minutes(costs.window_s)} trial + "
                     f"{_minutes(costs.release_s)} release))"),
            hint="raise budget_usd, or lower trial_deadline_minutes or the reserve",
        )
    return SweepSpec(costs=costs, limits=limits, method=sweep.method, metric=sweep.metric, goal=sweep.goal,
                     progress_metric=progress_metric, params=tuple(sweep.parameters),
                     log_params=tuple(n for n, p in sweep.parameters.items() if p.loguniform is not None),
                     max_epochs=_max_epochs(loaded, sweep), early_stopping=sweep.early_stopping is not None)


def lease_note(loaded: LoadedRecipe) -> str | None:
    """Why this sweep's VMs cannot take a lease (their on-node watchdog deleting them at lease end,
    CLI or not), or None when they do. Without one, the budget holds while the CLI runs and the
    job's deadline holds on the node, but a VM outlives a dead CLI until `sweep resume`/`stop`."""
    from cloudtrain.providers import ANY, available, implements
    from cloudtrain.providers.base import SelfStopping

    cloud = loaded.recipe.resources.cloud
    if cloud == ANY:
        from cloudtrain.cluster.planning import priced_clouds

        clouds = list(priced_clouds())
    else:
        clouds = [cloud]
    unable = []
    for name in clouds:
        if name not in available():
            continue  # refused by the preflight with its own message
        if not implements(name, SelfStopping):  # what stops itself can delete itself too
            unable.append(name)
    if not unable:
        return None
    return (f"cloud {', '.join(unable)} cannot delete its machines from the machine itself (no on-node watchdog "
            f"delete): the sweep's VMs take no lease there, so the bound covers each job's deadline on the node "
            f"but not a VM's lifetime after the CLI dies; `sweep resume ID` or `sweep stop ID` releases them")


def trial_recipe(base: LoadedRecipe, params: Mapping[str, ParamValue]) -> tuple[LoadedRecipe, dict[str, str]]:
    """A trial's recipe and extra environment: parameters become the bundled job's flags, or
    environment variables of a `run` command."""
    recipe = base.recipe
    if recipe.job is not None:
        job = recipe.job.model_copy(update={"params": {**recipe.job.params, **params}})
        return base.model_copy(update={"recipe": recipe.model_copy(update={"job": job})}), {}
    return base, {name: env_text(value) for name, value in params.items()}


def env_text(value: ParamValue) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _check_params(loaded: LoadedRecipe, sweep: Sweep) -> None:
    job = loaded.recipe.job
    for name, param in sweep.parameters.items():
        where = ("sweep", "parameters", name)
        if job is None:
            if name.upper().startswith("CLOUDTRAIN_"):
                raise RecipeError(_located(loaded, where, f"{name}: CLOUDTRAIN_* variables are set by cloudtrain"))
            continue
        from cloudtrain.jobs.params import JOBS, ParamProblem, check_params

        schema = JOBS[job.name]
        spec = schema.get(name)
        if name.replace("-", "_") in schema.reserved or spec is None:
            hint = did_you_mean(name, schema.names()) or f"{job.name} takes: {', '.join(schema.names())}"
            why = "is set by cloudtrain" if name in schema.reserved else f"is not a parameter of {job.name}"
            raise RecipeError(_located(loaded, where, f"{name} {why}"), hint=hint)
        if (param.uniform or param.loguniform) is not None and spec.type is not float:
            raise RecipeError(_located(loaded, where, f"{name} takes {spec.type.__name__} values, not a float range"),
                              hint="use int: [LOW, HIGH] or a list" if spec.type is int else "use a list")
        if param.integer is not None and spec.type not in (int, float):
            raise RecipeError(_located(loaded, where, f"{name} takes {spec.type.__name__} values, not numbers"))
        values: Sequence[ParamValue] = param.listed or param.uniform or param.loguniform or param.integer or ()
        for value in values:
            try:
                check_params(job.name, {name: value})
            except ParamProblem as problem:
                raise RecipeError(_located(loaded, where, problem.message if problem.message.startswith(name)
                                           else f"{name}: {problem.message}"), hint=problem.hint) from None


def _progress_metric(loaded: LoadedRecipe, sweep: Sweep) -> str:
    stopping = sweep.early_stopping
    if stopping is not None and stopping.metric:
        metric = stopping.metric
    elif sweep.metric.startswith("test_"):
        metric = "val_" + sweep.metric[len("test_"):]
    else:
        metric = sweep.metric
    if loaded.recipe.job is not None and stopping is not None and metric not in EPOCH_KEYS:
        where = ("sweep", "early_stopping", "metric") if stopping.metric else ("sweep", "early_stopping")
        raise RecipeError(_located(loaded, where, f"early stopping needs a per-epoch value; {loaded.recipe.job.name} "
                                                  f"reports {', '.join(EPOCH_KEYS)}, not {metric!r}"),
                          hint="set early_stopping.metric")
    return metric


def _max_epochs(loaded: LoadedRecipe, sweep: Sweep) -> int | None:
    job = loaded.recipe.job
    if job is None:
        return None
    param = sweep.parameters.get("epochs")
    if param is not None:
        values = param.listed or param.integer or ()
        numbers = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return max(numbers) if numbers else None
    epochs = job.params.get("epochs", 10)
    return int(epochs) if isinstance(epochs, (int, float)) and not isinstance(epochs, bool) else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def _located(loaded: LoadedRecipe, loc: Sequence[str], message: str) -> str:
    line = line_of(loaded.node, list(loc)) if loaded.node is not None else None
    where = f"{loaded.path}:{line}" if line else str(loaded.path)
    return f"{where}: {'.'.join(loc)}: {message}"
