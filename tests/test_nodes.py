"""nodes.connect / on_all: a failure on one node names it, and nothing opened for the others leaks."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import RemoteError
from cloudtrain.cluster.nodes import connect, node_record, on_all
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import HostSpec, InstanceSpec
from cloudtrain.remote.ssh import SSHConnectError
from cloudtrain.state import NodeRecord
from cloudtrain.testing.sshd import SshdFactory, free_port

_ESTABLISHED = "01"  # TCP state code in /proc/net/tcp


def established_to(port: int) -> int:
    """Open TCP connections to 127.0.0.1:port, whichever process holds them (us or a ProxyCommand)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            remote, state = fields[2], fields[3]
            if state == _ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def settles_to_zero(port: int, timeout: float = 5.0) -> bool:
    # The client side leaves ESTABLISHED as soon as we close; a proxy process needs a moment to exit.
    deadline = time.monotonic() + timeout
    while established_to(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return established_to(port) == 0


def ssh_records(hosts: tuple[HostSpec, ...]) -> list[NodeRecord]:
    """What lifecycle stores for an ssh cluster: the provider's instances plus the recipe's hosts."""
    provider = get_provider("ssh", Config())
    instances = provider.given_nodes(InstanceSpec(cluster="lab", owner="me", hosts=hosts), len(hosts))
    return [node_record("lab", rank, inst, host) for rank, (inst, host) in enumerate(zip(instances, hosts))]


FAST = Config(ssh={"connect_timeout_s": 5, "connect_retries_s": 0})


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "proxy-command"])
def test_connect_closes_the_transports_it_opened_when_a_node_fails(sshd_vm_factory: SshdFactory, proxy: bool) -> None:
    good = sshd_vm_factory.start()
    key = str(sshd_vm_factory.client_key.private_path)
    dead = HostSpec("127.0.0.1", user=good.user, port=free_port(), key=key)  # nothing listens there
    records = ssh_records((good.host_spec(key, proxy=proxy), dead))
    assert established_to(good.port) == 0

    with pytest.raises(SSHConnectError) as caught:
        connect(records, get_provider("ssh", FAST), FAST)
    assert caught.value.message.startswith(f"node 1 ({records[1].instance_id}): ")
    assert settles_to_zero(good.port), "node 0's connection (or its ProxyCommand) outlived the failed connect"

    # Both reachable: the nodes come back open, and close as usual.
    second = sshd_vm_factory.start()
    nodes = connect(ssh_records((good.host_spec(key, proxy=proxy), second.host_spec(key))),
                    get_provider("ssh", FAST), FAST)
    assert [n.transport.home for n in nodes] == [good.home, second.home]
    assert established_to(good.port) == 1
    for node in nodes:
        node.transport.close()
    assert settles_to_zero(good.port)


def test_connect_closes_a_transport_whose_node_setup_fails(sshd_vm_factory: SshdFactory) -> None:
    """Connected, but the node's home cannot be determined: that connection is closed too."""
    vm = sshd_vm_factory.start()
    shutil.rmtree(vm.home_dir)  # the VM's login command `cd "$HOME"` now fails
    records = ssh_records((vm.host_spec(str(sshd_vm_factory.client_key.private_path)),))
    with pytest.raises(RemoteError):
        connect(records, get_provider("ssh", FAST), FAST)
    assert settles_to_zero(vm.port)


def test_on_all_waits_for_every_item_and_names_an_unexpected_failure() -> None:
    finished: list[int] = []
    release = threading.Event()

    def work(item: int) -> int:
        if item == 1:
            raise ValueError("not a number")
        release.wait(5)  # still running when item 1 has already failed
        finished.append(item)
        return item

    threading.Timer(0.3, release.set).start()
    with pytest.raises(RemoteError) as caught:
        on_all([0, 1, 2], work, label=lambda i: f"item {i}")
    assert sorted(finished) == [0, 2]
    assert caught.value.message == "item 1: unexpected ValueError: not a number"
    assert isinstance(caught.value.__cause__, ValueError)


def test_on_all_raises_the_first_failure_in_item_order_and_cleans_up_the_rest() -> None:
    cleaned: list[int] = []

    def work(item: int) -> int:
        if item in (2, 3):
            time.sleep(0.2 if item == 2 else 0)  # item 3 fails first in time, item 2 first in order
            raise RemoteError(f"boom {item}")
        return item * 10

    with pytest.raises(RemoteError) as caught:
        on_all([1, 2, 3, 4], work, label=lambda i: f"item {i}", cleanup=cleaned.append)
    assert caught.value.message == "item 2: boom 2"
    assert sorted(cleaned) == [10, 40]

    cleaned.clear()
    assert on_all([1, 4], work, cleanup=cleaned.append) == [10, 40]
    assert cleaned == []  # nothing failed: the caller owns the results
    assert on_all([], work) == []  # e.g. a cluster whose node list is empty
