"""The bundled jobs' parameters, declared so the CLI can check a recipe's `job.params` up front.

The jobs themselves (e.g. mnist_cnn.py) are standalone files shipped to the node; importing them
here would pull in numpy. This module holds the same options as data instead: name, type, allowed
choices, bounds, default and help. tests/jobs/test_params.py keeps it in step with the job's own
argparse, option by option, and checks that nothing accepted here is refused by the job.

A recipe's params become command-line flags the way `job_argv` spells them: `batch_size: 64` ->
`--batch-size 64`, `force: true` -> `--force`, `force: false` -> nothing. Standard library only.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

ParamValue = str | int | float | bool


@dataclass(frozen=True)
class Param:
    """One option of a bundled job, spelt as in recipes (`batch_size`; `-` is accepted for `_`)."""

    name: str
    type: type  # int, float or str: takes a value; bool: a switch, `true` passes the flag
    default: ParamValue | None  # None: the job's own logic decides (e.g. no limit)
    help: str
    choices: tuple[str, ...] = ()
    ge: float | None = None  # value >= ge
    gt: float | None = None  # value > gt
    le: float | None = None  # value <= le
    lt: float | None = None  # value < lt

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def bounds(self) -> str:
        """`>= 1`, `> 0 and < 0.5`: what the value must satisfy, for messages ('' if anything goes)."""
        parts = [f"{op} {_num(limit)}" for op, limit in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                 if limit is not None]
        return " and ".join(parts)


@dataclass(frozen=True)
class JobSchema:
    name: str
    params: tuple[Param, ...]
    # Flags cloudtrain passes itself: refused in a recipe, with the reason.
    reserved: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Param | None:
        wanted = _normal(key)
        return next((p for p in self.params if p.name == wanted), None)

    def names(self) -> list[str]:
        return [p.name for p in self.params]


class ParamProblem(ValueError):
    """A recipe's job parameter the job would refuse (or silently misread). `key` is as written."""

    def __init__(self, key: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
        self.hint = hint


MNIST_CNN = JobSchema(
    name="mnist_cnn",
    params=(
        Param("data", str, "auto", "auto | bundled | PATH on the node (.npz, .csv[.gz] or a directory of IDX files)"),
        Param("epochs", int, 10, "training epochs", ge=1),
        Param("batch_size", int, 128, "per replica; global = this x replicas", ge=1),
        Param("lr", float, 2e-3, "Adam learning rate", gt=0),
        # keras.utils.set_random_seed hands the seed to numpy, which takes 0 .. 2**32 - 1.
        Param("seed", int, 0, "random seed (the held-out split does not move with it)", ge=0, le=2**32 - 1),
        Param("device", str, "auto", "where to train", choices=("auto", "cpu", "gpu")),
        Param("strategy", str, "auto", "tf.distribute strategy", choices=("auto", "default", "mirrored", "multiworker")),
        Param("cpu_devices", int, 1, "split the CPU into N logical devices (tests)", ge=1),
        Param("mixed_precision", str, "auto", "float16 compute on GPUs that support it", choices=("auto", "on", "off")),
        Param("val_fraction", float, 0.1, "share of the training images held out for validation", gt=0, lt=0.5),
        Param("limit_train", int, None, "use only the first N training images", ge=1),
        Param("limit_test", int, None, "use only the first N test images", ge=1),
        Param("max_steps_per_epoch", int, None, "cap the steps of each epoch", ge=1),
        Param("progress_every", int, 20, "write a step event to OUTPUT/progress.jsonl every N steps", ge=1),
        Param("no_placement_log", bool, False, "do not record where every op ran"),
        Param("force", bool, False, "discard earlier results and checkpoints in the output directory"),
    ),
    reserved={"output": "cloudtrain sets it: the job writes to outputs/ in the workdir, which `run` collects"},
)

JOBS: dict[str, JobSchema] = {MNIST_CNN.name: MNIST_CNN}


def check_params(job: str, params: Mapping[str, object]) -> None:
    """Raise ParamProblem for the first parameter `job` would refuse, misread or that cloudtrain sets."""
    schema = JOBS[job]
    for key, value in params.items():
        wanted = _normal(key)
        if wanted in schema.reserved:
            raise ParamProblem(key, f"is set by cloudtrain, not by the recipe: {schema.reserved[wanted]}",
                               hint=f"remove {key!r}")
        param = schema.get(key)
        if param is None:
            close = difflib.get_close_matches(wanted, schema.names(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"{job} takes: {', '.join(schema.names())}"
            raise ParamProblem(key, f"{job} has no parameter {key!r}", hint=hint)
        _check_value(key, param, value)


def job_argv(job: str, params: Mapping[str, ParamValue]) -> list[str]:
    """The flags for checked `params`, in recipe order (what execution passes after `--output`)."""
    schema = JOBS[job]
    argv: list[str] = []
    for key, value in params.items():
        param = schema.get(key)
        flag = param.flag if param is not None else "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def _check_value(key: str, param: Param, value: object) -> None:
    if param.type is bool:
        if not isinstance(value, bool):
            raise ParamProblem(key, f"is a switch: expected true or false, got {value!r}")
        return
    if isinstance(value, bool):
        # YAML 1.1 reads unquoted on/off/yes/no as booleans: `mixed_precision: on` arrives as True.
        expected = f"one of {', '.join(param.choices)}" if param.choices else _kind(param.type)
        raise ParamProblem(key, f"expected {expected}, got {str(value).lower()}",
                           hint="YAML reads unquoted on/off/yes/no/true/false as booleans: quote the value")
    if not isinstance(value, (str, int, float)):
        raise ParamProblem(key, f"expected {_kind(param.type)}, got {type(value).__name__}")
    text = str(value)
    if param.type is str:
        if not text.strip():
            raise ParamProblem(key, "expected a value, got an empty string")
        if text.startswith("-"):
            raise ParamProblem(key, f"values starting with '-' would be read as a flag, got {text!r}")
        if param.choices and text not in param.choices:
            close = difflib.get_close_matches(text.lower(), param.choices, n=1, cutoff=0.5)
            raise ParamProblem(key, f"expected one of {', '.join(param.choices)}, got {value!r}",
                               hint=f"did you mean {close[0]!r}?" if close else None)
        return
    number: float
    if param.type is int:
        # Exactly what argparse's int() accepts from the flag's text: 3 and "3", never 3.0 or "3.5".
        try:
            number = int(text)
        except ValueError:
            raise ParamProblem(key, f"expected a whole number, got {value!r}") from None
    else:
        try:
            number = float(text)
        except ValueError:
            raise ParamProblem(key, f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ParamProblem(key, f"expected a finite number, got {value!r}")
    if not _within(param, number):
        raise ParamProblem(key, f"must be {param.bounds()}, got {value!r}")


def _within(param: Param, number: float) -> bool:
    return ((param.ge is None or number >= param.ge) and (param.gt is None or number > param.gt)
            and (param.le is None or number <= param.le) and (param.lt is None or number < param.lt))


def _kind(kind: type) -> str:
    return {int: "a whole number", float: "a number", str: "a string"}.get(kind, kind.__name__)


def _num(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() else f"{limit:g}"


def _normal(key: str) -> str:
    return key.replace("-", "_")
