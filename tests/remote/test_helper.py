"""The node helper (remote/helper.py, templates/sync_helper.py serve) against a real sshd VM:
what it leaves behind, how it checks the home it was told, how a node without it is still served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.remote import homecache
from cloudtrain.remote.helper import HomeMoved
from cloudtrain.remote.ssh import SSHTransport, open_transport
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.wait import wait_until
from tests.remote.conftest import fast_config


def _connect(vm: SshdVM, factory: SshdFactory) -> SSHTransport:
    return open_transport(cluster="t", instance=vm.instance(), config=fast_config(),
                          key_path=factory.client_key.private_path)


def _processes_of(vm: SshdVM, needle: bytes) -> list[int]:
    """Processes on this machine started for the VM (its HOME) whose command line holds `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"HOME={vm.home}".encode() in environ and needle in cmdline:
            found.append(int(entry.name))
    return found


def test_the_helper_is_gone_with_its_connection_and_a_cut_input_is_never_acted_on(
        sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    transport = _connect(sshd_vm, sshd_vm_factory)
    transport.run(["true"])
    assert _processes_of(sshd_vm, b"serve"), "the helper runs while the transport is open"
    # A command whose input is still coming when the CLI goes: killed, so it never acts on half of it.
    reader, writer = os.pipe()
    os.write(writer, b"half of it\n")
    transport.start('cat > "$HOME/partial" && touch "$HOME/published"', input=os.fdopen(reader, "rb"))
    wait_until(lambda: (Path(sshd_vm.home) / "partial").exists(), 30, "the command to start reading")
    transport.close()
    os.close(writer)
    wait_until(lambda: not _processes_of(sshd_vm, b"serve") and not _processes_of(sshd_vm, b"partial"), 30,
               "the helper and the cut command to end")
    assert not (Path(sshd_vm.home) / "published").exists()


def test_a_log_follow_stops_when_the_helper_goes(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    from cloudtrain.remote import jobs

    transport = _connect(sshd_vm, sshd_vm_factory)
    layout = jobs.NodeLayout.for_cluster(transport, "c")
    jobs.install_runtime(transport, layout)
    transport.run(["mkdir", "-p", layout.workdir])
    jobs.submit(transport, layout, "long", "sleep 300", {})
    following = jobs.follow_log(transport, layout, "long", 0)
    wait_until(lambda: _processes_of(sshd_vm, b"follow"), 30, "the follow to run")
    transport.close()
    wait_until(lambda: not _processes_of(sshd_vm, b"follow") and not _processes_of(sshd_vm, b"serve"), 30,
               "the follow and the helper to end")
    del following
    again = _connect(sshd_vm, sshd_vm_factory)
    try:
        assert jobs.status(again, layout, "long").state == "running"  # the job itself is not the helper's
        jobs.kill(again, layout, "long", grace_s=1)
    finally:
        again.close()


@pytest.mark.parametrize("remembered", ["/elsewhere/home", "/tmp"])
def test_a_wrong_remembered_home_runs_nothing_and_is_corrected(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory,
                                                               remembered: str) -> None:
    instance = sshd_vm.instance()
    homecache.put(instance.id, sshd_vm.user, remembered)
    transport = _connect(sshd_vm, sshd_vm_factory)
    try:
        assert transport.home == remembered  # assumed: the request goes with the helper's start
        marker = f"{transport.home}/ct-should-not-exist"
        with pytest.raises(HomeMoved) as caught:
            transport.run(["mkdir", "-p", marker])
        assert sshd_vm.home in caught.value.message and "run the command again" in (caught.value.hint or "")
        assert not os.path.exists(marker)
    finally:
        transport.close()
    assert homecache.get(instance.id, sshd_vm.user) == sshd_vm.home
    again = _connect(sshd_vm, sshd_vm_factory)
    try:
        assert again.home == sshd_vm.home
        assert again.run(["sh", "-c", 'printf %s "$HOME"']).text == sshd_vm.home
    finally:
        again.close()


def test_a_node_that_cannot_start_the_helper_is_served_one_channel_per_command(
        sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    # The VM's bin/ comes first on its PATH: a python3 that is not there (exit 127), as on a minimal image.
    fake = sshd_vm.bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho 'python3: not found' >&2\nexit 127\n")
    fake.chmod(0o755)
    transport = _connect(sshd_vm, sshd_vm_factory)
    try:
        assert transport.home == sshd_vm.home
        assert transport.run(["echo", "still served"]).text == "still served\n"
        assert transport.run(["sh", "-c", "exit 3"], check=False).exit_code == 3
        assert transport.round_trips.sessions >= 3  # the failed helper, then a channel per command
    finally:
        transport.close()
        fake.unlink()
