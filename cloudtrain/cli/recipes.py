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
        first_comment = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")
        cloud = (data or {}).get("resources", {}).get("cloud", "local") if isinstance(data, dict) else "-"
        rows.append((name, cloud, first_comment[:70]))
    output.table(["RECIPE", "CLOUD", "WHAT"], rows)
    output.info("run one with `cloudtrain run NAME`, or copy it: it is in " + str(next(iter(bundled_recipes().values())).parent))
