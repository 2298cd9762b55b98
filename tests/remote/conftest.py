"""Shared fixtures for transport tests: a fast-failing config and a transport to one sshd VM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cloudtrain.config import Config
from cloudtrain.remote.ssh import SSHTransport, open_transport
from cloudtrain.testing.mux import no_mux_left  # noqa: F401 - a fixture
from cloudtrain.testing.sshd import SshdFactory, SshdVM


def fast_config(**ssh: object) -> Config:
    # persist_s 0: a transport closes its connection (tests/remote/test_mux.py turns reuse on).
    return Config(ssh={"connect_timeout_s": 5, "connect_retries_s": 0, "persist_s": 0, **ssh})


@pytest.fixture
def transport(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> Iterator[SSHTransport]:
    t = open_transport(
        cluster="test", instance=sshd_vm.instance(), config=fast_config(),
        key_path=sshd_vm_factory.client_key.private_path,
    )
    yield t
    t.close()
