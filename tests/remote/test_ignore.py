"""gitignore semantics for the workdir sync: the table is what git itself does."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.remote.ignore import load_ignore
from cloudtrain.remote.sync import scan_tree

# (patterns, path, ignored?) - directories end with '/'
CASES = [
    (["*.log"], "train.log", True),
    (["*.log"], "deep/dir/train.log", True),
    (["*.log"], "train.log.txt", False),
    (["build/"], "build/", True),
    (["build/"], "build", False),  # dir-only pattern, a file named build
    (["build/"], "src/build/", True),
    (["/build"], "build/", True),
    (["/build"], "src/build/", False),  # anchored
    (["doc/*.txt"], "doc/a.txt", True),
    (["doc/*.txt"], "doc/sub/a.txt", False),  # * never crosses /
    (["doc/*.txt"], "x/doc/a.txt", False),  # inner slash anchors
    (["**/cache"], "cache/", True),
    (["**/cache"], "a/b/cache/", True),
    (["data/**"], "data/x/y.npz", True),
    (["data/**"], "data/", False),  # matches everything inside, not the dir itself
    (["a/**/b"], "a/b", True),
    (["a/**/b"], "a/x/y/b", True),
    (["file?.py"], "file1.py", True),
    (["file?.py"], "file10.py", False),
    (["[ab].txt"], "a.txt", True),
    (["[!ab].txt"], "a.txt", False),
    (["[!ab].txt"], "c.txt", True),
    (["*.npz", "!keep.npz"], "keep.npz", False),
    (["*.npz", "!keep.npz"], "drop.npz", True),
    (["secret/", "!secret/keep.txt"], "secret/keep.txt", True),  # cannot re-include inside ignored dir
    (["# comment", "", "  "], "# comment", False),
    (["\\#hash"], "#hash", True),
    (["\\!bang"], "!bang", True),
    (["trailing   "], "trailing", True),
    (["with\\ space\\ "], "with space ", True),
    ([], ".git/", True),  # built-in defaults
    ([], "pkg/__pycache__/", True),
    ([], ".venv/", True),
    ([], "runs/", True),
    ([], "src/runs/", False),  # only the top-level runs/ is cloudtrain's
    (["!runs/"], "runs/", False),  # a user file may re-include a default
    ([], "train.py", False),
]


@pytest.mark.parametrize(("patterns", "path", "expected"), CASES)
def test_gitignore_semantics(patterns: list[str], path: str, expected: bool, tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("\n".join(patterns) + "\n")
    assert load_ignore(tmp_path)(path) is expected


def test_cloudtrainignore_overrides_gitignore_and_nested_gitignore_applies(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.ckpt\ndata/\n")
    (tmp_path / ".cloudtrainignore").write_text("!data/\n")  # git ignores it, but the job needs it
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("local.cfg\n/only-here.txt\n")
    ignored = load_ignore(tmp_path)
    assert ignored("model.ckpt")
    assert not ignored("data/")
    assert ignored("sub/local.cfg")
    assert ignored("sub/deeper/local.cfg")
    assert ignored("sub/only-here.txt")
    assert not ignored("sub/deeper/only-here.txt")
    assert not ignored("local.cfg")


def test_scan_prunes_ignored_directories(tmp_path: Path) -> None:
    for rel in ["train.py", "data/x.csv", ".git/HEAD", "runs/r1/log", "pkg/__pycache__/m.pyc", "pkg/m.py", "a.log"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("*.log\n")
    scan = scan_tree(tmp_path, load_ignore(tmp_path))
    assert scan.base == tmp_path
    assert [e.rel for e in scan.entries] == [".gitignore", "data/x.csv", "pkg/m.py", "train.py"]
    assert scan.ignored == (".git/", "a.log", "pkg/__pycache__/", "runs/")
