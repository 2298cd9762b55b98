"""YAML loading shared by recipes and config: merge keys behave as the YAML spec says on any PyYAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.errors import RecipeError
from cloudtrain.yamlfile import read_yaml

pytestmark = pytest.mark.quick

# yaml.org/type/merge.html: all four maps are equal. Keys of one and of several characters both,
# because PyYAML 6.0.4 gets the precedence right only for one-character keys (yaml/pyyaml#953).
SPEC_EXAMPLE = """\
- &CENTER {x: 1, y: 2, colour: red}
- &LEFT {x: 0, y: 2, colour: blue}
- &BIG {r: 10, radius: 10}
- &SMALL {r: 1, radius: 1}
- {x: 1, y: 2, r: 10, radius: 10, colour: red, label: center/big}
- <<: *CENTER
  r: 10
  radius: 10
  label: center/big
- <<: [*CENTER, *BIG]
  label: center/big
- <<: [*BIG, *LEFT, *SMALL]
  x: 1
  colour: red
  label: center/big
"""


def test_the_spec_merge_examples_load_equal(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(SPEC_EXAMPLE)
    data, _, _ = read_yaml(path, RecipeError)
    assert data[5] == data[4] and data[6] == data[4] and data[7] == data[4]


@pytest.mark.parametrize(("merge", "expected"), [
    ("<<: [*a, *b]", {"long_key": "a", "k": "a"}),
    ("<<: [*b, *a]", {"long_key": "b", "k": "b"}),
    ("<<: [*b, *a]\nlong_key: own", {"long_key": "own", "k": "b"}),
    ("<<: *b\n<<: *a", None),  # two `<<` keys in one mapping: refused as a duplicate
])
def test_earlier_merged_mappings_win_and_written_keys_win_over_all(tmp_path: Path, merge: str,
                                                                   expected: dict | None) -> None:
    path = tmp_path / "m.yaml"
    body = "\n".join("  " + line for line in merge.splitlines())
    path.write_text(f"a: &a {{long_key: a, k: a}}\nb: &b {{long_key: b, k: b}}\nc:\n{body}\n")
    if expected is None:
        with pytest.raises(RecipeError, match="duplicate key"):
            read_yaml(path, RecipeError)
        return
    data, _, _ = read_yaml(path, RecipeError)
    assert data["c"] == expected


def test_aliases_merging_each_other_stay_small(tmp_path: Path) -> None:
    # Each level merges the previous one twice: without keeping each key once, 2**40 pairs (the test
    # would hang until its timeout).
    lines = ["a0: &a0 {k: 0}"]
    lines += [f"a{i}: &a{i}\n  <<: [*a{i - 1}, *a{i - 1}]\n  k{i}: {i}" for i in range(1, 41)]
    path = tmp_path / "deep.yaml"
    path.write_text("\n".join(lines) + "\n")
    data, _, _ = read_yaml(path, RecipeError)
    assert len(data["a40"]) == 41 and data["a40"]["k"] == 0


def test_a_merge_of_a_scalar_is_one_line_with_where(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: &a 3\nb:\n  <<: *a\n")
    with pytest.raises(RecipeError, match=r"bad\.yaml:\d+:\d+: YAML syntax error: expected a mapping"):
        read_yaml(path, RecipeError)


BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)
# (id, file content, line the error names, words it says) - issue 24 item 12 and issue 29 case 5
HOSTILE_YAML = [
    ("billion-laughs", BILLION_LAUGHS, 6, "alias *e expands the document past 100000 values"),
    ("self-reference", "run: {train: x}\nnodes: &n [1, *n]\n", 2, "alias *n expands"),
    ("deep-flow", "a: " + "[" * 50_000 + "]" * 50_000 + "\n", 1, "nested more than 100 levels deep"),
    ("deep-block", "".join("  " * i + f"k{i}:\n" for i in range(150)) + "  " * 150 + "v: 1\n", 101,
     "nested more than 100 levels deep"),
]


@pytest.mark.parametrize(("text", "line", "words"), [c[1:] for c in HOSTILE_YAML], ids=[c[0] for c in HOSTILE_YAML])
def test_hostile_yaml_is_refused_in_one_line_naming_file_and_line(text: str, line: int, words: str,
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        read_yaml(path, RecipeError)
    message = info.value.one_line()
    assert "\n" not in message and message.startswith(f"{path}:{line}: refused: ") and words in message
    assert info.value.exit_code == 2


def test_file_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    from cloudtrain import yamlfile

    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * yamlfile.MAX_BYTES + "\n")
    with pytest.raises(RecipeError, match=r"big\.yaml: larger than 4 MiB"):
        read_yaml(path, RecipeError)


def test_aliases_within_the_bound_still_load(tmp_path: Path) -> None:
    # Four levels of ten references: 11,111 values, well inside the bound; the data is what YAML says.
    path = tmp_path / "ok.yaml"
    path.write_text(BILLION_LAUGHS.split("e:")[0])
    data, _, _ = read_yaml(path, RecipeError)
    assert len(data["d"]) == 10 and data["d"][9][9][9] == ["lol"] * 10


def test_billion_laughs_recipe_is_refused_within_limits(tmp_path: Path) -> None:
    # issue 24 item 12: `cloudtrain validate` ran past 60 s and 1.4 GB; refused within 1 s and 100 MB.
    from tests.bounded import run_bounded

    path = tmp_path / "recipe.yaml"
    path.write_text(BILLION_LAUGHS)
    out = run_bounded(
        "from pathlib import Path\nfrom cloudtrain.errors import RecipeError\nfrom cloudtrain.recipe import load_recipe",
        f"""
        try:
            load_recipe(Path({str(path)!r}))
        except RecipeError as exc:
            print("REFUSED", exc.one_line())
        """,
    )
    assert f"REFUSED {path}:6: refused: alias *e" in out
