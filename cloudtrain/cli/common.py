"""Shared pieces of Click commands. Imports stay inside functions: `status` must not pay for pydantic."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from cloudtrain.events import Reporter
    from cloudtrain.cluster.lifecycle import Lifecycle



def valid_cluster_names(ctx: click.Context, param: click.Parameter, value: str | tuple[str, ...] | None):  # noqa: ANN202
    # Checked at the boundary, on every verb: a cluster name becomes paths here and on nodes.
    from cloudtrain.names import check_cluster_name

    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(check_cluster_name(v) for v in value)
    return check_cluster_name(value)


cluster_option = click.option("--cluster", "-c", "cluster", metavar="NAME", callback=valid_cluster_names,
                              help="Cluster name (default: recipe name).")


def cluster_argument(**kwargs: object):  # noqa: ANN201
    return click.argument("name", callback=valid_cluster_names, **kwargs)  # type: ignore[arg-type]


def open_lifecycle(reporter: Reporter | None = None) -> Lifecycle:
    from cloudtrain.config import load_config
    from cloudtrain.cluster.lifecycle import Lifecycle
    from cloudtrain.state import StateStore

    return Lifecycle(StateStore(), load_config(), reporter)
