"""Recipe schema (pydantic, unknown keys rejected), `${VAR}` interpolation and loading."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema,
                      field_validator, model_validator)

from cloudtrain.config import StrictModel
from cloudtrain.errors import RecipeError
from cloudtrain.names import NAME_RE, NAME_RULE
from cloudtrain.notify.targets import NotifyTarget
from cloudtrain.providers import ANY as ANY_CLOUD
from cloudtrain.providers import KNOWN as KNOWN_CLOUDS
from cloudtrain.providers.slurm.settings import SlurmSettings
from cloudtrain.recipe.recover import DEFAULT_RECOVER, Recover, recover_input
from cloudtrain.yamlfile import format_validation_error, line_of, read_yaml

Cloud = Literal[(*KNOWN_CLOUDS, ANY_CLOUD)]  # type: ignore[valid-type]
_ACCEL_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9-]*)(?::(?P<count>[1-9][0-9]*))?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The same rules in JSON Schema's (ECMA 262) regex dialect, for editors; the validators above are the
# ones that decide. tests/test_recipe.py checks both agree on examples.
ACCELERATORS_PATTERN = r"^[A-Za-z][A-Za-z0-9-]*(:[1-9][0-9]*)?$"
NAME_PATTERN = r"^([a-z][a-z0-9-]{0,38}[a-z0-9]|[a-z])$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# setup/run are shell that runs on the node with `envs` exported: `${VAR}` there is the node
# shell's business, so we leave those two fields alone.
# notify: too, whose ${SECRET}s are read when an event is sent, never kept (notify/targets.py).
_SHELL_FIELDS = frozenset({"setup", "run", "notify"})


def _given_hosts(cloud: str) -> bool:
    """Whether the cloud's machines are the recipe's hosts (GivenHosts); False for clouds this build
    cannot use (refused later, with a hint)."""
    from cloudtrain.providers import available, implements
    from cloudtrain.providers.base import GivenHosts

    return cloud in available() and implements(cloud, GivenHosts)


def _priced(cloud: str) -> bool:
    from cloudtrain.providers import available, traits

    return cloud in available() and traits(cloud).priced


def _self_stopping(cloud: str) -> bool:
    from cloudtrain.providers import available, implements
    from cloudtrain.providers.base import SelfStopping

    return cloud in available() and implements(cloud, SelfStopping)


def _cloud_fields(cloud: str) -> bool:
    """Whether region, zone, instance type... mean something on the cloud (True where unknown)."""
    from cloudtrain.providers import available, traits

    return traits(cloud).cloud_fields if cloud in available() else True


def _schedules(cloud: str) -> bool:
    from cloudtrain.providers import schedules

    return schedules(cloud)


def _host_clouds() -> str:
    from cloudtrain.providers import available

    return " or ".join(c for c in available() if _given_hosts(c))


def _env_text(value: Any) -> Any:
    # YAML turns `EPOCHS: 3` into an int and `DEBUG: true` into a bool; an environment variable is text.
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"must be a string, number or boolean, got {'null' if value is None else type(value).__name__}")


EnvValue = Annotated[
    str,
    BeforeValidator(_env_text),
    WithJsonSchema({"type": ["string", "number", "boolean"],
                    "description": "exported as text: numbers as written, booleans as true/false"}),
]


class SshHost(StrictModel):
    address: str = Field(min_length=1)
    user: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    key: str | None = None
    proxy_command: str | None = None


class Resources(StrictModel):
    cloud: Cloud = "local"
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    max_hourly_usd: Annotated[float, Field(gt=0, description="highest on-demand/spot price per node, USD/h")] | None = None
    accelerators: str | None = Field(default=None, description="GPU type and count, e.g. T4:1 or V100:8",
                                     json_schema_extra={"pattern": ACCELERATORS_PATTERN})
    allow_more_accelerators: bool = Field(
        default=False, description="the plan and its failover may use a type with more GPUs per node than "
                                   "accelerators asks for (T4:1 on a T4:4 type, at its price); default: exactly that many")
    cpus: Annotated[int, Field(ge=1)] | None = None
    memory: Annotated[float, Field(gt=0, description="GiB")] | None = None
    spot: bool = False
    disk_gb: Annotated[int, Field(ge=8, le=65536)] | None = None
    allow_cpu_fallback: bool = Field(
        default=False, description="A GPU recipe on a node whose probe sees no GPU (a broken driver): train on "
                                   "the CPU with a loud warning instead of failing before the job")
    image: str | None = None
    hosts: list[SshHost] | None = Field(default=None, description="cloud: ssh (the machines), slurm (its login node)")
    slurm: SlurmSettings | None = Field(default=None, description="cloud: slurm only: partition, account, qos, time")

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: str | None) -> str | None:
        if value is not None and not _ACCEL_RE.match(value):
            raise ValueError(f"expected GPU:COUNT like 'T4:1' or 'V100:8', got {value!r}")
        return value

    @model_validator(mode="after")
    def _hosts_only_where_taken(self) -> Resources:
        takes_hosts = _given_hosts(self.cloud)
        if self.hosts and not takes_hosts:
            raise ValueError(f"'hosts' only applies to cloud: {_host_clouds()}, not cloud: {self.cloud}")
        if takes_hosts and not self.hosts:
            raise ValueError(f"cloud: {self.cloud} needs a 'hosts' list, e.g. hosts: [{{address: 10.0.0.5, user: ubuntu}}]")
        if self.slurm is not None and not _schedules(self.cloud):
            raise ValueError(f"'slurm' only applies to a scheduler's cloud (slurm), not cloud: {self.cloud}")
        if self.hosts and len(self.hosts) > 1 and _schedules(self.cloud):
            raise ValueError(f"cloud: {self.cloud} takes one host, its login node; num_nodes says how many nodes to allocate")
        if self.zone and not self.region and _cloud_fields(self.cloud):
            raise ValueError("'zone' needs 'region' too")
        if self.allow_more_accelerators and not self.accelerators:
            raise ValueError("'allow_more_accelerators' needs 'accelerators' (the GPUs per node it may exceed)")
        return self

    @property
    def accelerator_name(self) -> str | None:
        return _ACCEL_RE.match(self.accelerators).group("name") if self.accelerators else None  # type: ignore[union-attr]

    @property
    def accelerator_count(self) -> int:
        if not self.accelerators:
            return 0
        return int(_ACCEL_RE.match(self.accelerators).group("count") or 1)  # type: ignore[union-attr]


class DataMount(StrictModel):
    source: str = Field(min_length=1, description="local path (file or directory), relative to the recipe, or a "
                        "bucket: s3://bucket/prefix, gs://bucket/prefix, az://account/container/prefix")
    target: str = Field(min_length=1, description="path on the node, relative to the workdir, without '..'")

    @field_validator("source")
    @classmethod
    def _bucket_url(cls, value: str) -> str:
        from cloudtrain.buckets.url import is_bucket_url, parse_bucket_url

        if is_bucket_url(value):
            parse_bucket_url(value)  # one line saying what is wrong (docs/data.md)
        return value

    region: str | None = Field(default=None, description="a bucket source's region: `plan` warns and estimates "
                               "the transfer cost when the job runs elsewhere")
    size_gb: Annotated[float, Field(gt=0)] | None = Field(default=None, description="about how much a bucket source "
                                                          "holds, for that estimate")

    @model_validator(mode="after")
    def _bucket_fields(self) -> DataMount:
        if not self.is_bucket and (self.region is not None or self.size_gb is not None):
            raise ValueError("region and size_gb describe a bucket source (s3://, gs://, az://), not a local path")
        return self

    @property
    def is_bucket(self) -> bool:
        return "://" in self.source

    @field_validator("target")
    @classmethod
    def _target_inside_workdir(cls, value: str) -> str:
        # The node's layout is cloudtrain's business: data lands in the workdir, where the job runs.
        if value.startswith(("/", "~")) or ".." in Path(value).parts:
            raise ValueError(
                f"data targets are relative to the workdir on the node, without '..' or '~', got {value!r}"
            )
        return value


class BundledJob(StrictModel):
    name: Literal["mnist_cnn"]
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not re.match(r"^[a-z][a-z0-9_-]*$", key):
                raise ValueError(f"job parameter names look like 'epochs' or 'batch_size', got {key!r}")
        return value


class Autostop(StrictModel):
    idle_minutes: Annotated[int, Field(ge=1)] = 30
    down: bool = False
    wait_for: Literal["jobs_and_ssh", "jobs", "none"] = Field(
        default="jobs_and_ssh",
        description="what keeps a node up: cloudtrain jobs and SSH sessions, jobs only, or nothing")
    gpu_util_below: Annotated[float, Field(gt=0, le=100)] | None = Field(
        default=None, description="a running job keeps the node up only while a GPU's utilization is at least this "
                                  "percent (docs/watchdog.md)")

    # Whole days: the count travels as a tag/label value, and Compute Engine labels take only
    # lowercase letters, digits, `-` and `_` (no decimal point). docs/watchdog.md, stopped then deleted.
    delete_after_stopped_days: Annotated[int, Field(ge=1, le=3650)] | None = Field(
        default=None, description="a node the watchdog stopped is deleted, with its disks, by `cloudtrain gc --expired "
                                  "--yes` once it has stayed stopped this many days (docs/watchdog.md)")

    @model_validator(mode="after")
    def _gpu_needs_jobs(self) -> Autostop:
        if self.gpu_util_below is not None and self.wait_for == "none":
            raise ValueError("gpu_util_below judges running jobs, and wait_for: none waits for none: "
                             "use wait_for: jobs or jobs_and_ssh, or drop gpu_util_below")
        if self.delete_after_stopped_days is not None and self.down:
            raise ValueError("delete_after_stopped_days deletes a node some days after it stopped, and down: true "
                             "deletes it at once: drop one of them")
        return self


# What a priced cluster gets when its recipe does not mention autostop (docs/watchdog.md).
DEFAULT_AUTOSTOP = Autostop(idle_minutes=30)


def _autostop_input(value: Any) -> Any:
    """`autostop: false` turns it off; a bare number gets the line to write instead of a type error."""
    if value is False:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"write the idle time as a mapping: `autostop: {{idle_minutes: {value:g}}}` "
                         "(add `down: true` to delete instead of stop; `autostop: false` for none)")
    if value is True or isinstance(value, str):
        raise ValueError("expected a mapping such as `autostop: {idle_minutes: 30}`, or `autostop: false` for none")
    return value


class Budget(StrictModel):
    max_usd: Annotated[float, Field(gt=0)] | None = None
    max_hours: Annotated[float, Field(gt=0)] | None = None


SweepValue = str | int | float | bool
_SWEEP_PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SweepParam(StrictModel):
    """One swept parameter: a list of values (the grid, or a choice for random/tpe), or one range."""

    values: list[SweepValue] | None = Field(default=None, min_length=1, description="written as a plain list")
    choice: list[SweepValue] | None = Field(default=None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    integer: tuple[int, int] | None = Field(default=None, alias="int")

    @model_validator(mode="before")
    @classmethod
    def _plain_list(cls, value: Any) -> Any:
        return {"values": value} if isinstance(value, list) else value

    @model_validator(mode="after")
    def _one_kind(self) -> SweepParam:
        given = [k for k in ("values", "choice", "uniform", "loguniform", "integer") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give a list of values, or exactly one of choice, uniform, loguniform, int "
                             "(e.g. {loguniform: [0.0001, 0.01]})")
        low_high = self.uniform or self.loguniform or self.integer
        if low_high is not None:
            low, high = low_high
            if not low < high:
                raise ValueError(f"a range is [low, high] with low < high, got [{low}, {high}]")
            if self.loguniform is not None and low <= 0:
                raise ValueError(f"loguniform needs low > 0, got {low}")
        return self

    @property
    def listed(self) -> list[SweepValue] | None:
        """The values when the parameter is a list or a choice."""
        return self.values if self.values is not None else self.choice


class EarlyStopping(StrictModel):
    method: Literal["hyperband", "successive_halving"] = "hyperband"
    metric: str | None = Field(default=None, description="per-epoch progress value; default: the sweep metric, "
                                                         "or val_X for a metric test_X")
    min_epochs: Annotated[int, Field(ge=1)] = 1
    reduction_factor: Annotated[int, Field(ge=2)] = 3


class SweepReserve(StrictModel):
    """Time reserved in each trial's worst-case cost besides the job's own deadline."""

    boot_minutes: Annotated[float, Field(gt=0)] = 10.0
    setup_minutes: Annotated[float, Field(gt=0)] = 5.0
    collect_minutes: Annotated[float, Field(gt=0)] = 2.0
    release_minutes: Annotated[float, Field(gt=0)] = 2.0


_SCALAR = {"type": ["string", "number", "boolean"]}
_PAIR = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
# Editors see what validation accepts: a plain list, or a mapping with exactly one kind.
_SWEEP_PARAM_SCHEMA = {"anyOf": [
    {"type": "array", "items": _SCALAR, "minItems": 1},
    {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1, "properties": {
        "choice": {"type": "array", "items": _SCALAR, "minItems": 1}, "uniform": _PAIR, "loguniform": _PAIR,
        "int": {**_PAIR, "items": {"type": "integer"}}}},
]}


class Sweep(StrictModel):
    method: Literal["grid", "random", "tpe"] = "tpe"
    parameters: dict[str, Annotated[SweepParam, WithJsonSchema(_SWEEP_PARAM_SCHEMA)]] = Field(min_length=1)
    max_trials: Annotated[int, Field(ge=1)] | None = Field(default=None, description="default: the grid's size")
    max_parallel: Annotated[int, Field(ge=1, le=256)] = 1
    budget_usd: Annotated[float, Field(gt=0, description="hard: the sweep never spends more")]
    metric: str = Field(min_length=1, description="a key of the job's metrics.json")
    goal: Literal["min", "max"]
    trial_deadline_minutes: Annotated[float, Field(gt=0, description="hard, enforced on the node")] = 60.0
    max_retries: Annotated[int, Field(ge=0, le=10)] = 1
    early_stopping: EarlyStopping | None = None
    seed: int | None = None
    reserve: SweepReserve = Field(default_factory=SweepReserve)

    @field_validator("parameters")
    @classmethod
    def _names(cls, value: dict[str, SweepParam]) -> dict[str, SweepParam]:
        for name in value:
            if not _SWEEP_PARAM_RE.match(name):
                raise ValueError(f"parameter names look like lr or batch_size, got {name!r}")
        return value

    @model_validator(mode="after")
    def _method_fits(self) -> Sweep:
        if self.method == "grid":
            ranged = [n for n, p in self.parameters.items() if p.listed is None]
            if ranged:
                raise ValueError(f"method grid needs a list of values for every parameter; {', '.join(ranged)} "
                                 "is a range (use method random or tpe, or list the values)")
        elif self.max_trials is None:
            raise ValueError(f"method {self.method} needs max_trials")
        return self

    def grid_size(self) -> int | None:
        if self.method != "grid":
            return None
        size = 1
        for param in self.parameters.values():
            size *= len(param.listed or ())
        return size


class Recipe(StrictModel):
    name: str = Field(description="lowercase letters, digits and '-', starting with a letter; the default cluster name",
                      json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 40})
    resources: Resources = Field(default_factory=Resources)
    num_nodes: Annotated[int, Field(ge=1, le=512)] = 1
    workdir: str | None = None
    data: list[DataMount] = Field(default_factory=list)
    envs: dict[str, EnvValue] = Field(default_factory=dict, json_schema_extra={
        "propertyNames": {"pattern": ENV_NAME_PATTERN}})
    setup: str | None = None
    run: str | None = None
    job: BundledJob | None = None
    results: list[str] = Field(default_factory=list)
    upload: str | None = Field(default=None, description="a bucket (s3://bucket/prefix, ...) the node uploads the "
                               "results to when the job ends, under <prefix>/<run-id>/ (docs/data.md)")
    autostop: Annotated[Autostop | None, BeforeValidator(_autostop_input)] = Field(
        default=None, description="stop (or delete) idle nodes: a mapping such as {idle_minutes: 30}; false: none")
    budget: Budget | None = None
    recover: Annotated[Recover | None, BeforeValidator(recover_input)] = Field(
        default=None, description="relaunch elsewhere when the node is preempted or lost (default: on for spot); "
                                  "a mapping such as {max_restarts: 3}, true, or false")
    sweep: Sweep | None = Field(default=None, description="makes this a sweep recipe: `cloudtrain sweep run` runs it")
    notify: list[NotifyTarget] = Field(default_factory=list, description="where this run's events go, besides "
                                       "config's: signed webhooks, Apprise URLs (docs/notifications.md)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError(f"name must be {NAME_RULE}, got {value!r}")
        return value

    @field_validator("envs", mode="before")
    @classmethod
    def _env_names(cls, value: Any) -> Any:
        # Values are made text one by one (EnvValue), so their errors name envs.KEY and its line.
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
                    raise ValueError(f"environment variable names look like MY_VAR, got {key!r}")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep_only_for_sweeps(cls, value: Sweep | None, info: ValidationInfo) -> Sweep | None:
        if value is not None and not (info.context or {}).get("sweep"):
            raise ValueError("this is a sweep recipe: `cloudtrain sweep run FILE` runs it and "
                             "`cloudtrain sweep validate FILE` checks it (`run` and `up` take one job)")
        return value

    @field_validator("results")
    @classmethod
    def _results(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item or item.startswith("/") or ".." in Path(item).parts:
                raise ValueError(f"result paths are relative to the workdir without '..', got {item!r}")
        return value

    @model_validator(mode="after")
    def _default_autostop(self) -> Recipe:
        # A priced cluster nobody told to stop is the forgotten VM burning money overnight: it gets
        # DEFAULT_AUTOSTOP unless the recipe says otherwise (`autostop: false` for none). Sweeps are
        # bounded by their lease instead; clouds whose machines cannot stop themselves get none
        # (preflight would refuse an explicit one).
        if "autostop" in self.model_fields_set or self.sweep is not None:
            return self
        cloud = self.resources.cloud
        if cloud == ANY_CLOUD or (_priced(cloud) and _self_stopping(cloud)):
            # Bypass assignment so that model_fields_set still says the recipe did not set it.
            object.__setattr__(self, "autostop", DEFAULT_AUTOSTOP)
        return self

    @property
    def autostop_is_default(self) -> bool:
        return self.autostop is DEFAULT_AUTOSTOP and "autostop" not in self.model_fields_set

    @field_validator("upload")
    @classmethod
    def _upload(cls, value: str | None) -> str | None:
        from cloudtrain.buckets.url import parse_bucket_url

        if value is not None:
            parse_bucket_url(value)
        return value

    @model_validator(mode="after")
    def _recover_where_machines_come_and_go(self) -> Recipe:
        # Machines the user lent us (`ssh` hosts) have no next placement to move to.
        if self.recover is not None and _given_hosts(self.resources.cloud):
            raise ValueError(f"recover: cloud {self.resources.cloud} runs on the listed hosts, which cloudtrain "
                             "cannot relaunch elsewhere (remove recover:)")
        return self

    @property
    def recovery(self) -> Recover | None:
        """The recover settings in force: the recipe's, else DEFAULT_RECOVER for spot (recipe/recover.py)."""
        if "recover" in self.model_fields_set:
            return self.recover
        return DEFAULT_RECOVER if self.resources.spot else None

    @model_validator(mode="after")
    def _one_entry_point(self) -> Recipe:
        if self.run and self.job:
            raise ValueError("give either 'run' (a shell command) or 'job' (a bundled job), not both")
        if not self.run and not self.job:
            raise ValueError("nothing to run: add 'run: <shell command>' or 'job: {name: mnist_cnn}'")
        if (self.resources.hosts and self.num_nodes > len(self.resources.hosts)
                and not _schedules(self.resources.cloud)):
            raise ValueError(f"num_nodes is {self.num_nodes} but only {len(self.resources.hosts)} host(s) are listed")
        return self

    def result_paths(self) -> list[str]:
        """What `run` collects: the recipe's results, plus the bundled job's output dir."""
        paths = list(self.results)
        if self.job and "outputs" not in paths:
            paths.append("outputs")
        return paths


class LoadedRecipe(BaseModel):
    """A validated recipe plus where it came from (for relative paths and the run record)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    recipe: Recipe
    path: Path
    digest: str
    workdir: Path | None
    data_sources: tuple[Path, ...]  # of the local mounts (not buckets), in order
    # The YAML node tree the recipe was read from, for `file:line` in later checks (preflight).
    node: yaml.Node | None = Field(default=None, exclude=True, repr=False)
    # What the user should know before running it (run: names a file that will not be on the node).
    warnings: tuple[str, ...] = ()
    # Paths on this machine that are not there (workdir, data sources), one line each, when the
    # caller asked to hear them with the plan's problems (`defer_paths`): one round, not three.
    path_problems: tuple[str, ...] = ()


def interpolate(value: Any, where: str, path: Path, env: dict[str, str], node: yaml.Node | None = None,
                loc: tuple[str | int, ...] = ()) -> Any:
    """Replace ${VAR} and ${VAR:-default} in every string except the shell fields. An undefined
    variable is a RecipeError naming `file:line` (from `node`, the YAML tree) and the field."""
    if isinstance(value, dict):
        return {
            k: (v if k in _SHELL_FIELDS and where == "" else
                interpolate(v, f"{where}.{k}" if where else str(k), path, env, node, (*loc, k)))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [interpolate(v, f"{where}[{i}]", path, env, node, (*loc, i)) for i, v in enumerate(value)]
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            line = line_of(node, loc) if node is not None else None
            raise RecipeError(
                f"{path}{f':{line}' if line else ''}: {where}: ${{{name}}} is not set in the environment",
                hint=f"export {name}=... or write ${{{name}:-default}}",
            )

        return _VAR_RE.sub(substitute, value)
    return value


def bundled_recipes() -> dict[str, Path]:
    from cloudtrain import paths

    return {p.stem: p for p in sorted(paths.recipes_dir().glob("*.yaml"))}


def resolve_recipe(path: str | Path) -> Path:
    candidate = Path(path)
    if candidate.exists() or candidate.suffix or len(candidate.parts) > 1:
        return candidate
    bundled = bundled_recipes()
    if str(candidate) in bundled:
        return bundled[str(candidate)]
    # Neither a file nor a bundled name: a mistyped bundled name gets the right one.
    from cloudtrain.yamlfile import did_you_mean

    hint = did_you_mean(str(candidate), sorted(bundled))
    raise RecipeError(f"{candidate}: not found: no such file, and no bundled recipe of that name",
                      hint=f"{hint}; `cloudtrain recipes` lists them" if hint else "`cloudtrain recipes` lists the bundled ones")


def load_recipe(path: str | Path, env: dict[str, str] | None = None, *, sweep: bool = False,
                defer_paths: bool = False) -> LoadedRecipe:
    """Load and validate a recipe; a `sweep:` section is refused unless `sweep` (`cloudtrain sweep`).
    Every missing path (workdir, data sources) is said at once; with `defer_paths` they are kept in
    `path_problems` for preflight to say together with the plan's (preflight raises them).

    A bare name that is not a file (`mnist-local`) is looked up among the bundled recipes, so they
    work from any directory after `pip install` (`cloudtrain recipes` lists them).
    """
    if sweep:
        # Before anything is read or run: the search needs Optuna, and `sweep validate` says so too.
        from cloudtrain.extras import require

        require("sweep", "a sweep")
    path = resolve_recipe(path)
    data, node, text = read_yaml(path, RecipeError)
    if data is None:
        raise RecipeError(f"{path}: the file is empty", hint="see `cloudtrain schema` or recipes/mnist-local.yaml")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of recipe fields at the top, got {type(data).__name__}")
    data = interpolate(data, "", path, dict(os.environ) if env is None else env, node)
    _refuse_misplaced_resources(data, path, node)
    try:
        recipe = Recipe.model_validate(data, context={"sweep": sweep})
    except ValidationError as exc:
        raise RecipeError(format_validation_error(path, node, exc, Recipe)) from None

    from cloudtrain.yamlfile import line_of

    def where(loc: tuple[str | int, ...]) -> str:
        line = line_of(node, loc) if node is not None else None
        return f"{path}:{line}" if line else str(path)

    base = path.resolve().parent
    problems: list[str] = []
    workdir = None
    if recipe.workdir is not None:
        workdir = (base / Path(recipe.workdir).expanduser()).resolve()
        if not workdir.is_dir():
            problems.append(f"{where(('workdir',))}: workdir: {workdir} is not a directory (create it or fix the path)")
            workdir = None
    from cloudtrain.recipe.workdir import resolve_workdir

    workdir, warnings = resolve_workdir(recipe.run, base, workdir)
    sources = []
    for i, mount in enumerate(recipe.data):
        if mount.is_bucket:
            continue  # copied by the node itself (buckets/steps.py); data_sources: the local mounts only
        source = (base / Path(mount.source).expanduser()).resolve()
        if not source.exists():
            problems.append(f"{where(('data', i, 'source'))}: data[{i}].source: {source} does not exist")
            continue
        sources.append(source)
    if problems and not defer_paths:
        raise RecipeError("\n".join(problems))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return LoadedRecipe(
        recipe=recipe, path=path, digest=digest, workdir=workdir, data_sources=tuple(sources), node=node,
        warnings=tuple(f"{path}: {w}" for w in warnings), path_problems=tuple(problems),
    )


def _refuse_misplaced_resources(data: dict[str, Any], path: Path, node: yaml.Node | None) -> None:
    """`cloud: aws` at the top of a recipe: the commonest misplacement gets its real place named."""
    from cloudtrain.yamlfile import line_of

    for key in data:
        if isinstance(key, str) and key in Resources.model_fields and key not in Recipe.model_fields:
            line = line_of(node, (key,))
            raise RecipeError(f"{path}:{line}: {key}: unknown key {key!r} at the top; did you mean resources.{key}?",
                              hint=f"write it under resources:, e.g. `resources: {{{key}: ...}}`")


def json_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "cloudtrain recipe"
    return schema
