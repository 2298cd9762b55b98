"""Which files of a workdir stay home: `.gitignore` and `.cloudtrainignore` with gitignore semantics.

Supported: comments, blank lines, `*`, `?`, `[...]`, `**` (leading, trailing, in the middle),
`dir/` (directories only), `!negation`, anchoring by a leading or inner `/`, backslash escapes,
and nested `.gitignore` files (their patterns are relative to their own directory). As in git, a
file inside an ignored directory cannot be re-included by negating the file.

Built-in defaults come first, so a user file may re-include them with `!`: `.git/`,
`__pycache__/` and `.venv/` anywhere, and `runs/` at the top (where cloudtrain writes results).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_PATTERNS = (".git/", "__pycache__/", ".venv/", "/runs/")
IGNORE_FILES = (".gitignore", ".cloudtrainignore")


@dataclass(frozen=True)
class Rule:
    base: str  # directory the pattern is relative to: "" for root, else "a/b/"
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    source: str  # the original line, for debugging


def parse_pattern(line: str, base: str = "") -> Rule | None:
    """One gitignore line -> Rule, or None for blanks and comments."""
    raw = line.rstrip("\n").rstrip("\r")
    # Trailing spaces are ignored unless escaped with a backslash.
    stripped = raw.rstrip(" ")
    if stripped.endswith("\\") and len(raw) > len(stripped):
        stripped += " "
    if not stripped or stripped.startswith("#"):
        return None
    negate = stripped.startswith("!")
    if negate:
        stripped = stripped[1:]
    elif stripped.startswith("\\!") or stripped.startswith("\\#"):
        stripped = stripped[1:]
    dir_only = stripped.endswith("/")
    pattern = stripped.rstrip("/")
    if not pattern:
        return None
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    body = _translate(pattern)
    prefix = "" if anchored else "(?:.*/)?"
    return Rule(base, re.compile(f"^{prefix}{body}$", re.DOTALL), negate, dir_only, raw)


def _translate(pattern: str) -> str:
    """Glob -> regex body; `/` is a separator that `*` and `?` never cross."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                before_ok = i == 0 or pattern[i - 1] == "/"
                after = pattern[i + 2 : i + 3]
                if before_ok and after == "/":
                    out.append("(?:.*/)?")  # **/ : zero or more directories
                    i += 3
                    continue
                if before_ok and after == "":
                    out.append(".*")  # trailing /** : everything inside
                    i += 2
                    continue
                out.append("[^/]*")  # ** elsewhere behaves like *
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                inner = pattern[i + 1 : end]
                if inner[:1] in ("!", "^"):
                    inner = "^" + inner[1:]
                out.append(f"[{inner.replace(chr(92), chr(92) * 2)}]")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def read_rules(path: Path, base: str = "") -> list[Rule]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
    return [rule for line in text.splitlines() if (rule := parse_pattern(line, base)) is not None]


class IgnoreMatcher:
    """Callable: posix path relative to root (directories end with '/') -> ignored?"""

    def __init__(self, root: Path, *, defaults: tuple[str, ...] = DEFAULT_PATTERNS, nested: bool = True) -> None:
        self.root = root
        self.nested = nested
        self._root_rules = [r for p in defaults if (r := parse_pattern(p)) is not None]
        for name in IGNORE_FILES:
            self._root_rules += read_rules(root / name)
        self._dir_rules = lru_cache(maxsize=4096)(self._load_dir_rules)
        self._decided = lru_cache(maxsize=65536)(self._decide)

    def __call__(self, rel: str) -> bool:
        is_dir = rel.endswith("/")
        rel = rel.strip("/")
        if rel in ("", "."):
            return False
        parts = rel.split("/")
        # A path inside an ignored directory is ignored, whatever its own rules say.
        for depth in range(1, len(parts)):
            if self._decided("/".join(parts[:depth]), True):
                return True
        return self._decided(rel, is_dir)

    def _load_dir_rules(self, directory: str) -> tuple[Rule, ...]:
        return tuple(read_rules(self.root / directory / ".gitignore", directory + "/"))

    def _rules_for(self, rel: str) -> list[Rule]:
        rules = list(self._root_rules)
        if self.nested:
            parts = rel.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                rules += self._dir_rules("/".join(parts[:depth]))
        return rules

    def _decide(self, rel: str, is_dir: bool) -> bool:
        ignored = False
        for rule in self._rules_for(rel):
            if rule.dir_only and not is_dir:
                continue
            if rule.base:
                if not rel.startswith(rule.base):
                    continue
                subject = rel[len(rule.base) :]
            else:
                subject = rel
            if rule.regex.match(subject):
                ignored = not rule.negate
        return ignored


def load_ignore(root: Path) -> Callable[[str], bool]:
    """The ignore predicate for a workdir: defaults + .gitignore + .cloudtrainignore (+ nested)."""
    return IgnoreMatcher(Path(root))
