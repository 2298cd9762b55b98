"""A runs directory that cannot be made is one line (exit 2) before anything runs, and leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.cli.common import check_runs_dir
from cloudtrain.errors import UsageError
from tests.conftest import cloudtrain


@pytest.mark.parametrize(("where", "expected"), [
    ("/proc/nope", "cannot create directories in /proc"),
    ("{tmp}/a-file/runs", "a-file is not a directory"),
    ("{tmp}/new/deeper", None),     # made later, by the run; nothing made now
    ("{tmp}", None),
])
def test_a_runs_dir_that_cannot_be_made_is_refused(tmp_path: Path, where: str, expected: str | None) -> None:
    (tmp_path / "a-file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    base = Path(where.format(tmp=tmp_path))
    if expected is None:
        check_runs_dir(base)
    else:
        with pytest.raises(UsageError) as caught:
            check_runs_dir(base)
        assert expected in caught.value.one_line() and caught.value.one_line().startswith(f"--runs-dir {base}: ")
    assert sorted(tmp_path.rglob("*")) == before


def test_run_with_an_impossible_runs_dir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("name: rd\nrun: echo hi\n")
    shown = cloudtrain("run", str(tmp_path / "r.yaml"), "--runs-dir", "/proc/nope")
    assert shown.returncode == 2 and shown.stdout == ""
    (line,) = shown.stderr.strip().splitlines()
    assert line.startswith("error: --runs-dir /proc/nope: cannot create directories in /proc"), line
    assert "internal error" not in shown.stderr


@pytest.mark.parametrize(("name", "expected"), [
    ("mnist-locl", "did you mean 'mnist-local'?"),
    ("zzz", "`cloudtrain recipes` lists the bundled ones"),
])
def test_an_unknown_recipe_name_suggests_a_bundled_one(name: str, expected: str) -> None:
    shown = cloudtrain("validate", name)
    assert shown.returncode == 2
    (line,) = shown.stderr.strip().splitlines()
    assert f"error: {name}: not found: no such file, and no bundled recipe of that name" in line and expected in line
