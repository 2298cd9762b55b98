"""gitignore semantics for the workdir sync: the table is what git itself does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cloudtrain.errors import UsageError
from cloudtrain.remote.ignore import IgnoreMatcher, load_ignore
from cloudtrain.remote.sync import scan_tree
from tests.bounded import run_bounded

pytestmark = pytest.mark.quick

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


# Differential table: git itself decides. (id, ignore files {path: bytes}, paths to ask about; a path
# ending in '/' is created as a directory). Each case is one fresh repository, so paths must not clash.
GIT_CASES: list[tuple[str, dict[str, bytes], list[str]]] = [
    ("bracket-closing-first", {".gitignore": b"[]]x\n"}, ["]x", "[]]x", "]]x", "zx"]),
    ("posix-class-digit", {".gitignore": b"[[:digit:]]\n"}, ["1", "a", "d"]),
    ("posix-class-digit-not-its-letters", {".gitignore": b"y[[:digit:]]\n"}, ["y1", "y:", "yd", "y[", "y]"]),
    ("posix-classes-two", {".gitignore": b"[[:alpha:][:digit:]]\n"}, ["a", "Z", "7", "-"]),
    ("posix-class-upper", {".gitignore": b"[[:upper:]]*\n"}, ["Abc", "abc"]),
    ("posix-class-space", {".gitignore": b"[[:space:]]x\n"}, [" x", "\tx", "\rx", "\x0bx", "\x0cx", "ax"]),
    ("posix-class-cntrl", {".gitignore": b"[[:cntrl:]]\n"}, ["\x01", "\x7f", "a"]),
    ("posix-class-punct", {".gitignore": b"[[:punct:]]\n"}, ["!", "~", "a"]),
    ("posix-class-unknown", {".gitignore": b"[[:spaci:]]\n"}, ["s", "p", "["]),
    # (paths starting with ':' would be read as pathspec magic by git, hence the leading x)
    ("posix-class-not-closed", {".gitignore": b"x[[:a]b]\n"}, ["x[b]", "xab]", "x:b]", "xb"]),
    ("bracket-escaped-close", {".gitignore": b"[\\]]\n"}, ["]", "\\", "a"]),
    ("bracket-escaped-backslash", {".gitignore": b"[\\\\]\n"}, ["\\", "x"]),
    ("bracket-unterminated", {".gitignore": b"[]x\n"}, ["[]x", "]", "x"]),
    ("bracket-empty-end", {".gitignore": b"a[]\n"}, ["a[]", "a"]),
    ("bracket-negated-close", {".gitignore": b"[!]]x\n"}, ["]x", "ax"]),
    ("bracket-caret-negation", {".gitignore": b"[^a]\n"}, ["a", "b"]),
    ("bracket-trailing-dash", {".gitignore": b"[a-]\n"}, ["a", "-", "b"]),
    ("bracket-reversed-range", {".gitignore": b"[z-a]\n"}, ["a", "b", "z"]),
    ("bracket-range-then-dash", {".gitignore": b"[a-c-e]\n"}, ["b", "d", "-", "e"]),
    ("bracket-never-slash", {".gitignore": b"a[/]b\n"}, ["a/b", "a[/]b/"]),
    ("bracket-extension", {".gitignore": b"*.[ch]\n"}, ["x.c", "x.h", "x.o"]),
    ("bracket-negated-range", {".gitignore": b"[!a-z]*\n"}, ["Abc", "abc", "1x"]),
    ("triple-star", {".gitignore": b"***/x\n"}, ["x", "q/x", "b/c/x"]),
    ("double-star-middle", {".gitignore": b"a/**/b\n"}, ["a/b", "a/x/y/b", "c/a/b"]),
    ("double-star-dir", {".gitignore": b"**/\n"}, ["d/", "f"]),
    ("double-star-alone", {".gitignore": b"**\n"}, ["d/", "f"]),
    ("double-star-inside-name", {".gitignore": b"a**b\n"}, ["ab", "axb", "ax/b"]),
    ("double-star-after-prefix", {".gitignore": b"ab**/c\n"}, ["abx/c", "abx/y/c", "ab/c"]),
    ("double-star-escaped-slash", {".gitignore": b"**\\/x\n"}, ["x", "a/x", "a/b/x"]),
    ("trailing-double-star", {".gitignore": b"data/**\n"}, ["data/", "data/x/y.npz", "datax"]),
    ("double-star-trailing-dir", {".gitignore": b"foo/**/\n"}, ["foo/bar/", "foo/baz"]),
    ("star-dir", {".gitignore": b"*/\n"}, ["d/", "f"]),
    ("star-never-crosses-slash", {".gitignore": b"doc/*.txt\n"}, ["doc/a.txt", "doc/sub/a.txt", "x/doc/a.txt"]),
    ("dir-only", {".gitignore": b"build/\n"}, ["build/", "src/build/", "lib/build"]),
    ("double-slash-dir", {".gitignore": b"dir//\n"}, ["dir/", "x"]),
    ("anchored", {".gitignore": b"/x\n"}, ["x", "q/x"]),
    ("anchored-twice", {".gitignore": b"//a\n"}, ["a", "q/a"]),
    ("negation", {".gitignore": b"*.npz\n!keep.npz\n"}, ["keep.npz", "drop.npz", "sub/keep.npz"]),
    ("negation-in-excluded-dir", {".gitignore": b"secret/\n!secret/keep.txt\n"}, ["secret/keep.txt"]),
    ("negation-after-star", {".gitignore": b"secret/*\n!secret/keep.txt\n"}, ["secret/keep.txt", "secret/drop.txt"]),
    ("allowlist-idiom", {".gitignore": b"*\n!*/\n!*.py\n"}, ["a.py", "b.txt", "d/c.py", "d/e.txt"]),
    ("negation-alone", {".gitignore": b"!x\n"}, ["x"]),
    ("escaped-hash", {".gitignore": b"\\#x\n"}, ["#x", "x"]),
    ("comment", {".gitignore": b"#x\n"}, ["#x"]),
    ("escaped-bang", {".gitignore": b"\\!x\n"}, ["!x", "x"]),
    ("escaped-star", {".gitignore": b"\\*\n"}, ["*", "x"]),
    ("escaped-letter", {".gitignore": b"\\a\n"}, ["a"]),
    ("escaped-brackets", {".gitignore": b"data\\[1\\].csv\n"}, ["data[1].csv", "data1.csv"]),
    ("trailing-spaces", {".gitignore": b"foo   \n"}, ["foo", "foo   "]),
    ("escaped-trailing-space", {".gitignore": b"bar\\ \n"}, ["bar ", "bar"]),
    ("escaped-backslash-then-spaces", {".gitignore": b"x\\\\  \n"}, ["x\\", "x\\  "]),
    ("trailing-tab-kept", {".gitignore": b"tab\t\n"}, ["tab\t", "tab"]),
    ("trailing-backslash", {".gitignore": b"x\\\n"}, ["x\\", "x"]),
    ("question-mark", {".gitignore": b"file?.py\n"}, ["file1.py", "file10.py", "file.py"]),
    ("question-mark-one-byte", {".gitignore": b"?.txt\n"}, ["e.txt", "\u00e9.txt"]),
    ("non-ascii-literal", {".gitignore": "d\u00e9j\u00e0\n".encode()}, ["d\u00e9j\u00e0", "deja"]),
    ("case-sensitive", {".gitignore": b"*.LOG\n"}, ["a.log", "b.LOG"]),
    ("crlf-lines", {".gitignore": b"a\r\nb\r\n"}, ["a", "b"]),
    ("utf8-bom", {".gitignore": b"\xef\xbb\xbfbom\n"}, ["bom"]),
    ("no-final-newline", {".gitignore": b"last"}, ["last"]),
    ("blank-and-lone-marks", {".gitignore": b"\n   \n/\n!\n#\n"}, ["x", "d/"]),
    ("nested", {".gitignore": b"*.cfg\n", "sub/.gitignore": b"!local.cfg\n/only.txt\n"},
     ["local.cfg", "sub/local.cfg", "sub/deep/local.cfg", "sub/only.txt", "sub/deep/only.txt", "only.txt"]),
    ("nested-path-pattern", {"sub/.gitignore": b"a/b\n"}, ["sub/a/b", "a/b", "sub/x/a/b"]),
    ("nested-double-star", {"sub/.gitignore": b"**/gen\n"}, ["sub/gen", "sub/x/gen", "gen"]),
    ("nested-inside-ignored-dir", {".gitignore": b"vendor/\n", "vendor/.gitignore": b"!*\n"}, ["vendor/x", "vendor/d/"]),
    ("nested-reincludes-dir", {".gitignore": b"logs/\n", "x/.gitignore": b"!logs/\n"}, ["x/logs/", "x/logs/a", "logs/"]),
    # found by the fuzz test: a `*` then a literal holding '/' is no suffix match (git's ENDSWITH is basename only)
    ("star-slash-literal", {".gitignore": b"*/!\n"}, ["x/!", "x/y/!", "!"]),
    ("anchored-star-suffix", {".gitignore": b"/*.log\n"}, ["a.log", "d/a.log"]),
    # issue 29: a backtracking regex took 22 s on the first; git (and wildmatch) answer at once
    ("hostile-stars", {".gitignore": b"*a*a*a*a*a*a*a*a*b\n"}, ["a" * 60, "a" * 59 + "b", "a" * 30 + "/" + "a" * 29 + "b"]),
    ("hostile-double-stars", {".gitignore": b"**/" * 8 + b"*a*a*a*b\n"}, ["a/" * 10 + "a" * 20, "a/" * 10 + "aaab"]),
    ("nested-deeper-wins", {".gitignore": b"!*.tmp\n", "a/.gitignore": b"*.tmp\n", "a/b/.gitignore": b"!keep.tmp\n"},
     ["a/x.tmp", "a/b/keep.tmp", "a/b/x.tmp", "y.tmp"]),
]


def _git_ignored(root: Path, paths: list[str]) -> dict[str, bool]:
    """Ask git itself, isolated from the user's and system's git config and global excludes."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root.parent),
        "XDG_CONFIG_HOME": str(root.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
    }
    # -z: names with spaces, tabs or backslashes pass unquoted; -v -n: one record per path, with the
    # pattern that decided it (empty if none, starting with '!' if it re-included the path).
    stdin = b"".join(os.fsencode(p.rstrip("/")) + b"\0" for p in paths)
    proc = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--no-index", "-v", "-n", "-z", "--stdin"],
        input=stdin, capture_output=True, env=env, check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr.decode(errors="replace")
    fields = proc.stdout.split(b"\0")
    answer = {}
    for i, path in enumerate(paths):
        _source, _line, pattern, name = fields[4 * i : 4 * i + 4]
        assert name == os.fsencode(path.rstrip("/")), (name, path)
        answer[path] = bool(pattern) and not pattern.startswith(b"!")
    return answer


def _make_tree(root: Path, files: dict[str, bytes], paths: list[str]) -> None:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    for rel in paths:
        if rel.endswith("/"):
            (root / rel).mkdir(parents=True, exist_ok=True)
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(b"x")


@pytest.mark.parametrize(("files", "paths"), [(f, p) for _, f, p in GIT_CASES], ids=[i for i, _, _ in GIT_CASES])
def test_same_decision_as_git(files: dict[str, bytes], paths: list[str], tmp_path: Path) -> None:
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "--template=", str(root)], check=True)
    _make_tree(root, files, paths)
    expected = _git_ignored(root, paths)
    ours = IgnoreMatcher(root, defaults=())
    assert {p: ours(p) for p in paths} == expected


def test_cloudtrainignore_acts_as_appended_to_the_gitignore_beside_it(tmp_path: Path) -> None:
    # .cloudtrainignore (at the top or in any directory) is read after the .gitignore of the same
    # directory, so it can both add patterns and re-include what git ignores.
    files = {
        ".gitignore": b"*.ckpt\ndata/\n",
        ".cloudtrainignore": b"!data/\n*.npz\n",
        "sub/.gitignore": b"*.bin\n",
        "sub/.cloudtrainignore": b"!keep.bin\nscratch/\n",
    }
    paths = ["a.ckpt", "data/", "data/x.npz", "sub/a.bin", "sub/keep.bin", "sub/scratch/", "scratch/", "sub/d/keep.bin"]
    ours_root = tmp_path / "ours"
    _make_tree(ours_root, files, paths)
    git_root = tmp_path / "git"
    subprocess.run(["git", "init", "-q", "--template=", str(git_root)], check=True)
    merged = {".gitignore": files[".gitignore"] + files[".cloudtrainignore"],
              "sub/.gitignore": files["sub/.gitignore"] + files["sub/.cloudtrainignore"]}
    _make_tree(git_root, merged, paths)
    ours = IgnoreMatcher(ours_root, defaults=())
    assert {p: ours(p) for p in paths} == _git_ignored(git_root, paths)


def test_bad_bracket_line_does_not_crash_sync(tmp_path: Path) -> None:
    # `[]]x` once became an invalid regex and stopped the whole sync with an internal error.
    for rel in ["]x", "a.txt", "b[/c"]:
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / ".gitignore").write_text("[]]x\n[\n[z-a]\n[[:nope:]]\nb[\n")
    scan = scan_tree(tmp_path, load_ignore(tmp_path))
    assert [e.rel for e in scan.entries] == [".gitignore", "a.txt", "b[/c"]
    assert scan.ignored == ("]x",)


def test_unreadable_ignore_file_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    # Syncing everything because the rules could not be read might upload secrets: refuse instead.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").symlink_to(tmp_path / "sub" / ".gitignore")  # a loop: ELOOP
    with pytest.raises(UsageError) as info:
        load_ignore(tmp_path)("sub/x")
    assert "sub/.gitignore" in info.value.one_line() and "\n" not in info.value.one_line()


def test_directory_named_like_an_ignore_file_is_no_rules(tmp_path: Path) -> None:
    (tmp_path / ".cloudtrainignore").mkdir()  # git skips a .gitignore that is not a file; so do we
    (tmp_path / ".gitignore").write_text("*.log\n")
    ignored = load_ignore(tmp_path)
    assert ignored("a.log") and not ignored("a.txt")


def test_five_thousand_files_read_rules_once_per_ignore_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sync walks the whole workdir: each ignore file is read and parsed once, never per path (the
    # speed itself is measured in benchmarks/sync_speed.py, not asserted here).
    from cloudtrain.remote import ignore as ignore_module

    (tmp_path / ".gitignore").write_text(
        "".join(f"*.tmp{i}\n/build{i}/\n!keep{i}.tmp{i}\nsrc/**/gen{i}\n" for i in range(25)) + "[[:digit:]]*.log\n"
    )
    for d in range(50):
        sub = tmp_path / f"pkg{d}" / "src" / f"mod{d}"
        sub.mkdir(parents=True)
        (tmp_path / f"pkg{d}" / ".gitignore").write_text("*.bak\n!important.bak\n")
        for f in range(100):
            (sub / f"file{f}.{'bak' if f % 10 == 0 else 'py'}").write_text("")
    parsed = []
    original = ignore_module.parse_lines
    monkeypatch.setattr(ignore_module, "parse_lines", lambda *args: parsed.append(1) or original(*args))
    scan = scan_tree(tmp_path, load_ignore(tmp_path))
    assert len(scan.entries) == 1 + 50 + 50 * 90 and len(scan.ignored) == 50 * 10
    assert len(parsed) == 1 + 50  # the top .gitignore and one per package


# issue 29, case 1: patterns that made the regex engine backtrack for seconds to hours. Each is
# answered (or, for a pattern even git would take years over, refused) within 1 CPU s and 100 MB.
HOSTILE = [
    ("issue-8-stars", "*a*a*a*a*a*a*a*a*b", "a" * 60, False),
    ("issue-30-stars", "*a" * 30 + "*b", "a" * 200, False),
    ("stars-matching", "*a" * 30 + "*b", "a" * 200 + "b", True),
    ("long-name", "*" + "*a" * 1000 + "*b", "a" * 4000, False),
    ("brackets", "[a-z]*" * 200 + "!", "ab" * 2000, False),
    ("double-star-run", "**/" * 20 + "*a*a*a*b", "a/" * 40 + "a" * 40, False),
    ("double-star-run-long", "**/" * 300 + "*a" * 300 + "*b", "a/" * 200 + "a" * 200, False),
    ("deep-path", "a/**/" * 50 + "b", "a/" * 100 + "b", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_pattern_is_answered_within_limits(pattern: str, path: str, expected: bool, tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text(pattern + "\n")
    out = run_bounded(
        f"from cloudtrain.remote.ignore import load_ignore\nignored = load_ignore({str(tmp_path)!r})",
        f"print('IGNORED', ignored({path!r}))",
    )
    assert f"IGNORED {expected}" in out


def test_pattern_past_the_step_bound_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No pattern found so far needs the bound (wildmatch.MAX_STEPS, about 0.1 s a path); it is
    # lowered here to show what happens past it: one line naming the file and line, exit 2.
    from cloudtrain.remote import wildmatch

    monkeypatch.setattr(wildmatch, "MAX_STEPS", 20)
    (tmp_path / ".gitignore").write_text("*.log\n" + "a/**/" * 5 + "b\n")
    with pytest.raises(UsageError) as info:
        load_ignore(tmp_path)("a/" * 10 + "c")
    line = info.value.one_line()
    assert info.value.exit_code == 2 and "\n" not in line
    assert f"{tmp_path / '.gitignore'}:2" in line and "too costly" in line


def test_ignore_file_past_the_size_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # git skips a .gitignore past 100 MiB; skipping would sync what it keeps home, so we refuse.
    from cloudtrain.remote import ignore as ignore_module

    monkeypatch.setattr(ignore_module, "MAX_IGNORE_FILE_BYTES", 10)
    (tmp_path / ".gitignore").write_text("*.log\nsecrets/\n")
    with pytest.raises(UsageError, match=r"\.gitignore: ignore file larger than"):
        load_ignore(tmp_path)("a.txt")
