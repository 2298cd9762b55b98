"""Shared pieces of Click commands: building the core objects from flags and environment."""

from __future__ import annotations

from pathlib import Path

import click

from cloudtrain.config import Config, load_config
from cloudtrain.events import Reporter
from cloudtrain.recipe import LoadedRecipe, load_recipe

cluster_option = click.option("--cluster", "-c", "cluster", metavar="NAME", help="Cluster name (default: recipe name).")


def open_lifecycle(reporter: Reporter | None = None):  # noqa: ANN201
    from cloudtrain.lifecycle import Lifecycle
    from cloudtrain.state import StateStore

    config = load_config()
    return Lifecycle(StateStore(), config, reporter)


def config() -> Config:
    return load_config()


def recipe(path: str) -> LoadedRecipe:
    return load_recipe(Path(path))
