"""The default workdir (the recipe's directory when `run:` names a file there) and the warning when
`run:` names a local file that will not be on the node (cloudtrain/recipe/workdir.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.recipe import load_recipe
from cloudtrain.recipe.workdir import run_files
from tests.conftest import cloudtrain


@pytest.mark.parametrize(("run", "words"), [
    ("python train.py --lr 0.1", ["python", "train.py", "0.1"]),
    ("sh scripts/go.sh $HOME /abs/x.py ~/y.py X=1 # comment.py", ["sh", "scripts/go.sh"]),
    ("python 'unbalanced", []),
    ("cd . && ls ..", ["cd", "&&", "ls"]),
    (None, []),
])
def test_run_files_are_the_relative_words(run: str | None, words: list[str]) -> None:
    assert run_files(run) == words


# files: what lies beside the recipe; workdir: the recipe's `workdir:` (None: unset).
@pytest.mark.parametrize(("files", "run", "workdir", "synced", "warned"), [
    (["train.py"], "python train.py", None, ".", None),            # the default: the recipe's directory
    ([], "python -c 'print(1)'", None, None, None),                 # names no file: nothing to sync
    (["train.py", "src/"], "python train.py", "src", "src", "train.py, which is beside the recipe but not in workdir"),
    (["src/train.py"], "python train.py", "src", "src", None),      # the workdir holds it
    (["train.py"], None, None, None, None),                         # a bundled job: no run
])
def test_default_workdir_and_files_left_behind(tmp_path: Path, files: list[str], run: str | None,
                                               workdir: str | None, synced: str | None, warned: str | None) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in files:
        target = project / name
        if name.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("print('hi')\n")
    lines = ["name: wd"] + ([f"run: {run!r}"] if run else ["job: {name: mnist_cnn}"])
    lines += [f"workdir: {workdir}"] if workdir else []
    (project / "r.yaml").write_text("\n".join(lines) + "\n")
    loaded = load_recipe(project / "r.yaml")
    assert loaded.workdir == (None if synced is None else (project / synced).resolve())
    if warned is None:
        assert loaded.warnings == ()
    else:
        (warning,) = loaded.warnings
        assert warned in warning and "will not be on the node" in warning


def test_the_home_directory_is_never_synced_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "user-home"  # the conftest's HOME
    (home / "train.py").write_text("print('hi')\n")
    (home / "r.yaml").write_text("name: wd\nrun: python train.py\n")
    loaded = load_recipe(home / "r.yaml")
    assert loaded.workdir is None
    (warning,) = loaded.warnings
    assert "is your home directory" in warning and "set workdir:" in warning
    shown = cloudtrain("validate", str(home / "r.yaml"))
    assert shown.returncode == 0 and "warning: " in shown.stderr and "will not be on the node" in shown.stderr
