"""Shared pieces of Click commands. Imports stay inside functions: `status` must not pay for pydantic."""

from __future__ import annotations

from pathlib import Path
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


def check_runs_dir(base: Path, flag: str = "--runs-dir") -> None:
    """Refuse a runs directory that cannot be made, before anything runs; leaves nothing behind
    (a run directory appears only once the run is approved)."""
    import errno
    import tempfile

    from cloudtrain.errors import UsageError

    existing = base
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {base}: {existing} is not a directory", hint="name a directory you can write to")
    try:
        # Permission bits do not tell (root, read-only mounts, /proc): try, and remove the try.
        Path(tempfile.mkdtemp(prefix=".cloudtrain-check-", dir=existing)).rmdir()
    except OSError as exc:
        why = errno.errorcode.get(exc.errno or 0, "") and (exc.strerror or "")
        raise UsageError(f"{flag} {base}: cannot create directories in {existing} ({why or exc})",
                         hint="name a directory you can write to") from None
