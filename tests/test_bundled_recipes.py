"""Bundled recipes work by name from any directory (what a user has after `pip install`)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import cloudtrain


def test_recipes_lists_every_bundled_recipe(tmp_path: Path) -> None:
    proc = cloudtrain("recipes", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("mnist-local", "mnist-ssh", "mnist-aws-t4"):
        assert name in proc.stdout


def test_a_bundled_recipe_validates_by_name_from_an_empty_directory(tmp_path: Path) -> None:
    proc = cloudtrain("validate", "mnist-local", cwd=tmp_path)
    assert proc.returncode == 0 and "mnist-local: ok" in proc.stdout, proc.stderr


def test_a_file_of_that_name_wins_over_the_bundled_recipe(tmp_path: Path) -> None:
    (tmp_path / "mnist-local").write_text("name: mine\nrun: echo mine\n")
    proc = cloudtrain("validate", "mnist-local", cwd=tmp_path)
    assert proc.returncode == 0 and "mine" in proc.stdout, proc.stderr


def test_an_unknown_name_is_one_line(tmp_path: Path) -> None:
    proc = cloudtrain("validate", "mnist-nowhere", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "not found" in proc.stderr
