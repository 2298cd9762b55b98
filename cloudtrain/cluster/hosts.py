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

    failures = []
    for record in nodes:
        where = record.public_ip or record.instance_id
        try:
            (node,) = connect([record], provider, config)
        except CloudtrainError as exc:
            if not provider.traits.remote and "no longer exists" in exc.message:
                continue  # a local node whose directory is already gone: nothing runs there
            failures.append(f"{where}: {exc.one_line()}")
            continue
        try:
            jobs.end_all(node.transport, node.layout, remove=provider.traits.remote)
        except CloudtrainError as exc:
            failures.append(f"{where}: {exc.one_line()}")
        finally:
            close_all([node])
    return failures
