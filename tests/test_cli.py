"""The lazy command table, and what a user sees for mistyped commands, flags and --debug anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from cloudtrain.cli.main import COMMANDS, cli
from tests.conftest import cloudtrain


def test_every_listed_command_loads_with_its_name() -> None:
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command), name
        assert command.name == name


# ---------------------------------------------------------------- usage errors and --debug (issue 14, item 6)


@pytest.mark.parametrize("args, fragments", [
    (["run"], ["missing argument 'RECIPE'", "usage: cloudtrain run [OPTIONS] RECIPE", "cloudtrain run --help"]),
    (["run", "x.yaml", "--bogus"], ["no such option '--bogus'", "cloudtrain run --help"]),
    (["statsu"], ["no such command 'statsu'", "did you mean 'status'?"]),
    (["logs"], ["missing argument 'NAME'", "cloudtrain logs --help"]),
    (["down"], ["missing argument 'NAMES...'"]),
    (["status", "--refresh=maybe"], ["--refresh"]),
])
def test_click_usage_errors_are_one_line_with_a_hint_exit_2(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    proc = cloudtrain(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Usage:" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert proc.stdout == ""


def test_bare_cloudtrain_prints_help_and_succeeds(tmp_path: Path) -> None:
    proc = cloudtrain(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout and "run" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize("where", ["first", "after-command", "last"])
def test_debug_works_anywhere_on_the_command_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "bad.yaml").write_text("name: x\nrun: y\nresources: {cloud: nope}\n")
    args = {"first": ["--debug", "validate", "bad.yaml"], "after-command": ["validate", "--debug", "bad.yaml"],
            "last": ["validate", "bad.yaml", "--debug"]}[where]
    proc = cloudtrain(*args, cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "RecipeError" in proc.stderr, proc.stderr
    quiet = cloudtrain("validate", "bad.yaml", cwd=tmp_path)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr and len(quiet.stderr.splitlines()) == 1


def test_debug_after_the_double_dash_belongs_to_the_remote_command() -> None:
    from cloudtrain.cli.main import split_debug

    assert split_debug(["exec", "box", "--", "python", "train.py", "--debug"]) == \
        (["exec", "box", "--", "python", "train.py", "--debug"], False)
    assert split_debug(["exec", "--debug", "box", "--", "x", "--debug"]) == (["exec", "box", "--", "x", "--debug"], True)
    assert split_debug(["run", "r.yaml", "--debug"]) == (["run", "r.yaml"], True)
    assert split_debug(["status"]) == (["status"], False)


def test_help_names_the_flags_users_need() -> None:
    run_help = subprocess.run([sys.executable, "-m", "cloudtrain", "run", "--help"], capture_output=True, text=True, check=True)
    assert "--env KEY=VALUE" in run_help.stdout and "--quiet" in run_help.stdout
    exec_help = subprocess.run([sys.executable, "-m", "cloudtrain", "exec", "--help"], capture_output=True, text=True, check=True)
    assert "--env KEY=VALUE" in exec_help.stdout
    compare_help = subprocess.run([sys.executable, "-m", "cloudtrain", "compare", "--help"], capture_output=True, text=True,
                                  check=True)
    assert "--output" in compare_help.stdout
