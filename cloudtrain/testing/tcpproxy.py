"""A loopback TCP proxy that can cut its connections on demand: the flaky network for tests.

    proxy = TcpProxy(target_port)            # listen on proxy.port, forward to 127.0.0.1:target_port
    proxy.cut_after(2_000_000)               # the next connection to pass 2 MB is reset (once)
    proxy.cut_all()                          # reset every open connection now
    proxy.down()                             # the link is gone: cut everything, reset new connections ...
    proxy.up()                               # ... until it is back
    proxy.down(for_s=5)                      # gone for five seconds, then back by itself
    proxy.close()                            # gone for good: from this call on nothing is relayed
    TcpProxy(target_port, rtt_ms=50)         # a distant link: every byte arrives 25 ms later, each way

Latency: each direction holds what it reads for rtt_ms/2 before passing it on (bandwidth is not
limited), so a request -> answer turn costs rtt_ms more, as through a WAN link. Ordering, EOF and
cuts keep their meaning (a cut drops what is still held).

Cuts send RST (SO_LINGER 0) to both sides, like a NAT box or a rebooted router dropping state. A
connection attempted while the link is down is accepted by the kernel and reset at once, so a
client sees its connection reset (or its SSH banner never arrive) rather than a hang.
`link_down()` / `link_up()` are the older names of `down()` / `up()`.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import pytest


class TcpProxy:
    """Relays 127.0.0.1:`port` to `target_host`:`target_port`; see the module docstring."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *, rtt_ms: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay_s = max(0.0, rtt_ms) / 2000.0
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
        self._up_timer: threading.Timer | None = None
        self.connections = 0  # relayed so far
        self.refused = 0  # attempts reset because the link was down or closed
        self.cuts = 0  # connections cut so far
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcpproxy-{self.port}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ controls

    @property
    def is_down(self) -> bool:
        return self._down or self._closed

    def cut_after(self, nbytes: int) -> None:
        """Arm a one-shot cut: the first connection whose relayed bytes (both ways) exceed nbytes."""
        with self._lock:
            self._cut_after = nbytes

    def cut_all(self) -> int:
        """Reset every open connection; return how many were cut. New connections still pass."""
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

    def down(self, for_s: float | None = None) -> int:
        """The link is gone: cut every open connection and reset new ones until `up()` (or for
        `for_s` seconds, after which it comes back by itself). Returns how many were cut."""
        with self._lock:
            self._down = True
            self._cancel_timer()
            if for_s is not None:
                self._up_timer = threading.Timer(for_s, self.up)
                self._up_timer.daemon = True
                self._up_timer.start()
        return self.cut_all()

    def up(self) -> None:
        """The link is back: new connections pass again (cut ones stay cut)."""
        with self._lock:
            self._cancel_timer()
            self._down = False

    link_down = down
    link_up = up

    def close(self) -> None:
        """Gone for good: no new connection is relayed from this call on, every open one is cut,
        and the port stops listening. Safe to call twice."""
        with self._lock:
            self._closed = True
            self._cancel_timer()
        try:
            # shutdown() wakes the thread blocked in accept(); close() alone would not, and it
            # would then take (and relay) one more connection.
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)
        self.cut_all()

    # ------------------------------------------------------------------ internals

    def _cancel_timer(self) -> None:
        if self._up_timer is not None:
            self._up_timer.cancel()
            self._up_timer = None

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._down or self._closed
                if refuse:
                    self.refused += 1
            if refuse:
                _reset(client)
                if self._closed:
                    return
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
            with self._lock:
                if self._closed or self._down:
                    # close() or down() ran while we connected upstream: this one never passes.
                    self.refused += 1
                    _reset(client, upstream)
                    if self._closed:
                        return
                    continue
                self._pairs.append((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        if self.delay_s > 0:
            self._pump_delayed(client, upstream)
            return
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
        except (OSError, ValueError):
            # cut_all() shut the sockets down under us: that connection is over.
            self._drop(client, upstream)
            return
        self._drop(client, upstream, reset=False)

    def _pump_delayed(self, client: socket.socket, upstream: socket.socket) -> None:
        """One reader per direction stamps what it reads; one writer per direction sends it when due."""
        relayed = [0]
        done = threading.Event()

        def direction(src: socket.socket, dst: socket.socket) -> None:
            held: deque[tuple[float, bytes]] = deque()  # (due, data); b"" means EOF
            ready = threading.Condition()

            def writer() -> None:
                try:
                    while True:
                        with ready:
                            while not held:
                                ready.wait()
                            due, data = held[0]
                        pause = due - time.monotonic()
                        if pause > 0:
                            time.sleep(pause)
                        with ready:
                            held.popleft()
                        if not data:
                            dst.shutdown(socket.SHUT_WR)
                            return
                        dst.sendall(data)
                except OSError:
                    done.set()

            threading.Thread(target=writer, daemon=True).start()
            try:
                while True:
                    data = src.recv(1 << 16)
                    with ready:
                        held.append((time.monotonic() + self.delay_s, data))
                        ready.notify()
                    if not data:
                        return
                    relayed[0] += len(data)
                    if self._should_cut(relayed[0]):
                        done.set()
                        return
            except OSError:
                done.set()

        readers = [threading.Thread(target=direction, args=pair, daemon=True)
                   for pair in ((client, upstream), (upstream, client))]
        for thread in readers:
            thread.start()
        while any(t.is_alive() for t in readers) and not done.is_set():
            done.wait(0.5)
        if done.is_set():
            self._drop(client, upstream)
            return
        # Both sides sent EOF; let what is held drain before closing.
        time.sleep(self.delay_s + 0.05)
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
def tcp_proxy() -> Iterator[Callable[[int], TcpProxy]]:
    """Factory of flaky links: `tcp_proxy(target_port)` -> a `TcpProxy` on a free loopback port
    relaying to 127.0.0.1:`target_port` (e.g. an `sshd_vm`'s port). Point a host at `proxy.port`,
    then `cut_all()`, `cut_after(nbytes)`, `down()` / `up()` or `close()` it mid-run. Every proxy
    is closed at teardown."""
    made: list[TcpProxy] = []

    def make(target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_port)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()
