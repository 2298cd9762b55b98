"""Shared pieces of Click commands. Imports stay inside functions: `status` must not pay for pydantic."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from cloudtrain.events import Reporter
    from cloudtrain.lifecycle import Lifecycle

cluster_option = click.option("--cluster", "-c", "cluster", metavar="NAME", help="Cluster name (default: recipe name).")


def open_lifecycle(reporter: Reporter | None = None) -> Lifecycle:
    from cloudtrain.config import load_config
    from cloudtrain.lifecycle import Lifecycle
    from cloudtrain.state import StateStore

    return Lifecycle(StateStore(), load_config(), reporter)
