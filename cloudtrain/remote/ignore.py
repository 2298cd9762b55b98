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

An ignore file that exists but cannot be read is an error: syncing without its rules could send
what was meant to stay home.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.errors import UsageError

DEFAULT_PATTERNS = (".git/", "__pycache__/", ".venv/", "/runs/")
IGNORE_FILES = (".gitignore", ".cloudtrainignore")

_GLOB_SPECIAL = frozenset(b"*?[\\")
_NEVER = re.compile(b"(?!)")

# git's own ctype tables (git-compat-util.h / ctype.c), ASCII only: nothing above 127 is in a class.
_CLASSES: dict[bytes, frozenset[int]] = {
    b"alnum": frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"alpha": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"blank": frozenset(b" \t"),
    b"cntrl": frozenset([*range(32), 127]),
    b"digit": frozenset(b"0123456789"),
    b"graph": frozenset(range(33, 127)),
    b"lower": frozenset(b"abcdefghijklmnopqrstuvwxyz"),
    b"print": frozenset(range(32, 127)),
    b"punct": frozenset(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    b"space": frozenset(b" \t\n\r"),  # git's isspace: not \v or \f
    b"upper": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    b"xdigit": frozenset(b"0123456789ABCDEFabcdef"),
}


@dataclass(frozen=True)
class Pattern:
    """One compiled ignore line."""

    source: str  # the pattern as written (after trimming), for debugging
    negate: bool
    dir_only: bool
    basename: bool  # no inner '/': matched against the last path component only
    regex: re.Pattern[bytes]  # full-matched against the basename or the path below the file's directory


def parse_pattern(line: str | bytes) -> Pattern | None:
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
    if basename:
        regex = _wildmatch_regex(body)
    else:
        # git compares the wildcard-free head literally and wildmatches only the rest, as a pattern of
        # its own; that matters for `**`, which is special at the start of that rest (`ab**/c`).
        literal_len = _simple_length(body)
        if body.startswith(b"/"):
            body, literal_len = body[1:], literal_len - 1
        rest = _wildmatch_regex(body[literal_len:])
        regex = None if rest is None else re.escape(body[:literal_len]) + rest
    compiled = _NEVER if regex is None else re.compile(regex, re.DOTALL)
    return Pattern(os.fsdecode(text), negate, dir_only, basename, compiled)


def parse_lines(data: bytes) -> list[Pattern]:
    """The patterns of one ignore file's content, in file order."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return [p for line in data.split(b"\n") if (p := parse_pattern(line)) is not None]


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
    return next((i for i, c in enumerate(pattern) if c in _GLOB_SPECIAL), len(pattern))


def _wildmatch_regex(pattern: bytes) -> bytes | None:
    """git's wildmatch(pattern, WM_PATHNAME) as a regex body, or None if it can never match."""
    out: list[bytes] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == 0x5C:  # backslash: the next byte literally
            if i + 1 == n:
                return None  # git compares it with the string's end: never equal
            out.append(re.escape(pattern[i + 1 : i + 2]))
            i += 2
        elif c == 0x3F:  # ?
            out.append(b"[^/]")
            i += 1
        elif c == 0x2A:  # *
            j = i
            while j < n and pattern[j] == 0x2A:
                j += 1
            whole_component = j - i >= 2 and (i == 0 or pattern[i - 1] == 0x2F)
            if whole_component and j == n:
                out.append(b".*")  # trailing `**`: everything below
                i = j
            elif whole_component and pattern[j] == 0x2F:
                out.append(b"(?:.*/)?")  # `**/`: zero or more directories
                i = j + 1
            elif whole_component and pattern[j : j + 2] == b"\\/":
                out.append(b".*")  # git crosses '/' here but, unlike `**/`, needs at least one
                i = j
            else:
                out.append(b"[^/]*")
                i = j
        elif c == 0x5B:  # [
            bracket, i = _bracket_regex(pattern, i)
            if bracket is None:
                return None
            out.append(bracket)
        else:
            out.append(re.escape(pattern[i : i + 1]))
            i += 1
    return b"".join(out)


def _bracket_regex(pattern: bytes, start: int) -> tuple[bytes | None, int]:
    """The `[...]` at start -> (regex class or None if git aborts on it, index after the `]`)."""
    n = len(pattern)
    j = start + 1
    negated = j < n and pattern[j] in b"!^"
    if negated:
        j += 1
    members: set[int] = set()
    prev: int | None = None  # git's prev_ch: a range may start here
    first = True
    while True:
        if j >= n:
            return None, n  # no closing `]`
        c = pattern[j]
        if c == 0x5D and not first:  # `]` closes, except as the first member (`[]]`)
            break
        first = False
        if c == 0x5C:
            j += 1
            if j >= n:
                return None, n
            prev = pattern[j]
            members.add(prev)
        elif c == 0x2D and prev is not None and j + 1 < n and pattern[j + 1] != 0x5D:  # a-z
            j += 1
            high = pattern[j]
            if high == 0x5C:
                j += 1
                if j >= n:
                    return None, n
                high = pattern[j]
            members.update(range(prev, high + 1))  # empty when reversed, as in git
            prev = None
        elif c == 0x5B and j + 1 < n and pattern[j + 1] == 0x3A:  # [:class:]
            end = pattern.find(b"]", j + 2)
            if end == -1:
                return None, n
            if end - (j + 2) < 1 or pattern[end - 1] != 0x3A:
                members.add(c)  # no `:]` before the `]`: the `[` is an ordinary member
                prev = c
            else:
                cls = _CLASSES.get(pattern[j + 2 : end - 1])
                if cls is None:
                    return None, n  # unknown class name: git gives up on the whole pattern
                members.update(cls)
                prev = None
                j = end
        else:
            members.add(c)
            prev = c
        j += 1
    members.discard(0x2F)  # with WM_PATHNAME a bracket never matches '/'
    if negated:
        members.add(0x2F)
    elif not members:
        return b"(?!)", j + 1
    ranges = _ranges(sorted(members))
    body = b"".join(b"\\x%02x" % lo if lo == hi else b"\\x%02x-\\x%02x" % (lo, hi) for lo, hi in ranges)
    return (b"[^" if negated else b"[") + body + b"]", j + 1


def _ranges(values: list[int]) -> Iterable[tuple[int, int]]:
    lo = hi = values[0]
    for v in values[1:]:
        if v == hi + 1:
            hi = v
            continue
        yield lo, hi
        lo = hi = v
    yield lo, hi


class _PatternList:
    """The patterns of one directory's ignore files; `base` is that directory ("" or "a/b/"), as bytes.

    Patterns are joined into a few regexes (basename or path patterns, for directories or files),
    last pattern first, each in its own group: the first alternative that matches is the last
    matching pattern of its kind, found in one C-level scan instead of a Python loop per pattern.
    """

    def __init__(self, base: bytes, patterns: Iterable[Pattern]) -> None:
        self.base = base
        self.patterns = tuple(patterns)
        indexed = [(i, p) for i, p in enumerate(self.patterns) if p.regex is not _NEVER]
        self._dirs = (_combine([(i, p) for i, p in indexed if p.basename]),
                      _combine([(i, p) for i, p in indexed if not p.basename]))
        files = [(i, p) for i, p in indexed if not p.dir_only]
        self._files = (_combine([(i, p) for i, p in files if p.basename]),
                       _combine([(i, p) for i, p in files if not p.basename]))

    def decide(self, path: bytes, name: bytes, is_dir: bool) -> bool | None:
        """True/False from the last pattern matching path (below base; name is its last part), else None."""
        (by_name, name_index), (by_path, path_index) = self._dirs if is_dir else self._files
        # Each alternative is one group, so a match always has lastindex: the group that matched.
        winner = -1
        if by_name is not None and (match := by_name.fullmatch(name)) and match.lastindex:
            winner = name_index[match.lastindex - 1]
        if by_path is not None and (match := by_path.fullmatch(path, len(self.base))) and match.lastindex:
            winner = max(winner, path_index[match.lastindex - 1])
        return None if winner < 0 else not self.patterns[winner].negate


def _combine(patterns: list[tuple[int, Pattern]]) -> tuple[re.Pattern[bytes] | None, list[int]]:
    """One regex for (index, pattern) pairs, the last pattern first; group k -> that pattern's index."""
    if not patterns:
        return None, []
    ordered = patterns[::-1]
    regex = re.compile(b"|".join(b"(" + p.regex.pattern + b")" for _, p in ordered), re.DOTALL)
    return regex, [i for i, _ in ordered]


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
            known = self._dirs[rel] = self._decide(rel, True)
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
        chain = self._chains.get(directory)
        if chain is None:
            chain = self._chain(directory.rpartition("/")[0])
            if self.nested:
                own = [p for name in IGNORE_FILES for p in _read_patterns(self.root / directory / name)]
                if own:
                    chain = (*chain, _PatternList(os.fsencode(directory + "/"), own))
            self._chains[directory] = chain
        return chain


def _read_patterns(path: Path) -> list[Pattern]:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []  # no such file (a directory of that name is not one either, as in git): no rules
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot read this ignore file: {exc.strerror or exc}",
            hint="fix or remove it; syncing without its rules could send files meant to stay home",
        ) from None
    return parse_lines(data)


def load_ignore(root: Path) -> Callable[[str], bool]:
    """The ignore predicate for a workdir: defaults + .gitignore + .cloudtrainignore (+ nested)."""
    return IgnoreMatcher(Path(root))
