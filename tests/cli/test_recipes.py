"""`cloudtrain recipes` describes each recipe by its first sentence, never cut mid-word."""

from __future__ import annotations

import pytest

from cloudtrain.cli.recipes import summary
from cloudtrain.recipe import bundled_recipes

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(("text", "expected"), [
    ("# Short one.\nname: x\n", "Short one."),
    ("# A sentence that goes on\n# over two lines.\n# Another.\nname: x\n", "A sentence that goes on over two lines."),
    ("# " + "word " * 30 + "\nname: x\n", ("word " * 13).strip() + " ..."),
    ("name: x\n# a comment below\n", ""),
    ("# Lead:\n#   cloudtrain run x\n", "Lead"),
])
def test_summary_is_the_first_sentence_cut_at_a_word(text: str, expected: str) -> None:
    assert summary(text, width=72) == expected


def test_no_bundled_description_ends_mid_word() -> None:
    for name, path in bundled_recipes().items():
        line = summary(path.read_text())
        assert line and len(line) <= 72, name
        assert line.endswith((".", " ...")) or line[-1].isalnum(), (name, line)
        if line.endswith(" ..."):
            head = line[: -len(" ...")]
            assert path.read_text().replace("\n# ", " ").count(head) == 1, (name, line)  # whole words of it
