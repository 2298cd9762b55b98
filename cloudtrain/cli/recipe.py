"""`validate` and `schema`."""

from __future__ import annotations

import click

from cloudtrain.cli import output


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
def validate(recipe_path: str) -> None:
    """Check RECIPE without creating anything: YAML syntax, fields, types, ${VAR}s, workdir and
    data paths, the bundled job's parameters and, for clouds that bill, the plan (instance type,
    region, GPU and price from the catalog). No cloud is asked."""
    from cloudtrain.config import load_config
    from cloudtrain.preflight import preflight
    from cloudtrain.recipe import load_recipe

    loaded = load_recipe(recipe_path, defer_paths=True)  # said with the plan's problems, in one round
    plan = preflight(loaded, load_config())
    output.recipe_warnings(loaded.warnings)
    r = loaded.recipe
    entry = f"job {r.job.name}" if r.job else "run command"
    output.info(f"{recipe_path}: ok ({r.name}: cloud {r.resources.cloud}, {r.num_nodes} node(s), {entry})")
    if plan is not None:
        others = len(plan.candidates) - 1
        fallback = f"; {others} more placement(s) to fail over to" if others else ""
        output.info(f"plan: {plan.summary()}{fallback}")


@click.command()
def schema() -> None:
    """Print the recipe JSON Schema (point your editor's YAML plugin at it)."""
    from cloudtrain.recipe import json_schema

    output.print_json(json_schema())
