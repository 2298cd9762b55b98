"""The latency proxy (cloudtrain.testing.tcpproxy with rtt_ms): bytes in order both ways, EOF
passed on, cuts still cut. (Its delay is what benchmarks/run_loop.py measures with; no timing here.)"""

from __future__ import annotations

import socket
import threading

import pytest

from cloudtrain.testing.tcpproxy import TcpProxy

pytestmark = pytest.mark.quick


def _pair(rtt_ms: float) -> tuple[TcpProxy, socket.socket, socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    proxy = TcpProxy(server.getsockname()[1], rtt_ms=rtt_ms)
    client = socket.create_connection(("127.0.0.1", proxy.port))
    peer, _ = server.accept()
    for sock in (client, peer):
        sock.settimeout(30)
    return proxy, server, client, peer


def _read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


@pytest.mark.parametrize("rtt_ms", [0, 40])
def test_bytes_arrive_in_order_both_ways_and_eof_passes(rtt_ms: float) -> None:
    proxy, server, client, peer = _pair(rtt_ms)
    try:
        up = b"".join(i.to_bytes(4, "big") for i in range(200_000))  # 800 KB, many reads and writes
        down = up[::-1]
        got: dict[str, bytes] = {}
        reader = threading.Thread(target=lambda: got.__setitem__("peer", _read_to_eof(peer)))
        reader.start()
        client.sendall(up)
        client.shutdown(socket.SHUT_WR)  # half-close: the other way stays open
        reader.join(timeout=60)
        assert got["peer"] == up
        peer.sendall(down)
        peer.shutdown(socket.SHUT_WR)
        assert _read_to_eof(client) == down
    finally:
        for sock in (client, peer, server):
            sock.close()
        proxy.close()


def test_a_delaying_proxy_still_cuts() -> None:
    proxy, server, client, peer = _pair(40)
    try:
        client.sendall(b"ping")
        assert peer.recv(4) == b"ping"
        assert proxy.cut_all() == 1
        try:
            rest = _read_to_eof(client)  # the cut shows as a reset, or an end with nothing more
        except ConnectionResetError:
            rest = b""
        assert rest == b"" and proxy.cuts == 1
    finally:
        for sock in (client, peer, server):
            sock.close()
        proxy.close()
