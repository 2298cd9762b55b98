"""git's wildmatch (wildmatch.c), WM_PATHNAME, on bytes: the matcher behind ignore patterns.

A port of the algorithm, not a translation to regular expressions: Python's `re` backtracks, so
`*a*a*a*a*a*a*a*a*b` against a long name took seconds per name (issue 29). git's dowild gives up
on a `*` as soon as the rest of the pattern cannot match anywhere further on (its WM_ABORT_* codes),
which keeps every match polynomial and small: each star loop either fails on a literal prefix or
hands a final answer back. The recursion of the C code is an explicit stack here, so a pattern with
thousands of stars cannot exhaust Python's recursion limit, and star loops are memoized (see MAX_STEPS).

Behaviour kept from git, byte for byte: `*` and `?` never match `/`; `**` crosses `/` only as a
whole component (`**/`, `/**/`, `/**` at the end, or `**\\/`), elsewhere it is `*`; `[...]` with `!`
or `^`, ranges, `\\` escapes and `[:class:]` (ASCII classes only); a malformed bracket or an unknown
class never matches; a trailing `\\` never matches.
"""

from __future__ import annotations

MATCH, NOMATCH, ABORT_ALL, ABORT_TO_STARSTAR = 0, 1, -1, -2

_SLASH, _STAR, _QUESTION, _BRACKET, _BACKSLASH = 0x2F, 0x2A, 0x3F, 0x5B, 0x5C
GLOB_SPECIAL = frozenset(b"*?[\\")

# git's own ctype tables (git-compat-util.h / ctype.c), ASCII only: nothing above 127 is in a class.
CLASSES: dict[bytes, frozenset[int]] = {
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


class TooCostly(Exception):
    """A pattern needs more than MAX_STEPS steps against one path (only hostile patterns do)."""


# git's dowild is exponential in a run of `**/` (`**/**/**/...`: 18 of them took git 37 s against an
# 80-byte path). Star loops are memoized here, which makes every match polynomial, and one match may
# take at most this many steps (about 0.1 s): past it the caller refuses the pattern, it never guesses.
MAX_STEPS = 200_000


def wildmatch(pattern: bytes, text: bytes) -> bool:
    """True if text matches pattern as git's wildmatch(pattern, text, WM_PATHNAME) == WM_MATCH.

    Raises TooCostly past MAX_STEPS.
    """
    # Each frame is a star loop of git's dowild waiting for the answer of dowild(rest, position):
    # [rest of the pattern, text position, the star matches '/', `**/` still to try with no directory,
    # (rest, position) where the loop began: its answer depends on nothing else, hence the memo].
    frames: list[list] = []
    memo: dict[tuple[int, int], int] = {}
    spent = [0]  # steps: star-loop turns and pattern bytes compared, _linear's included
    outcome = _linear(pattern, text, 0, 0, spent)
    while True:
        spent[0] += 1
        if spent[0] > MAX_STEPS:
            raise TooCostly(f"more than {MAX_STEPS} steps")
        if isinstance(outcome, tuple):
            rest, pos, match_slash = outcome
            known = memo.get((rest, pos))
            if known is not None:
                outcome = known
                continue
            zero_dirs = match_slash and pattern[rest] == _SLASH
            frames.append([rest, pos, match_slash, zero_dirs, (rest, pos)])
            if zero_dirs:
                # git: first assume `**/` matches no directory at all (foo/**/bar ~ foo/bar)
                outcome = _linear(pattern, text, rest + 1, pos, spent)
                continue
        else:
            if not frames:
                return outcome == MATCH
            answer = _deliver(frames[-1], outcome, text)
            if answer is not None:
                memo[frames.pop()[4]] = outcome = answer
                continue
        frame = frames[-1]
        answer = _advance(pattern, text, frame)
        if answer is not None:
            memo[frames.pop()[4]] = outcome = answer
            continue
        outcome = _linear(pattern, text, frame[0], frame[1], spent)


def _deliver(frame: list, outcome: int, text: bytes) -> int | None:
    """A sub-match's answer to its star loop: the loop's own final answer, or None to try on."""
    rest, pos, match_slash, zero_dirs, _ = frame
    if zero_dirs:
        frame[3] = False
        return MATCH if outcome == MATCH else None  # then the loop starts at this same position
    if outcome != NOMATCH:
        # a match, or the rest ran out of text: no later position can do better (git's abort)
        if not match_slash or outcome != ABORT_TO_STARSTAR:
            return outcome
    elif not match_slash and text[pos] == _SLASH:
        return ABORT_TO_STARSTAR
    frame[1] = pos + 1
    return None


def _advance(pattern: bytes, text: bytes, frame: list) -> int | None:
    """Move the star loop to its next candidate position; its final answer if there is none."""
    rest, pos, match_slash, _, _ = frame
    if pos >= len(text):
        return ABORT_ALL
    literal = pattern[rest]
    if literal not in GLOB_SPECIAL:
        # git jumps to the next byte equal to the literal after the star: what lies before it can
        # only belong to the star. A '/' ends the search for a star that cannot cross it.
        end = len(text)
        if not match_slash and (slash := text.find(b"/", pos)) >= 0:
            end = slash
        found = text.find(bytes((literal,)), pos, end)
        if found < 0:
            return ABORT_ALL if match_slash else ABORT_TO_STARSTAR
        frame[1] = found
    return None


def _linear(pattern: bytes, text: bytes, p: int, t: int, spent: list[int]) -> int | tuple[int, int, bool]:
    """dowild from (p, t) up to the first star that needs a loop: an answer, or (rest, t, match_slash).

    Adds the pattern bytes it went through to spent[0]."""
    n_p, n_t = len(pattern), len(text)
    while p < n_p:
        spent[0] += 1
        p_ch = pattern[p]
        t_ch = text[t] if t < n_t else None
        if t_ch is None and p_ch != _STAR:
            return ABORT_ALL
        if p_ch == _BACKSLASH:
            p += 1
            if p == n_p or pattern[p] != t_ch:
                return NOMATCH
        elif p_ch == _QUESTION:
            if t_ch == _SLASH:
                return NOMATCH
        elif p_ch == _BRACKET:
            start = p
            matched, p = _bracket(pattern, p, t_ch)
            spent[0] += p - start
            if matched is None:
                return ABORT_ALL  # malformed: git gives up on the whole pattern
            if not matched or t_ch == _SLASH:
                return NOMATCH
        elif p_ch == _STAR:
            start = p
            p += 1
            match_slash = False
            if p < n_p and pattern[p] == _STAR:
                while p < n_p and pattern[p] == _STAR:
                    p += 1
                whole = start == 0 or pattern[start - 1] == _SLASH
                if whole and (p == n_p or pattern[p] == _SLASH or pattern[p : p + 2] == b"\\/"):
                    match_slash = True
                    # `**/**/` means what `**/` means (any number of directories), but git tries the
                    # second for every way the first can match: each one more doubles its work.
                    while pattern[p : p + 1] == b"/" and pattern[p + 1 : p + 3] == b"**":
                        q = p + 1
                        while q < n_p and pattern[q] == _STAR:
                            q += 1
                        if q == n_p or pattern[q] != _SLASH:
                            break
                        p = q
            if p == n_p:
                # a trailing `**` matches everything; a trailing `*` only what has no more '/'
                return MATCH if match_slash or text.find(b"/", t) < 0 else NOMATCH
            if not match_slash and pattern[p] == _SLASH:
                # one `*` then '/': the star takes the rest of this component, the loop the '/'
                slash = text.find(b"/", t)
                if slash < 0:
                    return NOMATCH
                t = slash
            else:
                return p, t, match_slash
        elif p_ch != t_ch:
            return NOMATCH
        p += 1
        t += 1
    return NOMATCH if t < n_t else MATCH


def _bracket(pattern: bytes, p: int, t_ch: int) -> tuple[bool | None, int]:
    """The `[...]` at p against one byte -> (matched, or None if malformed; index of its `]`)."""
    n = len(pattern)
    p += 1
    negated = p < n and pattern[p] in b"!^"
    if negated:
        p += 1
    prev_ch = 0  # git's prev_ch: a range may start here (0: it may not)
    matched = False
    while True:  # git's do { ... } while (prev_ch = p_ch, (p_ch = *++p) != ']')
        if p >= n:
            return None, n
        p_ch = pattern[p]
        if p_ch == _BACKSLASH:
            p += 1
            if p >= n:
                return None, n
            p_ch = pattern[p]
            if t_ch == p_ch:
                matched = True
        elif p_ch == 0x2D and prev_ch and p + 1 < n and pattern[p + 1] != 0x5D:  # a range: a-z
            p += 1
            p_ch = pattern[p]
            if p_ch == _BACKSLASH:
                p += 1
                if p >= n:
                    return None, n
                p_ch = pattern[p]
            if prev_ch <= t_ch <= p_ch:
                matched = True
            p_ch = 0
        elif p_ch == _BRACKET and p + 1 < n and pattern[p + 1] == 0x3A:  # [:class:]
            end = pattern.find(b"]", p + 2)
            if end < 0:
                return None, n
            if end - (p + 2) < 1 or pattern[end - 1] != 0x3A:
                # no `:]` before the `]`: the `[` is an ordinary member and parsing goes on after it
                if t_ch == _BRACKET:
                    matched = True
            else:
                members = CLASSES.get(pattern[p + 2 : end - 1])
                if members is None:
                    return None, n  # unknown class name: git gives up on the whole pattern
                if t_ch in members:
                    matched = True
                p_ch = 0
                p = end
        elif t_ch == p_ch:
            matched = True
        prev_ch = p_ch
        p += 1
        if p < n and pattern[p] == 0x5D:
            return matched != negated, p
