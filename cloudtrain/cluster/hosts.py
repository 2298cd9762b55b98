"""Machines that outlive their cluster (this one, on-prem hosts): `down` ends our jobs and removes our files."""

from __future__ import annotations

from collections.abc import Sequence

from cloudtrain.config import Config
from cloudtrain.providers.base import Provider
from cloudtrain.state import NodeRecord


def end_work_on_hosts(provider: Provider, nodes: Sequence[NodeRecord], config: Config) -> list[str]:
    """End every job of the cluster on each node, then remove our files; return what failed.

    Existing machines are never powered off. Jobs go first: a file removed under a running job
    leaves the job running without its workdir.
    """
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.cluster.nodes import close_all, connect
    from cloudtrain.remote import jobs

    from cloudtrain.remote.keys import KnownHosts

    failures = []
    pins = KnownHosts()
    for record in nodes:
        where = record.public_ip or record.instance_id
        try:
            (node,) = connect([record], provider, config)
        except CloudtrainError as exc:
            if not provider.traits.remote and "no longer exists" in exc.message:
                continue  # a local node whose directory is already gone: nothing runs there
            if provider.traits.remote and pins.get(record.instance_id) is None:
                # No host key was ever pinned for it: no SSH session ever reached it (a mistyped
                # address), so nothing of ours runs or lies there.
                continue
            failures.append(f"{where}: {exc.one_line()}")
            continue
        try:
            jobs.end_all(node.transport, node.layout, remove=provider.traits.remote)
        except CloudtrainError as exc:
            failures.append(f"{where}: {exc.one_line()}")
        finally:
            close_all([node])
    return failures


def moved_hosts(recipe_hosts: Sequence[tuple[str, int, str | None]], nodes: Sequence[NodeRecord]) -> str | None:
    """How the recipe's hosts (address, port, user or None) differ from the cluster's nodes, in
    words (`10.0.0.5:22 -> 10.0.0.6:22`), or None when they are the same machines."""
    changes = []
    for rank, node in enumerate(sorted(nodes, key=lambda n: n.rank)):
        if rank >= len(recipe_hosts):
            break
        address, port, user = recipe_hosts[rank]
        if node.public_ip != address or (node.ssh_port or 22) != port or (user is not None and node.ssh_user != user):
            was = f"{node.ssh_user}@{node.public_ip}:{node.ssh_port or 22}"
            changes.append(f"{was} -> {user + '@' if user else ''}{address}:{port}")
    return ", ".join(changes) or None
