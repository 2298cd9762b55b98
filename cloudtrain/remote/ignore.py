"""Which files of a workdir stay home: `.gitignore` and `.cloudtrainignore`, decided exactly as git does.

The rules are git's own (dir.c and wildmatch.c), checked against `git check-ignore` by the tests:

- one pattern per line; `#` starts a comment, blank lines are skipped, a UTF-8 BOM and a CR before
  the newline are dropped; trailing spaces are trimmed unless escaped (`\\ `), tabs are kept;
- `!` negates, `\\!` and `\\#` are literal; a trailing `/` matches directories only;
- a pattern without `/` (besides a trailing one) matches the last path component at any depth,
  one with a `/` matches the path relative to the ignore file's directory (a leading `/` anchors);
- `*` and `?` never match `/`; `**` is special only as a whole component (`**/x`, `a/**/b`, `a/**`),
  elsewhere it is `*`; `[...]` with `!`/`^`, ranges, `\\` escapes and `[:class:]`; a pattern
  with an unterminated or malformed bracket matches nothing (git gives up on it, we must not crash);
- matching is on bytes and case-sensitive, so `?` is one byte as in git;
- in one file the last matching pattern wins; a deeper directory's file wins over a higher one;
  a path inside an ignored directory is ignored whatever follows, and that directory's own
  ignore files are never read.

`.cloudtrainignore` works like a second `.gitignore` read right after the one in the same directory,
so it can add patterns or re-include (`!`) what git ignores. Built-in defaults come before the top
directory's files, so a user file may re-include them: `.git/`, `__pycache__/` and `.venv/`
anywhere, and `runs/` at the top (where cloudtrain writes results).

Matching is git's wildmatch algorithm (remote/wildmatch.py), never a backtracking regex: an ignore
file comes with every cloned repository, so it is untrusted input. A pattern that would need more
than wildmatch.MAX_STEPS steps against one path is refused (UsageError naming file:line), not guessed.

An ignore file that exists but cannot be read is an error: syncing without its rules could send
what was meant to stay home.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cloudtrain.errors import UsageError
from cloudtrain.readlimit import read_at_most
from cloudtrain.remote.wildmatch import GLOB_SPECIAL, TooCostly, wildmatch

DEFAULT_PATTERNS = (".git/", "__pycache__/", ".venv/", "/runs/")
IGNORE_FILES = (".gitignore", ".cloudtrainignore")


@dataclass(frozen=True)
class Pattern:
    """One parsed ignore line; matching is git's: a literal head compared as is, the rest wildmatched."""

    source: str  # the pattern as written (after trimming), for debugging
    negate: bool
    dir_only: bool
    basename: bool  # no inner '/': matched against the last path component only
    head: bytes  # git's "prefix": the part before any wildcard, compared byte for byte
    tail: bytes | None  # the rest, for wildmatch; None when the pattern is all literal
    test: Callable[[bytes], bool] = field(repr=False, compare=False)  # basename, or path below the file's dir
    origin: str = ""  # file:line it came from, for errors


def parse_pattern(line: str | bytes, origin: str = "") -> Pattern | None:
    """One ignore-file line -> Pattern, or None for lines that can match nothing (blank, comment)."""
    raw = os.fsencode(line) if isinstance(line, str) else line
    raw = raw.split(b"\0", 1)[0]  # git reads each line as a C string
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if not raw or raw.startswith(b"#"):
        return None
    text = _trim_trailing_spaces(raw)
    negate = text.startswith(b"!")
    body = text[1:] if negate else text
    dir_only = body.endswith(b"/")
    if dir_only:
        body = body[:-1]  # exactly one, as git: `dir//` keeps a '/' and then matches nothing
    if not body:
        return None
    basename = b"/" not in body
    literal_len = _simple_length(body)
    if not basename and body.startswith(b"/"):
        body, literal_len = body[1:], literal_len - 1
    if literal_len == len(body):
        head, tail = body, None
    elif basename:
        head, tail = b"", body  # git wildmatches a basename pattern whole (match_basename)
    else:
        # git compares the wildcard-free head literally and wildmatches only the rest, as a pattern of
        # its own; that matters for `**`, which is special at the start of that rest (`ab**/c`).
        head, tail = body[:literal_len], body[literal_len:]
    return Pattern(os.fsdecode(text), negate, dir_only, basename, head, tail, _tester(head, tail), origin)


def _tester(head: bytes, tail: bytes | None) -> Callable[[bytes], bool]:
    if tail is None:
        return head.__eq__
    if not head and tail.startswith(b"*") and _simple_length(tail[1:]) == len(tail) - 1 and b"/" not in tail:
        # git's PATTERN_FLAG_ENDSWITH (`*.log`): the commonest pattern, one C call
        suffix = tail[1:]
        return lambda name: name.endswith(suffix) and b"/" not in name
    if not head:
        return lambda name: wildmatch(tail, name)
    return lambda path: path.startswith(head) and wildmatch(tail, path[len(head) :])


def parse_lines(data: bytes, origin: str = "") -> list[Pattern]:
    """The patterns of one ignore file's content (origin: its path, for errors), in file order."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    return [p for n, line in enumerate(lines, 1) if (p := parse_pattern(line, f"{origin}:{n}")) is not None]


def _trim_trailing_spaces(line: bytes) -> bytes:
    """git's trim_trailing_spaces: drop trailing ' ' (not tabs) unless escaped; a final '\\' keeps all."""
    last_space = None
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == 0x20:
            if last_space is None:
                last_space = i
        else:
            if c == 0x5C:
                i += 1
                if i == n:
                    return line
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def _simple_length(pattern: bytes) -> int:
    return next((i for i, c in enumerate(pattern) if c in GLOB_SPECIAL), len(pattern))


class _PatternList:
    """The patterns of one directory's ignore files; `base` is that directory ("" or "a/b/"), as bytes.

    As in git, the last matching pattern wins, so patterns are tried last first and the first match
    decides. Literal basename patterns (`build/`, `.env`) are one dict lookup whatever their number.
    """

    def __init__(self, base: bytes, patterns: Iterable[Pattern]) -> None:
        self.base = base
        self.patterns = tuple(patterns)
        self._dirs = _Rules(self.patterns, lambda p: True)
        self._files = _Rules(self.patterns, lambda p: not p.dir_only)

    def decide(self, path: bytes, name: bytes, is_dir: bool) -> bool | None:
        """True/False from the last pattern matching path (below base; name is its last part), else None."""
        winner = (self._dirs if is_dir else self._files).last_match(path[len(self.base) :], name)
        return None if winner < 0 else not self.patterns[winner].negate


class _Rules:
    """The patterns of one list that apply to one kind of entry (directories, or files)."""

    def __init__(self, patterns: tuple[Pattern, ...], applies: Callable[[Pattern], bool]) -> None:
        self.by_name: dict[bytes, int] = {}  # literal basename pattern -> its last index
        self.others: list[tuple[int, Pattern]] = []  # the rest, last first
        for i, p in enumerate(patterns):
            if not applies(p):
                continue
            if p.basename and p.tail is None:
                self.by_name[p.head] = i
            else:
                self.others.append((i, p))
        self.others.reverse()

    def last_match(self, rel: bytes, name: bytes) -> int:
        best = self.by_name.get(name, -1)
        for i, p in self.others:
            if i < best:
                break
            try:
                if p.test(name if p.basename else rel):
                    return i
            except TooCostly:
                # only a hostile pattern gets here (git itself would take minutes or years): refuse
                # it rather than guess, since a wrong guess could sync what was meant to stay home
                raise UsageError(
                    f"{p.origin or 'ignore pattern'}: pattern {p.source!r} is too costly to match"
                    f" against {os.fsdecode(rel if not p.basename else name)!r}",
                    hint="simplify the pattern (a run of `**/` is the usual cause)",
                ) from None
        return best


class IgnoreMatcher:
    """Callable: posix path relative to root (directories end with '/') -> ignored?"""

    def __init__(self, root: Path, *, defaults: Iterable[str] = DEFAULT_PATTERNS, nested: bool = True) -> None:
        self.root = Path(root)
        self.nested = nested
        top = [p for line in defaults if (p := parse_pattern(line)) is not None]
        for name in IGNORE_FILES:
            top += _read_patterns(self.root / name)
        # directory ("" for the top) -> the pattern lists that apply inside it, top first.
        self._chains: dict[str, tuple[_PatternList, ...]] = {"": (_PatternList(b"", top),)}
        self._dirs: dict[str, bool] = {}  # directory -> ignored?; sync asks about each file once

    def __call__(self, rel: str) -> bool:
        is_dir = rel.endswith("/")
        rel = rel.strip("/")
        if rel in ("", "."):
            return False
        return self._dir_ignored(rel) if is_dir else self._decide(rel, False)

    def _dir_ignored(self, rel: str) -> bool:
        known = self._dirs.get(rel)
        if known is None:
            # Decided top-down, each directory once: a path thousands of levels deep needs no recursion.
            missing = []
            while rel and rel not in self._dirs:
                missing.append(rel)
                rel = rel.rpartition("/")[0]
            for directory in reversed(missing):
                known = self._dirs[directory] = self._decide(directory, True)
        return known

    def _decide(self, rel: str, is_dir: bool) -> bool:
        parent = rel.rpartition("/")[0]
        # As in git: nothing inside an ignored directory comes back, and its ignore files go unread.
        if parent and self._dir_ignored(parent):
            return True
        path, name = os.fsencode(rel), os.fsencode(rel[len(parent) + 1 :] if parent else rel)
        for plist in reversed(self._chain(parent)):  # the deepest file with a matching pattern decides
            verdict = plist.decide(path, name, is_dir)
            if verdict is not None:
                return verdict
        return False

    def _chain(self, directory: str) -> tuple[_PatternList, ...]:
        missing = []  # top ("") is always known; the rest is built top-down, without recursion
        while directory not in self._chains:
            missing.append(directory)
            directory = directory.rpartition("/")[0]
        chain = self._chains[directory]
        for below in reversed(missing):
            if self.nested:
                own = [p for name in IGNORE_FILES for p in _read_patterns(self.root / below / name)]
                if own:
                    chain = (*chain, _PatternList(os.fsencode(below + "/"), own))
            self._chains[below] = chain
        return chain


# git itself skips an ignore file past 100 MiB (PATTERN_MAX_FILE_SIZE); skipping would sync what the
# file keeps home, so past the same size we refuse.
MAX_IGNORE_FILE_BYTES = 100 * 1024 * 1024


def _read_patterns(path: Path) -> list[Pattern]:
    try:
        with path.open("rb") as handle:
            data = read_at_most(handle, MAX_IGNORE_FILE_BYTES)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []  # no such file (a directory of that name is not one either, as in git): no rules
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot read this ignore file: {exc.strerror or exc}",
            hint="fix or remove it; syncing without its rules could send files meant to stay home",
        ) from None
    if len(data) > MAX_IGNORE_FILE_BYTES:
        raise UsageError(f"{path}: ignore file larger than {MAX_IGNORE_FILE_BYTES >> 20} MiB",
                         hint="git skips such a file; cloudtrain will not sync without its rules")
    return parse_lines(data, str(path))


def load_ignore(root: Path) -> Callable[[str], bool]:
    """The ignore predicate for a workdir: defaults + .gitignore + .cloudtrainignore (+ nested)."""
    return IgnoreMatcher(Path(root))
