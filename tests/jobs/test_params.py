"""The bundled job's declared parameters (cloudtrain/jobs/params.py) against the job itself.

The CLI checks `job.params` with the declaration, never by importing mnist_cnn.py (numpy is too
heavy for the CLI). These tests import the job, as a VM runs it, and keep the two in step: every
option with its type, choices and default, and no value the declaration lets through that the
job's own argparse would then refuse after boot and a TensorFlow install.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from cloudtrain.jobs.params import JOBS, MNIST_CNN, Param, ParamProblem, check_params, job_argv

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "cloudtrain" / "jobs" / "mnist_cnn.py"
# Flags cloudtrain passes itself; the rest are the recipe's to set.
PLUMBING = {"--output"}


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mnist_cnn_params_under_test", JOB)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def job() -> ModuleType:
    return _load_job()


@pytest.fixture(scope="module")
def job_actions(job: ModuleType) -> dict[str, argparse.Action]:
    """The job's argparse options by flag, from the parser its own parse_args builds."""
    built: list[argparse.ArgumentParser] = []

    class Recording(argparse.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    # Only the job module sees the recording class (argparse itself refers to ArgumentParser by name).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(job, "argparse", SimpleNamespace(**{**vars(argparse), "ArgumentParser": Recording}))
        job.parse_args(["--output", "out"])
    (parser,) = built
    return {a.option_strings[-1]: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def job_accepts(job: ModuleType, argv: list[str]) -> bool:
    try:
        job.parse_args(["--output", "out", *argv])
    except SystemExit as exc:
        assert exc.code == 2
        return False
    return True


def schema_accepts(key: str, value: Any) -> bool:
    try:
        check_params("mnist_cnn", {key: value})
    except ParamProblem:
        return False
    return True


def test_every_job_option_is_declared_with_its_type_choices_and_default(job_actions: dict[str, argparse.Action]) -> None:
    declared = {p.flag: p for p in MNIST_CNN.params}
    assert set(declared) == set(job_actions) - PLUMBING
    for flag, action in job_actions.items():
        if flag in PLUMBING:
            assert action.required and action.dest in MNIST_CNN.reserved
            continue
        param = declared[flag]
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            # A switch: `true` in the recipe passes the flag, `false` (the default) leaves it out.
            assert param.type is bool and param.default is False, flag
            assert action.default is (not action.const), flag
            continue
        assert param.type is (action.type or str), flag
        assert param.choices == tuple(action.choices or ()), flag
        assert param.default == action.default, flag


def probes(param: Param) -> list[Any]:
    if param.type is bool:
        return [True, False, "yes", "true", 1, 0]
    if param.type is str:
        return [*param.choices, "bundled", "tpu", "", " ", "-x", "--force", True, False, 5, 0.5]
    common = [-(2**32), -1, 0, 1, 2, 10, "3", "ten", "", True, False, 3.0, 2.5, 2**32 - 1, 2**32]
    if param.type is float:
        common += [1e-9, 0.1, 0.49, 0.5, 0.9, 1.0, "1e-3", "0.25", "nan", "inf", "-inf", "-0.1"]
    return common


@pytest.mark.parametrize("param", MNIST_CNN.params, ids=lambda p: p.name)
def test_nothing_the_schema_accepts_is_refused_by_the_job(job: ModuleType, param: Param) -> None:
    accepted = 0
    for value in probes(param):
        if schema_accepts(param.name, value):
            accepted += 1
            argv = job_argv("mnist_cnn", {param.name: value})
            assert job_accepts(job, argv), f"{param.name}: {value!r} passes the schema but the job refuses {argv}"
    assert accepted, f"{param.name}: no probe passes the schema"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        # The job refuses these itself (argparse or its own checks): the schema must refuse them first.
        ("epochs", 0), ("epochs", -3), ("epochs", "ten"), ("epochs", 2.5), ("batch_size", 0), ("lr", 0),
        ("lr", -0.1), ("val_fraction", 0.5), ("val_fraction", 0), ("cpu_devices", 0), ("progress_every", 0),
        ("device", "tpu"), ("strategy", "horovod"), ("mixed_precision", True),
    ],
)
def test_what_the_job_refuses_the_schema_refuses(job: ModuleType, key: str, value: Any) -> None:
    assert not job_accepts(job, job_argv("mnist_cnn", {key: value}))
    assert not schema_accepts(key, value)


# (params, key the problem names, fragments of the message + hint)
BAD = [
    ({"epocs": 1}, "epocs", ["no parameter 'epocs'", "did you mean 'epochs'?"]),
    ({"batchsize": 1}, "batchsize", ["did you mean 'batch_size'?"]),
    ({"zzz": 1}, "zzz", ["no parameter 'zzz'", "mnist_cnn takes: data, epochs, batch_size"]),
    ({"epochs": -3}, "epochs", ["must be >= 1, got -3"]),
    ({"epochs": "ten"}, "epochs", ["expected a whole number, got 'ten'"]),
    ({"epochs": 2.5}, "epochs", ["expected a whole number, got 2.5"]),
    ({"batch-size": 0}, "batch-size", ["must be >= 1, got 0"]),
    ({"lr": 0}, "lr", ["must be > 0, got 0"]),
    ({"lr": "nan"}, "lr", ["expected a finite number"]),
    ({"val_fraction": 0.7}, "val_fraction", ["must be > 0 and < 0.5, got 0.7"]),
    ({"seed": -1}, "seed", ["must be >= 0 and <= 4294967295, got -1"]),
    ({"limit_train": 0}, "limit_train", ["must be >= 1"]),
    ({"limit_test": -5}, "limit_test", ["must be >= 1"]),
    ({"max_steps_per_epoch": 0}, "max_steps_per_epoch", ["must be >= 1"]),
    ({"device": "tpu"}, "device", ["expected one of auto, cpu, gpu, got 'tpu'", "did you mean 'gpu'?"]),
    ({"mixed_precision": True}, "mixed_precision", ["expected one of auto, on, off, got true", "quote the value"]),
    ({"force": "yes"}, "force", ["is a switch: expected true or false, got 'yes'"]),
    ({"data": ""}, "data", ["expected a value"]),
    ({"data": "-x"}, "data", ["read as a flag"]),
    ({"output": "elsewhere"}, "output", ["set by cloudtrain", "remove 'output'"]),
    ({"epochs": 1, "device": "tpu"}, "device", ["'tpu'"]),
]


@pytest.mark.parametrize(("params", "key", "fragments"), BAD, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(BAD)])
def test_bad_params_name_the_key_and_what_was_expected(params: dict, key: str, fragments: list[str]) -> None:
    with pytest.raises(ParamProblem) as caught:
        check_params("mnist_cnn", params)
    assert caught.value.key == key
    text = f"{caught.value.message} ({caught.value.hint})"
    assert "\n" not in text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def test_good_params_and_their_flags() -> None:
    params = {"epochs": "3", "batch-size": 64, "lr": "1e-3", "val_fraction": 0.2, "device": "cpu",
              "data": "bundled", "force": True, "no_placement_log": False, "seed": 7}
    check_params("mnist_cnn", params)
    assert job_argv("mnist_cnn", params) == [
        "--epochs", "3", "--batch-size", "64", "--lr", "1e-3", "--val-fraction", "0.2", "--device", "cpu",
        "--data", "bundled", "--force", "--seed", "7",
    ]


def test_job_argv_is_what_execution_passes_to_the_job() -> None:
    from cloudtrain.run.prepare import job_script
    from cloudtrain.recipe import Recipe

    params = {"epochs": 2, "batch-size": 32, "lr": 0.01, "force": True, "no_placement_log": False, "data": "bundled"}
    recipe = Recipe.model_validate({"name": "p", "job": {"name": "mnist_cnn", "params": params}})
    script = job_script(recipe)
    tokens = shlex.split(script.strip().splitlines()[-1])
    at = tokens.index("--output")
    assert tokens[at + 2 :] == job_argv("mnist_cnn", recipe.job.params)  # type: ignore[union-attr]


def test_every_bundled_job_declares_its_params() -> None:
    import typing

    from cloudtrain.recipe import BundledJob

    assert set(JOBS) == set(typing.get_args(BundledJob.model_fields["name"].annotation))
    for schema in JOBS.values():
        assert all(p.help for p in schema.params)
        assert len({p.name for p in schema.params}) == len(schema.params)


def test_params_module_imports_no_numpy() -> None:
    code = "import sys, cloudtrain.jobs.params; print(sorted(m for m in ('numpy', 'tensorflow', 'pydantic') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_progress_every_names_the_file_the_job_writes(job: ModuleType, job_actions: dict[str, argparse.Action]) -> None:
    """The step events moved off stdout into OUTPUT/progress.jsonl (issue 14.3): both helps say where."""
    declared = MNIST_CNN.get("progress_every")
    assert declared is not None and job.PROGRESS_FILE in declared.help
    assert job.PROGRESS_FILE in (job_actions["--progress-every"].help or "")
