"""Fuzz tests (hypothesis) for every parser of untrusted input (issue 29, docs/security.md).

Each generated input runs under tests.bounded.limits(): 1 CPU second and 100 MiB of address space,
enforced by the kernel (ITIMER_PROF, RLIMIT_AS), never by a stopwatch. Ignore matching is checked
against `git check-ignore` itself; the other parsers must answer (a value, or their one documented
error) for any input. Examples are derandomized so CI runs the same inputs every time; together
they take well under a minute.
"""

from __future__ import annotations

import io
import json
import os
import string
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.errors import CloudtrainError, RecipeError, RemoteError
from tests.bounded import limits

def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------ ignore patterns x paths, git as oracle

# Bytes that mean something to wildmatch or to the ignore-file syntax, and a few that do not.
PATTERN_CHARS = "ab*?[]!^-\\/: "
NAME_CHARS = "ab*?[]!-\\: "
_component = st.text(NAME_CHARS, min_size=1, max_size=4).filter(
    lambda c: c not in (".", "..") and not c.startswith(":") and not c.endswith(" "))
_path = st.lists(_component, min_size=1, max_size=4).map("/".join)
_pattern = st.one_of(
    st.text(PATTERN_CHARS, min_size=1, max_size=12),
    st.sampled_from(["[[:alpha:]]", "[[:digit:]]*", "**/", "/**/", "a/**", "[!a]", "[a-]", "\\*"]).flatmap(
        lambda piece: st.tuples(st.text(PATTERN_CHARS, max_size=4), st.text(PATTERN_CHARS, max_size=4)).map(
            lambda ends: ends[0] + piece + ends[1])),
)


def _materialize(root: Path, paths: list[str]) -> list[str]:
    """Create the paths (as files); those that clash with one made before are left out."""
    made = []
    for rel in paths:
        target = root / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                continue
            target.write_bytes(b"x")
        except (NotADirectoryError, FileExistsError, IsADirectoryError):
            continue
        made.append(rel)
    return made


@fuzz(150)
@given(patterns=st.lists(_pattern, min_size=1, max_size=3), paths=st.lists(_path, min_size=1, max_size=4))
def test_ignore_matches_git(patterns: list[str], paths: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    from cloudtrain.remote.ignore import IgnoreMatcher
    from tests.remote.test_ignore import _git_ignored

    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as scratch:
        root = Path(scratch) / "repo"
        subprocess.run(["git", "init", "-q", "--template=", str(root)], check=True)
        (root / ".gitignore").write_text("\n".join(patterns) + "\n")
        made = _materialize(root, paths)
        asked = made + sorted({p.rpartition("/")[0] + "/" for p in made if "/" in p})
        if not asked:
            return
        expected = _git_ignored(root, asked)
        with limits():
            ours = IgnoreMatcher(root, defaults=())
            got = {p: ours(p) for p in asked}
        assert got == expected, patterns


_star_heavy = st.lists(st.sampled_from(["*", "**", "a", "b", "/", "?", "[ab]", "**/"]), max_size=60).map("".join)


@fuzz(300)
@given(pattern=_star_heavy, text=st.text("ab/", max_size=300))
def test_wildmatch_answers_star_heavy_patterns_within_limits(pattern: str, text: str) -> None:
    from cloudtrain.remote.wildmatch import wildmatch

    with limits():
        wildmatch(pattern.encode(), text.encode())  # an answer, never TooCostly, for anything this size


# ------------------------------------------------------------------ recipes and config

_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
_document = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=8), inner, max_size=5)),
    max_leaves=30)
_yaml_noise = st.text(alphabet="&*!<>[]{}:,-|'\"#% \n\tab0123", max_size=300)


def _bomb(width: int, depth: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


def _read(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from cloudtrain.yamlfile import read_yaml

    path = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "recipe.yaml"
    path.write_text(text)
    with limits():
        try:
            read_yaml(path, RecipeError)
        except RecipeError as exc:
            assert exc.one_line().startswith(str(path))


@fuzz(150)
@given(document=_document)
def test_valid_yaml_loads_as_written(document: object, tmp_path_factory: pytest.TempPathFactory) -> None:
    from cloudtrain.yamlfile import read_yaml

    path = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())) / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    with limits():
        data, _, _ = read_yaml(path, RecipeError)
    assert data == document


@fuzz(300)
@given(text=_yaml_noise)
def test_any_text_is_yaml_or_one_error(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    _read(text, tmp_path_factory)


@fuzz(60)
@given(width=st.integers(1, 12), depth=st.integers(0, 12), nesting=st.integers(0, 3000))
def test_alias_bombs_and_deep_nesting_are_refused_or_loaded_within_limits(
        width: int, depth: int, nesting: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    _read(_bomb(width, depth) + "deep: " + "[" * nesting + "]" * nesting + "\n", tmp_path_factory)


# ------------------------------------------------------------------ node listings and progress lines

_name = st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b)


@fuzz(300)
@given(files=st.dictionaries(_name, st.integers(0, 2**63)), noise=st.binary(max_size=200))
def test_file_listing_round_trips_any_name(files: dict[bytes, int], noise: bytes) -> None:
    from cloudtrain.remote.archive import parse_file_listing

    data = b"".join(b"%d %s\0" % (size, name) for name, size in files.items())
    with limits():
        parsed = parse_file_listing(data)
        parse_file_listing(noise + data)  # garbage in front: an answer, never an exception
    assert parsed == {name.decode(errors="surrogateescape"): size for name, size in files.items()}


@fuzz(300)
@given(data=st.binary(max_size=3000), limit=st.integers(1, 64))
def test_split_lines_keeps_every_byte_and_bounds_every_line(data: bytes, limit: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.run import follow

    monkeypatch.setattr(follow, "MAX_LINE_BYTES", limit)
    with limits():
        lines, rest = follow.split_lines(data)
    assert b"".join(line + b"\n" * (used - len(line)) for line, used in lines) + rest == data
    assert all(len(line) <= limit for line, _ in lines) and len(rest) <= limit


_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=20)
_event = st.fixed_dictionaries({"cloudtrain": st.just("progress"),
                                "type": st.sampled_from(["start", "step", "epoch", "done", "other"])},
                               optional={k: _json for k in ("epochs", "steps_per_epoch", "initial_epoch", "epoch",
                                                            "step", "loss", "accuracy", "test_accuracy")})


@fuzz(400)
@given(event=_event, nesting=st.integers(0, 100_000))
def test_progress_lines_are_shown_never_crash(event: dict, nesting: int) -> None:
    from cloudtrain.cli.output import RunDisplay, render_log_line
    from cloudtrain.events import parse_progress

    line = json.dumps(event)
    if nesting:
        line = line[:-1] + ', "x": ' + "[" * nesting + "]" * nesting + "}"
    display = RunDisplay(show_logs=False)
    with limits():
        parsed = parse_progress(line)
        if parsed is not None:
            display.progress(parsed)  # whatever parse_progress lets through, the display can show
        render_log_line(line)


# ------------------------------------------------------------------ archive member names

_member_name = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1, max_size=30)
_member = st.tuples(_member_name, st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE]),
                    st.text(max_size=20).filter(lambda s: "\0" not in s))


@fuzz(200)
@given(members=st.lists(_member, max_size=6))
def test_archive_members_land_inside_or_are_refused(members: list[tuple[str, bytes, str]],
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    from cloudtrain.remote.archive import safe_extract

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            data = b"content" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    outer = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    dest = outer / "run"
    refused: CloudtrainError | None = None
    with limits():
        try:
            safe_extract(io.BytesIO(buffer.getvalue()), dest)
        except RemoteError as exc:  # an archive tarfile cannot read back is refused whole
            refused = exc
    assert refused is None or "\n" not in refused.one_line()
    assert [p.name for p in outer.iterdir()] == ["run"]  # nothing beside the destination
    inside = str(dest.resolve())
    for path in dest.rglob("*"):
        assert os.path.realpath(path) == inside or os.path.realpath(path).startswith(inside + os.sep), path
