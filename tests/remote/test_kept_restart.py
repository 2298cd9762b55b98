"""A kept connection (ssh.persist_s: a parked one in this process, the node's mux across commands)
to a machine that was stopped and started again at the same address: the next command must reopen
the connection itself, never fail on the previous boot's.

A real VM that powers off sends nothing: its connections look open to the laptop until a packet goes
out, and once the machine is back at that address its kernel answers that packet with a reset. The
test kit's sshd VMs close their connections when stopped (FIN), which a mux notices at once; so here
the VM is reached through `PowerLink`, which relays like the network and behaves like that silent
power-off: the VM's side closing reaches nobody, what is sent meanwhile is lost, and the first
packet after the machine is back gets a reset.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cloudtrain.remote import muxkeep, muxlink
from cloudtrain.remote.keys import KnownHosts
from cloudtrain.remote.ssh import SSHTransport, open_transport
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.wait import wait_until
from tests.remote.conftest import fast_config

pytestmark = pytest.mark.usefixtures("no_mux_left")


class PowerLink:
    """127.0.0.1:`port` relayed to the VM's sshd; `off()` / `on()` around the VM's stop and start."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.powered = True
        self.rtt_s = 0.2  # a distant machine: its answers (a reset too) take this long
        self.lost = 0  # bytes sent to the machine while it was off or after its side closed
        self.reset = 0  # connections reset by the machine's next boot
        self.closed = threading.Event()  # a connection's VM side closed (the machine went down)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def off(self) -> None:
        self.powered = False

    def on(self) -> None:
        self.powered = True

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        with self._lock:
            for sock in self._socks:
                sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _reset(self, client: socket.socket) -> None:
        self.reset += 1
        try:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.shutdown(socket.SHUT_RDWR)
        except OSError:
            return  # closed meanwhile

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        vm_side_open, resetting = True, False
        while not self._stop.is_set():
            ready, _, _ = select.select([client] + ([upstream] if vm_side_open else []), [], [], 0.5)
            try:
                if upstream in ready:
                    data = upstream.recv(1 << 16)
                    if not data:  # the machine went down: nothing of it reaches the laptop
                        vm_side_open = False
                        self.closed.set()
                        continue
                    if self.powered:  # a machine being powered off says nothing more (no channel close)
                        client.sendall(data)
                if client in ready:
                    data = client.recv(1 << 16)
                    if not data:
                        break
                    if vm_side_open:
                        upstream.sendall(data)
                        continue
                    self.lost += len(data)
                    if self.powered and not resetting:
                        # The next boot knows no such connection: its reset comes back a round trip
                        # later (what the laptop sent meanwhile is lost too).
                        resetting = True
                        timer = threading.Timer(self.rtt_s, self._reset, args=(client,))
                        timer.daemon = True
                        timer.start()
            except OSError:
                break
        client.close()
        upstream.close()


@pytest.fixture
def link(sshd_vm: SshdVM) -> PowerLink:
    proxy = PowerLink(sshd_vm.port)
    yield proxy
    proxy.close()


def _open(vm: SshdVM, factory: SshdFactory, link: PowerLink) -> SSHTransport:
    instance = replace(vm.instance(), ssh_port=link.port)
    return open_transport(cluster="test", instance=instance, config=fast_config(persist_s=60),
                          key_path=factory.client_key.private_path)


def _power_cycle(vm: SshdVM, link: PowerLink, *, lost: bool) -> None:
    link.off()
    vm.stop()
    wait_until(link.closed.is_set, timeout=30, what="the VM's side of the kept connection to close")
    if lost:
        # Something was sent on it while the machine was off (the mux's ping; paramiko's keepalive,
        # every 15 s, before the fix), lost as on a real network.
        wait_until(lambda: link.lost > 0, timeout=60, what="a packet lost while the machine was off")
    vm.start()
    link.on()


def test_a_mux_to_a_machine_stopped_and_started_gives_way_to_a_new_connection(
        sshd_vm: SshdVM, sshd_vm_factory: SshdFactory, link: PowerLink) -> None:
    first = _open(sshd_vm, sshd_vm_factory, link)
    assert first.run(["true"]).exit_code == 0
    spec = first.mux_spec()
    first.close()
    muxkeep.forget(spec.instance_id)  # this process's parked copy: the next transport must use the mux
    muxkeep._forgotten.discard(spec.instance_id)  # noqa: SLF001 - only the parked copy was meant
    proc = muxkeep.spawn(spec)
    assert proc is not None
    pin = KnownHosts(Path(spec.known_hosts)).get(spec.instance_id)
    assert muxlink.wait_for(spec, pin, 30) is not None, "the mux never served"

    _power_cycle(sshd_vm, link, lost=True)

    t = _open(sshd_vm, sshd_vm_factory, link)
    try:
        # As `run` and `exec` prepare the node: the first request sent without waiting for anything.
        running = t.start("echo ready", what="preparing the node")
        try:
            assert running.read_all() == b"ready\n" and running.wait() == 0
        finally:
            running.close()
        assert t.connects == 1  # the mux said no; the command connected itself
    finally:
        t.close()
    assert proc.wait(timeout=30) == 0  # the mux of the previous boot is gone


def test_a_parked_connection_to_a_machine_stopped_and_started_is_reopened(
        sshd_vm: SshdVM, sshd_vm_factory: SshdFactory, link: PowerLink, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real stop and start take far longer than the 2 s after which a parked connection is asked for
    # a sign of life before it is used; this VM's take a fraction of it.
    monkeypatch.setattr(muxkeep, "_CONFIRM_AFTER_S", 0.0)
    first = _open(sshd_vm, sshd_vm_factory, link)
    assert first.run(["true"]).exit_code == 0
    first.close()  # parked in this process, for the next transport

    _power_cycle(sshd_vm, link, lost=False)

    t = _open(sshd_vm, sshd_vm_factory, link)
    try:
        running = t.start("echo ready", what="preparing the node")
        try:
            assert running.read_all() == b"ready\n" and running.wait() == 0
        finally:
            running.close()
        assert t.connects == 1 and t.reused == ""
    finally:
        t.close()
        muxkeep.forget(t.endpoint.instance_id)  # nothing parked outlives the test
        muxkeep._forgotten.discard(t.endpoint.instance_id)  # noqa: SLF001
