"""Reaching a cluster's nodes: one Transport per node, and running work on all nodes in parallel."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cloudtrain.config import Config
from cloudtrain.errors import CloudtrainError, RemoteError
from cloudtrain.providers.base import GivenHosts, HostSpec, Instance, InstanceState, Provider, machines, supports
from cloudtrain.remote.jobs import NodeLayout
from cloudtrain.remote.local import LocalTransport
from cloudtrain.remote.transport import Transport
from cloudtrain.state import NodeRecord

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    rank: int
    record: NodeRecord
    transport: Transport
    layout: NodeLayout
    python: str | None = None  # the interpreter the bootstrap chose for jobs (remote nodes)
    # prepare's own mkdir made the workdir (it was not there): the sync sends everything without
    # first asking the node what it holds (one round trip of a first `up`, docs/design/sync.md)
    fresh_workdir: bool = False

    @property
    def address(self) -> str:
        return self.record.private_ip or self.record.public_ip or "127.0.0.1"


def node_record(cluster: str, rank: int, instance: Instance, host: HostSpec | None = None) -> NodeRecord:
    return NodeRecord(
        cluster=cluster,
        rank=rank,
        instance_id=instance.id,
        state=instance.state.value,
        public_ip=instance.public_ip,
        private_ip=instance.private_ip,
        ssh_user=(host.user if host else None) or instance.ssh_user,
        ssh_port=(host.port if host else None) or instance.ssh_port,
        ssh_key=host.key if host else None,
        proxy_command=host.proxy_command if host else None,
        started_at=instance.launched_at,
    )


def instance_of(record: NodeRecord, home: str | None = None) -> Instance:
    return Instance(
        id=record.instance_id,
        cluster=record.cluster,
        state=InstanceState(record.state),
        public_ip=record.public_ip,
        private_ip=record.private_ip,
        ssh_user=record.ssh_user,
        ssh_port=record.ssh_port or 22,
        launched_at=record.started_at,
        home=home,
    )


def _host_and_key(record: NodeRecord, provider: Provider) -> tuple[HostSpec | None, Path | None]:
    if supports(provider, GivenHosts):
        # The user's own machine: their user, port, key and proxy from the recipe's host entry.
        host = HostSpec(
            address=record.public_ip or "",
            user=record.ssh_user,
            port=record.ssh_port or 22,
            key=record.ssh_key,
            proxy_command=record.proxy_command,
        )
        return host, None
    from cloudtrain.remote import keys

    return None, keys.cluster_key(record.cluster).private_path


def endpoint_of(record: NodeRecord, provider: Provider, config: Config):  # noqa: ANN201
    from cloudtrain.remote.keys import resolve_endpoint

    host, key_path = _host_and_key(record, provider)
    return resolve_endpoint(instance=instance_of(record), config=config, host=host, key_path=key_path)


def open_transport(record: NodeRecord, provider: Provider, config: Config) -> Transport:
    if not provider.traits.remote:
        described = machines(provider).describe([record.instance_id])[0]
        if described.home is None or described.state is InstanceState.TERMINATED:
            raise RemoteError(f"node {record.instance_id} no longer exists", hint="run `cloudtrain down` then `up`")
        return LocalTransport(described.home)
    from cloudtrain.remote import ssh

    host, key_path = _host_and_key(record, provider)
    return ssh.open_transport(
        cluster=record.cluster, instance=instance_of(record), config=config, host=host, key_path=key_path
    )


def connect(records: Sequence[NodeRecord], provider: Provider, config: Config) -> list[Node]:
    """One open Transport per record; if any node fails, none stays open (raises that failure)."""
    from cloudtrain.cluster.ingress import follow_caller

    check = follow_caller(records, provider, config)  # the cluster's SSH rule, brought to where we are now
    if len(records) > 1 and provider.traits.remote:
        shared_imports()

    def one(record: NodeRecord) -> Node:
        transport = open_transport(record, provider, config)
        try:
            return Node(record.rank, record, transport, NodeLayout.for_cluster(transport, record.cluster))
        except BaseException:
            # for_cluster asks the node for its home: connected but unusable is still open.
            transport.close()
            raise

    # A leaked SSH transport is a paramiko thread, a socket and maybe a ProxyCommand process that
    # live until this process exits (for a long `run`, hours).
    def connect_all() -> list[Node]:
        return on_all(list(records), one, label=lambda r: f"node {r.rank} ({r.instance_id})",
                      cleanup=lambda node: node.transport.close())

    try:
        return connect_all()
    except RemoteError as exc:
        from cloudtrain.remote.channel import SSHConnectError

        # The rule's answer was remembered, not asked (cluster/ingress.py): if it was wrong, the
        # cloud now has the rule at our address, and one more try may reach the node.
        if not isinstance(exc, SSHConnectError) or not check.after_failure():
            raise
    return connect_all()


def shared_imports() -> None:
    """What node threads may import, imported before they start. A node served by its mux does not
    load paramiko (remote/muxlink.py), one that connects itself does, in its own thread: while it
    runs, another thread saw paramiko half-initialized ("partially initialized module 'paramiko'
    has no attribute 'SSHException'"). Imports are made once, here, in the calling thread."""
    import paramiko  # noqa: F401

    from cloudtrain.remote import connection, helper, ssh  # noqa: F401


def describe_item(item: object) -> str:
    """How an error names what failed: a node by rank and instance, never a Python repr."""
    record = getattr(item, "record", item)
    rank, instance = getattr(record, "rank", None), getattr(record, "instance_id", None)
    if rank is not None and instance is not None:
        return f"node {rank} ({instance})"
    return str(item) if isinstance(item, str | int) else type(item).__name__


def on_all(
    items: list[T],
    fn: Callable[[T], R],
    label: Callable[[T], str] | None = None,
    cleanup: Callable[[R], object] | None = None,
) -> list[R]:
    """Run fn on every item in parallel and return the results in item order.

    Every call finishes before this returns or raises. If any fails, the first failure in item
    order is raised with its item's label in front (anything that is not a CloudtrainError
    becomes a RemoteError caused by it), and `cleanup` gets every result that did succeed,
    because the caller never sees them.
    """
    if not items:
        return []  # ThreadPoolExecutor refuses max_workers=0
    if len(items) == 1:
        return [fn(items[0])]
    pool = ThreadPoolExecutor(max_workers=min(16, len(items)))
    futures = [pool.submit(fn, item) for item in items]
    try:
        wait(futures)
    except BaseException:
        # Ctrl-C while waiting: start nothing new, let what runs finish, close what it opened.
        pool.shutdown(wait=True, cancel_futures=True)
        _clean_up([f for f in futures if not f.cancelled()], cleanup)
        raise
    pool.shutdown(wait=True)
    failed = next(((item, f.exception()) for item, f in zip(items, futures) if f.exception() is not None), None)
    if failed is None:
        return [f.result() for f in futures]
    _clean_up(futures, cleanup)
    item, exc = failed
    name = label(item) if label else describe_item(item)
    if isinstance(exc, CloudtrainError):
        exc.message = f"{name}: {exc.message}"
        raise exc
    if not isinstance(exc, Exception):
        raise exc  # SystemExit and the like: not ours to rename
    raise RemoteError(f"{name}: unexpected {type(exc).__name__}: {exc}") from exc


def _clean_up(futures: Sequence[Future], cleanup: Callable[[object], object] | None) -> None:
    if cleanup is None:
        return
    for future in futures:
        if not future.done() or future.exception() is not None:
            continue
        try:
            cleanup(future.result())
        except Exception as exc:  # noqa: BLE001
            # The failure being raised is what the caller needs; one that happened while
            # tidying up after it must neither hide it nor stop the other clean-ups.
            log.warning("cleaning up after a failed parallel step: %s: %s", type(exc).__name__, exc)


def close_all(nodes: Sequence[Node]) -> None:
    for node in nodes:
        node.transport.close()


def open_rank0(lifecycle: Any, name: str) -> tuple[Node, Callable[[], None]]:
    """A connection of its own to cluster `name`'s rank 0, for a thread beside the run's (the
    checkpoint puller of a recovering run or a sweep trial): `lifecycle` is that thread's own (its
    own state connection), closed with the node by the returned function."""
    try:
        cluster = lifecycle.get(name)
        nodes = connect(list(cluster.nodes)[:1], cluster.provider, lifecycle.config)
    except BaseException:
        lifecycle.store.close()
        raise

    def close() -> None:
        close_all(nodes)
        lifecycle.store.close()

    return nodes[0], close
