"""How a node that could not be reached is described (cloudtrain/remote/reach.py), and the lines a
long connect wait prints."""

from __future__ import annotations

import errno
import logging
import socket

import paramiko
import pytest

from cloudtrain.remote import reach
from cloudtrain.remote.reach import handshake_failure, socket_failure


@pytest.mark.parametrize(("exc", "expected"), [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
    (socket.timeout("timed out"), "unreachable: no answer within 10s"),
    (TimeoutError("timed out"), "unreachable: no answer within 10s"),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable: No route to host"),
    (socket.gaierror(-2, "Name or service not known"), "unknown host name (Name or service not known)"),
])
def test_socket_failures_name_what_happened(exc: OSError, expected: str) -> None:
    what, hint = socket_failure(exc, 10)
    assert what.startswith(expected) and hint


@pytest.mark.parametrize(("exc", "answered", "expected"), [
    (paramiko.SSHException("Error reading SSH protocol banner"), False, "no SSH server answered within 10s"),
    (paramiko.SSHException("No existing session"), False, "no SSH server answered within 10s"),
    (paramiko.SSHException("Incompatible ssh peer"), True, "SSH handshake failed: Incompatible ssh peer"),
    (EOFError(), False, "SSH handshake failed: the other end closed the connection"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), True, "unreachable: Connection reset by peer"),
])
def test_handshake_failures_name_what_happened(exc: BaseException, answered: bool, expected: str) -> None:
    what, hint = handshake_failure(exc, 10, answered)
    assert what.startswith(expected) and hint


@pytest.mark.parametrize(("budget", "ticks", "said_at"), [
    (300, [0.3, 1, 4.9], []),                      # a few seconds: silence
    (300, [0.3, 5, 6, 20, 35, 36, 64, 70], [5, 35, 70]),  # then a line, and one every 30 s
    (6, [5.5], []),                                # the window ends within a second: no promise to wait
])
def test_a_long_connect_wait_says_what_it_waits_for(
    budget: float, ticks: list[float], said_at: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    notice = reach.WaitNotice("SSH on u@h:22 (instance i-1)", budget)
    said = []
    for waited in ticks:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cloudtrain.remote.ssh"):
            notice.tick(waited, "connection refused")
        if caplog.records:
            said.append(waited)
            text = caplog.records[0].getMessage()
            assert text.startswith("waiting for SSH on u@h:22 (instance i-1): ")
            assert f"{waited:.0f}s of up to {budget:.0f}s" in text and "connection refused" in text
    assert said == said_at


def test_a_port_that_answers_at_once_but_not_as_ssh_is_named_so() -> None:
    """An HTTP server on the port (issue 35.12) answers our greeting and hangs up in a moment: that
    is not 'no SSH server answered within 10s'."""
    banner = paramiko.SSHException("Error reading SSH protocol banner")
    what, hint = handshake_failure(banner, 10.0, answered=False, elapsed=0.4)
    assert "answered within 0.4s, but not as an SSH server" in what and "SSH port" in hint
    what, _ = handshake_failure(EOFError(), 10.0, answered=False, elapsed=0.1)
    assert "not as an SSH server" in what
    # A port that stays silent until the timeout is still said as silence.
    what, _ = handshake_failure(banner, 10.0, answered=False, elapsed=10.0)
    assert what.startswith("no SSH server answered within 10s")


def test_a_real_http_server_on_the_port_is_named_so() -> None:
    """Against a real HTTP server on loopback, through the real connect."""
    import http.server
    import threading
    import time

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sock = socket.create_connection(server.server_address, timeout=5)
        transport = paramiko.Transport(sock)
        transport.banner_timeout = 5
        started = time.monotonic()
        with pytest.raises((paramiko.SSHException, EOFError)) as caught:
            transport.start_client(timeout=5)
        elapsed = time.monotonic() - started
        transport.close()
        what, _ = handshake_failure(caught.value, 5.0, answered=bool(transport.remote_version), elapsed=elapsed)
        assert "not as an SSH server" in what, what
    finally:
        server.shutdown()
        server.server_close()
