"""A host that does not answer: the user's own machine fails on the first attempt with what went
wrong; a booting VM is waited for, and a long wait says what it waits for. Loopback only: a
listener that accepts and never speaks, and a closed port."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cloudtrain.providers.base import HostSpec, Instance, InstanceState
from cloudtrain.remote import reach
from cloudtrain.remote.ssh import SSHConnectError, open_transport
from cloudtrain.testing.sshd import free_port
from tests.remote.conftest import fast_config

pytestmark = pytest.mark.quick


class SilentListener:
    """Accepts TCP connections and never says a word (a mistyped port on some other service)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        # close() alone does not wake a thread blocked in accept() on Linux; shutdown does.
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentListener]:
    listener = SilentListener()
    yield listener
    listener.close()


def _host_instance(port: int) -> tuple[Instance, HostSpec]:
    # Launched just now, as the ssh provider does: "fresh" must not mean "booting" for a host.
    instance = Instance(id="ssh-lab-0-127.0.0.1", cluster="lab", state=InstanceState.RUNNING,
                        public_ip="127.0.0.1", ssh_port=port, launched_at=time.time())
    return instance, HostSpec(address="127.0.0.1", port=port)


@pytest.mark.parametrize("case", ["silent", "closed"])
def test_an_existing_host_that_does_not_answer_fails_on_the_first_attempt(
    case: str, silent: SilentListener
) -> None:
    port = silent.port if case == "silent" else free_port()
    instance, host = _host_instance(port)
    # The retry window is for booting VMs; a user's host gets one attempt whatever it says.
    config = fast_config(connect_timeout_s=1, connect_retries_s=300)
    with pytest.raises(SSHConnectError) as caught:
        open_transport(cluster="lab", instance=instance, config=config, host=host)
    message = caught.value.message
    assert "attempt(s)" not in message, message
    assert f"127.0.0.1:{port}" in message
    expected = {"silent": "no SSH server answered within 1s", "closed": "connection refused"}[case]
    assert expected in message, message
    assert caught.value.hint
    if case == "silent":
        assert len(silent.accepted) == 1


def test_a_booting_vm_is_still_retried(silent: SilentListener) -> None:
    """Without `host` (a machine we created, launched just now) a failure is retried: more than
    one connection reaches the listener before the window closes."""
    instance = Instance(id="i-boot", cluster="c", state=InstanceState.RUNNING, public_ip="127.0.0.1",
                        ssh_port=silent.port, launched_at=time.time())
    config = fast_config(connect_timeout_s=0.5, connect_retries_s=2)
    with pytest.raises(SSHConnectError, match=r"attempt\(s\)"):
        open_transport(cluster="c", instance=instance, config=config)
    assert len(silent.accepted) >= 2


def test_one_silent_attempt_says_what_it_waits_for(silent: SilentListener, caplog: pytest.LogCaptureFixture) -> None:
    """A host that accepts and never speaks holds one attempt for connect_timeout_s: past
    _WAIT_NOTICE_S a line says what is awaited and when it gives up."""
    instance, host = _host_instance(silent.port)
    config = fast_config(connect_timeout_s=reach.WAIT_NOTICE_S + 1, connect_retries_s=300)
    with caplog.at_level(logging.WARNING, logger="cloudtrain.remote.ssh"), pytest.raises(SSHConnectError):
        open_transport(cluster="lab", instance=instance, config=config, host=host)
    (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for SSH on ")]
    assert f"127.0.0.1:{silent.port}" in said and "this attempt gives up after" in said
