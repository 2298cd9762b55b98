"""A loopback TCP proxy that can cut its connections on demand: the flaky network for tests.

    proxy = TcpProxy(target_port)            # listen on proxy.port, forward to 127.0.0.1:target_port
    proxy.cut_after(2_000_000)               # the next connection to pass 2 MB is reset (once)
    proxy.cut_all()                          # reset every open connection now
    proxy.link_down()                        # cut everything and reset new connections too ...
    proxy.link_up()                          # ... until the link is back
    proxy.close()

Cuts send RST (SO_LINGER 0) to both sides, like a NAT box or a rebooted router dropping state.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Iterator

import pytest


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut_after: int | None = None
        self._closed = False
        self._down = False
        self.connections = 0  # accepted so far
        self.cuts = 0  # connections cut so far
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcpproxy-{self.port}", daemon=True)
        self._thread.start()

    def cut_after(self, nbytes: int) -> None:
        """Arm a one-shot cut: the first connection whose relayed bytes (both ways) exceed nbytes."""
        with self._lock:
            self._cut_after = nbytes

    def cut_all(self) -> int:
        """Reset every open connection; return how many were cut."""
        with self._lock:
            pairs = list(self._pairs)
            self.cuts += len(pairs)
        for client, upstream in pairs:
            # shutdown wakes the pump thread blocked in select; it closes (with RST) itself.
            for sock in (client, upstream):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    continue
        return len(pairs)

    def link_down(self) -> int:
        """The link is gone: cut every connection and reset new ones until link_up()."""
        self._down = True
        return self.cut_all()

    def link_up(self) -> None:
        self._down = False

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut_all()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
            with self._lock:
                self._pairs.append((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        relayed = 0
        open_sides = {client, upstream}
        try:
            while open_sides:
                readable, _, _ = select.select(list(open_sides), [], [], 1.0)
                for sock in readable:
                    data = sock.recv(1 << 16)
                    if not data:
                        open_sides.discard(sock)
                        peer[sock].shutdown(socket.SHUT_WR)
                        continue
                    peer[sock].sendall(data)
                    relayed += len(data)
                    if self._should_cut(relayed):
                        self._drop(client, upstream)
                        return
        except OSError:
            # cut_all() shut the sockets down under us: that connection is over.
            self._drop(client, upstream)
            return
        self._drop(client, upstream, reset=False)

    def _should_cut(self, relayed: int) -> bool:
        with self._lock:
            if self._cut_after is not None and relayed > self._cut_after:
                self._cut_after = None
                self.cuts += 1
                return True
        return False

    def _drop(self, client: socket.socket, upstream: socket.socket, *, reset: bool = True) -> None:
        with self._lock:
            if (client, upstream) in self._pairs:
                self._pairs.remove((client, upstream))
        if reset:
            _reset(client, upstream)
        else:
            client.close()
            upstream.close()


def _reset(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            continue


@pytest.fixture
def tcp_proxy() -> Iterator[type[TcpProxy]]:
    """Factory: `tcp_proxy(target_port)` -> TcpProxy, closed at teardown."""
    made: list[TcpProxy] = []

    def make(target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_port)
        made.append(proxy)
        return proxy

    yield make  # type: ignore[misc]
    for proxy in made:
        proxy.close()
