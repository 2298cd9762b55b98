"""`recipes`: the ready-to-run recipes that ship with cloudtrain (usable by name from anywhere)."""

from __future__ import annotations

import click

from cloudtrain.cli import output


@click.command()
def recipes() -> None:
    """List the bundled recipes; run one by name, e.g. `cloudtrain run mnist-local`."""
    from cloudtrain.recipe import bundled_recipes
    from cloudtrain.yamlfile import read_yaml
    from cloudtrain.errors import RecipeError

    rows = []
    for name, path in bundled_recipes().items():
        data, _, text = read_yaml(path, RecipeError)
        cloud = (data or {}).get("resources", {}).get("cloud", "local") if isinstance(data, dict) else "-"
        rows.append((name, cloud, summary(text)))
    output.table(["RECIPE", "CLOUD", "WHAT"], rows)
    output.info("run one with `cloudtrain run NAME`, or copy it: it is in " + str(next(iter(bundled_recipes().values())).parent))


WIDTH = 72


def summary(text: str, width: int = WIDTH) -> str:
    """The recipe's first sentence, from its leading comment, shortened at a word boundary."""
    import textwrap

    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        part = line.lstrip("# ").strip()
        if not part:
            break
        words.append(part)
        if part.endswith((".", ":")):
            break
    sentence = " ".join(words).rstrip(":")
    return textwrap.shorten(sentence, width=width, placeholder=" ...")
