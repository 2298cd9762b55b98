"""cloudtrain.names.check_cluster_name: the one rule for cluster names, table-driven."""

from __future__ import annotations

import pytest

from cloudtrain.errors import UsageError
from cloudtrain.names import NAME_RULE, check_cluster_name

pytestmark = pytest.mark.quick

VALID = [
    "a",
    "x",
    "ab",
    "a1",
    "mnist-local",
    "exp-2024-01-02",
    "a-b-c-d",
    "a--b",  # doubled dashes inside are fine
    "z" * 40,  # the longest
    "a" + "-" * 38 + "b",
    "run9",
]

# (name, why it is refused, the suggested --cluster, or None when there is none to give)
INVALID = [
    ("", "empty", None),
    ("A", "uppercase", "a"),
    ("Mnist", "uppercase", "mnist"),
    ("Bad_Name", "uppercase and underscore", "bad-name"),
    ("a_b", "underscore", "a-b"),
    ("a.b", "dot", "a-b"),
    ("a b", "space", "a-b"),
    ("-a", "starts with '-'", "a"),
    ("a-", "ends with '-'", "a"),
    ("1a", "starts with a digit", "c-1a"),
    ("9", "a lone digit", "c-9"),
    ("z" * 41, "too long", "z" * 40),
    ("..", "parent directory", None),
    ("../x", "a path", "x"),
    ("../../victim", "a path", "victim"),
    ("a/b", "a slash", "a-b"),
    ("/abs", "absolute path", "abs"),
    ("~root", "tilde", "root"),
    ("a\x00b", "NUL", "a-b"),
    ("$(id)", "shell substitution", "id"),
    ("a;rm -rf ~", "shell metacharacters", "a-rm--rf"),
    ("é", "non-ASCII", None),
    ("---", "only dashes", None),
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names_are_returned_unchanged(name: str) -> None:
    assert check_cluster_name(name) == name


@pytest.mark.parametrize(("name", "why", "suggestion"), INVALID, ids=[repr(case[0])[:30] for case in INVALID])
def test_invalid_names_are_usage_errors_with_the_rule(name: str, why: str, suggestion: str | None) -> None:
    with pytest.raises(UsageError) as caught:
        check_cluster_name(name)
    error = caught.value
    assert error.exit_code == 2
    line = error.one_line()
    assert "\n" not in line, f"{why}: the error must be one line"
    assert repr(name) in line and NAME_RULE in line, line
    if suggestion is None:
        assert "--cluster" not in line, line
    else:
        assert f"a valid name: {suggestion}" in line, line
        # The suggestion itself is a valid name.
        assert check_cluster_name(suggestion) == suggestion


def test_every_suggestion_is_valid() -> None:
    for name, _, _ in INVALID:
        with pytest.raises(UsageError) as caught:
            check_cluster_name(name)
        hint = caught.value.hint or ""
        if hint.startswith("a valid name: "):
            check_cluster_name(hint.removeprefix("a valid name: "))


@pytest.mark.parametrize("name", ["box\n", "a\n"])
def test_a_trailing_newline_is_refused(name: str) -> None:
    """`$` in a regex also matches before a final newline: the name must match as a whole."""
    with pytest.raises(UsageError):
        check_cluster_name(name)


@pytest.mark.parametrize("name", ["\nbox", "bo\nx", "box\n\n", "box\r", "box\t", " box", "box "])
def test_other_whitespace_is_refused(name: str) -> None:
    with pytest.raises(UsageError):
        check_cluster_name(name)
