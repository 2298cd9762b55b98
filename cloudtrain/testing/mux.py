"""Test kit: the SSH connection muxes (cloudtrain/remote/mux.py) a test started, found and stopped.

A CLI command that connected to a node leaves a mux behind for ssh.persist_s (60 s by default):
longer than a test. So in a test, connections are not kept (`ssh_persist_off`, autouse: the
CLOUDTRAIN_SSH_PERSIST_S override at 0) unless it asks with `no_mux_left`, which lets the config
decide and, after the test, ends every mux of the test's CLOUDTRAIN_HOME (`stop_muxes`: asked to
stop, killed if one does not) and waits until none is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.testing.wait import wait_until

MUX_MODULE = "cloudtrain.remote.mux"


def mux_pids(home: Path) -> list[int]:
    """Live mux processes whose CLOUDTRAIN_HOME is `home`."""
    wanted = f"CLOUDTRAIN_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if MUX_MODULE.encode() not in (entry / "cmdline").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def stop_muxes(home: Path, timeout: float = 15.0) -> list[int]:
    """Stop every mux of `home`; returns the pids that had to be killed (ignored a stop request)."""
    from cloudtrain.remote import muxlink

    directory = home / "mux"
    for sock in directory.glob("*.sock") if directory.is_dir() else []:
        conn = muxlink.connect(sock, 5.0)
        if conn is None:
            continue
        # One that goes away while asked is fine: the wait below checks that none is left.
        with contextlib.suppress(OSError, EOFError, ValueError):
            muxlink.ask(conn, "stop")
        conn.close()
    try:
        wait_until(lambda: not mux_pids(home), timeout=timeout, what="the test's SSH muxes to exit")
        return []
    except AssertionError:
        killed = mux_pids(home)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not mux_pids(home), timeout=timeout, what="killed SSH muxes to be gone")
        return killed


@pytest.fixture(autouse=True)
def ssh_persist_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test: a command closes its SSH connections when done (CLOUDTRAIN_SSH_PERSIST_S=0), so no
    mux outlives a test; `no_mux_left` turns reuse back on for a test about it."""
    from cloudtrain.remote.ssh import PERSIST_ENV

    monkeypatch.setenv(PERSIST_ENV, "0")


@pytest.fixture
def no_mux_left(cloudtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Connections are kept as the config says (ssh.persist_s); after the test, no mux of its
    CLOUDTRAIN_HOME is left. Yields that home."""
    from cloudtrain.remote.ssh import PERSIST_ENV

    monkeypatch.delenv(PERSIST_ENV, raising=False)
    yield cloudtrain_home
    killed = stop_muxes(cloudtrain_home)
    assert not killed, f"mux process(es) {killed} ignored a stop request and were killed"
