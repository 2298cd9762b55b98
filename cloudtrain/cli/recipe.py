"""`validate` and `schema`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.config import Config


@click.command()
@click.argument("recipe_paths", metavar="RECIPE...", nargs=-1, required=True)
@click.pass_context
def validate(ctx: click.Context, recipe_paths: tuple[str, ...]) -> None:
    """Check each RECIPE without creating anything: YAML syntax, fields, types, ${VAR}s, workdir and
    data paths, the bundled job's parameters and, for clouds that bill, the plan (instance type,
    region, GPU and price from the catalog). No cloud is asked. Every recipe is checked; exit 2 if
    any is refused (`cloudtrain validate recipes/*.yaml` in a pre-commit hook)."""
    from cloudtrain.config import load_config as load
    from cloudtrain.errors import UsageError

    load_config = functools.cache(load)  # read once for all the recipes
    if len(recipe_paths) == 1:  # one recipe: its error is the command's, rendered by main
        _validate_one(recipe_paths[0], load_config)
        return
    load_config()  # a bad config is said once, not once per recipe
    refused = 0
    for path in recipe_paths:
        try:
            _validate_one(path, load_config)
        except UsageError as exc:
            # The same lines main prints for one recipe; the others are still checked.
            refused += 1
            for line in exc.one_line().splitlines():
                click.echo(f"error: {line}", err=True)
    if refused:
        output.info(f"{refused} of {len(recipe_paths)} recipes refused")
        ctx.exit(2)


def _validate_one(recipe_path: str, load_config: Callable[[], Config]) -> None:
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
