"""Detecting the caller's address for firewall rules (against a local echo server, never the internet)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cloudtrain.errors import ConfigError
from cloudtrain.netaddr import caller_cidr

pytestmark = pytest.mark.quick


@pytest.fixture
def echo_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    answer = [b"203.0.113.9\n"]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer[0])

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("CLOUDTRAIN_IP_ECHO_URL", f"http://127.0.0.1:{server.server_port}/")
    yield answer
    server.shutdown()


def test_public_address_as_slash_32(echo_server: list[bytes]) -> None:
    assert caller_cidr() == "203.0.113.9/32"


@pytest.mark.parametrize("body", [b"<html>nope</html>", b"2001:db8::1"])
def test_unusable_answer_is_a_clear_error(echo_server: list[bytes], body: bytes) -> None:
    echo_server[0] = body
    with pytest.raises(ConfigError) as info:
        caller_cidr()
    assert "cannot detect your public IP" in info.value.one_line()
    assert "set ssh.allowed_cidr" in info.value.one_line()
