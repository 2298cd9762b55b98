"""`validate` and `schema`."""

from __future__ import annotations

import click

from cloudtrain.cli import output


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
def validate(recipe_path: str) -> None:
    """Check RECIPE: YAML syntax, fields, types, ${VAR}s, workdir and data paths."""
    from cloudtrain.lifecycle import refuse_unavailable
    from cloudtrain.recipe import load_recipe

    loaded = load_recipe(recipe_path)
    refuse_unavailable(loaded.recipe)
    r = loaded.recipe
    entry = f"job {r.job.name}" if r.job else "run command"
    output.info(f"{recipe_path}: ok ({r.name}: cloud {r.resources.cloud}, {r.num_nodes} node(s), {entry})")


@click.command()
def schema() -> None:
    """Print the recipe JSON Schema (point your editor's YAML plugin at it)."""
    from cloudtrain.recipe import json_schema

    output.print_json(json_schema())
