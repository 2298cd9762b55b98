"""Recipe mistakes that used to get a type error or a bare field list: the line to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.errors import RecipeError
from cloudtrain.recipe import Autostop, load_recipe

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(("text", "expected"), [
    ("autostop: 30\n", "r.yaml:3: autostop: write the idle time as a mapping: `autostop: {idle_minutes: 30}`"),
    ("autostop: 2.5\n", "`autostop: {idle_minutes: 2.5}`"),
    ("autostop: true\n", "expected a mapping such as `autostop: {idle_minutes: 30}`, or `autostop: false`"),
    ("autostop: soon\n", "expected a mapping such as `autostop: {idle_minutes: 30}`"),
    ("cloud: aws\n", "r.yaml:3: cloud: unknown key 'cloud' at the top; did you mean resources.cloud?"),
    ("region: us-east-1\n", "did you mean resources.region?"),
    ("accelerators: T4:1\n", "did you mean resources.accelerators?"),
])
def test_a_misplaced_or_mistyped_field_says_what_to_write(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "r.yaml").write_text("name: demo\nrun: x\n" + text)
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml")
    line = caught.value.one_line()
    assert expected in line and "\n" not in line, line


@pytest.mark.parametrize(("text", "autostop"), [
    ("autostop: false\n", None),
    ("", None),
    ("autostop: {idle_minutes: 5}\n", Autostop(idle_minutes=5)),
])
def test_autostop_false_means_none(tmp_path: Path, text: str, autostop: Autostop | None) -> None:
    (tmp_path / "r.yaml").write_text("name: demo\nrun: x\n" + text)
    assert load_recipe(tmp_path / "r.yaml").recipe.autostop == autostop
