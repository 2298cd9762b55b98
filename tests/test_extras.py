"""A missing optional dependency is one line naming the extra (exit 2), before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.extras import EXTRAS, missing
from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[1]
# The CLI with some modules made unimportable (sys.modules[name] = None: find_spec says None,
# import raises ModuleNotFoundError), as in a venv installed without that extra.
WITHOUT = "import sys\nfor m in sys.argv[1].split(','): sys.modules[m] = None\n" \
          "from cloudtrain.cli.main import main\nmain(sys.argv[2:])\n"


def cli_without(hidden: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT, hidden, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=cli_env(), check=False)


@pytest.mark.parametrize(("hidden", "args", "extra"), [
    ("optuna", ["sweep", "validate", "recipes/sweep-mnist-local.yaml"], "sweep"),
    ("optuna", ["sweep", "run", "recipes/sweep-mnist-local.yaml"], "sweep"),
    ("numpy", ["validate", "recipes/mnist-local.yaml"], "tf"),
    ("tensorflow", ["run", "recipes/mnist-local.yaml"], "tf"),
    ("tensorflow,numpy", ["run", "mnist-local"], "tf"),
])
def test_a_missing_extra_is_named_before_anything_runs(tmp_path: Path, hidden: str, args: list[str],
                                                      extra: str) -> None:
    runs = tmp_path / "runs"
    shown = cli_without(hidden, *args, *(["--runs-dir", str(runs)] if args[0] == "run" else []), cwd=ROOT)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    (line,) = shown.stderr.strip().splitlines()
    assert line.startswith("error: ") and f'pip install "cloudtrain[{extra}]"' in line, line
    assert hidden.split(",")[0] in line and "Traceback" not in shown.stderr
    assert not runs.exists() and shown.stdout == ""  # nothing ran, nothing was made


def test_compare_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    from tests.test_compare import _fake_run

    _fake_run(tmp_path / "a")
    shown = cli_without("matplotlib", "compare", str(tmp_path / "a"), cwd=tmp_path)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    (line,) = shown.stderr.strip().splitlines()
    assert "matplotlib" in line and 'pip install "cloudtrain[tf]"' in line
    assert not (tmp_path / "compare.png").exists()


def test_with_the_extras_installed_nothing_is_missing() -> None:
    # The suite's venv has every extra the checks name (scripts/setup.sh --test).
    assert {extra: missing(modules) for extra, modules in EXTRAS.items()} == {extra: [] for extra in EXTRAS}
