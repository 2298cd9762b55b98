"""Connection reuse across commands (remote/muxlink.py, remote/mux.py), against a real sshd.

Each test starts its mux the way a command's exit does (muxkeep.spawn) and the `no_mux_left`
fixture ends whatever is left: no mux outlives its test.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from cloudtrain.remote import muxkeep, muxlink
from cloudtrain.remote.channel import ConnectionLostError
from cloudtrain.remote.keys import KnownHosts
from cloudtrain.remote.ssh import SSHTransport, open_transport
from cloudtrain.testing.mux import mux_pids
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.wait import wait_until
from tests.remote.conftest import fast_config

pytestmark = pytest.mark.usefixtures("no_mux_left")


def _open(vm: SshdVM, factory: SshdFactory, persist_s: float = 30.0) -> SSHTransport:
    return open_transport(cluster="test", instance=vm.instance(), config=fast_config(persist_s=persist_s),
                          key_path=factory.client_key.private_path)


def _started_mux(vm: SshdVM, factory: SshdFactory, persist_s: float = 30.0) -> tuple[muxlink.MuxSpec, subprocess.Popen]:
    """A first command connected (pinning the host key) and exited: its mux, serving."""
    first = _open(vm, factory, persist_s)
    assert first.run(["true"]).exit_code == 0
    spec = first.mux_spec()
    first.close()
    muxkeep.forget(spec.instance_id)  # this process's parked copy: the next transport must use the mux
    muxkeep._forgotten.discard(spec.instance_id)  # noqa: SLF001 - only the parked copy was meant
    proc = muxkeep.spawn(spec)
    assert proc is not None
    assert muxlink.wait_for(spec, KnownHosts(Path(spec.known_hosts)).get(spec.instance_id), 30) is not None, "the mux never served"
    return spec, proc


def test_a_command_through_the_mux_costs_one_round_trip_and_no_handshake(sshd_vm: SshdVM,
                                                                         sshd_vm_factory: SshdFactory) -> None:
    _started_mux(sshd_vm, sshd_vm_factory)
    t = _open(sshd_vm, sshd_vm_factory)
    try:
        assert t.reused == "mux" and t.connects == 0
        assert t.run(["sh", "-c", "echo $((6 * 7))"]).text.strip() == "42"
        assert t.round_trips.round_trips == 1, t.round_trips.turns
        assert t.round_trips.sessions == 0  # the mux's helper was opened ahead, before this command
        assert t.home == sshd_vm.home
        # A file stream (tar through the helper) and a streamed command work through it unchanged.
        t.put_file(b"payload", f"{sshd_vm.home}/f.txt", 0o600)
        assert b"".join(t.stream(["cat", f"{sshd_vm.home}/f.txt"])) == b"payload"
    finally:
        t.close()
    assert t.connects == 0


def test_socket_is_0600_in_a_0700_directory(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory,
                                            cloudtrain_home: Path) -> None:
    _started_mux(sshd_vm, sshd_vm_factory)
    directory = cloudtrain_home / "mux"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    socks = list(directory.glob("*.sock"))
    assert len(socks) == 1 and stat.S_ISSOCK(socks[0].stat().st_mode)
    assert stat.S_IMODE(socks[0].stat().st_mode) == 0o600


def test_a_stale_socket_is_removed_and_the_command_connects_itself(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory,
                                                                   cloudtrain_home: Path) -> None:
    spec, proc = _started_mux(sshd_vm, sshd_vm_factory)
    path = next((cloudtrain_home / "mux").glob("*.sock"))
    proc.kill()  # as after a crash: the socket stays, nobody listens
    proc.wait(timeout=10)
    assert path.exists()
    t = _open(sshd_vm, sshd_vm_factory)
    try:
        assert t.run(["true"]).exit_code == 0
        assert t.connects == 1
    finally:
        t.close()
    assert not path.exists()


def test_an_idle_mux_exits_and_leaves_no_process(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory,
                                                 cloudtrain_home: Path) -> None:
    _, proc = _started_mux(sshd_vm, sshd_vm_factory, persist_s=1.0)
    assert proc.wait(timeout=30) == 0  # a second without a client, then it closes and exits
    assert not mux_pids(cloudtrain_home)
    assert not list((cloudtrain_home / "mux").glob("*.sock"))


def test_down_stops_the_mux_at_once(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    spec, proc = _started_mux(sshd_vm, sshd_vm_factory)
    # `down` forgets the node's pinned host key, then stops its muxes (cluster/lifecycle.py).
    KnownHosts(Path(spec.known_hosts)).forget(spec.instance_id)
    muxkeep.stop(spec.instance_id)
    assert proc.wait(timeout=10) == 0


def test_a_changed_host_key_pin_ends_the_mux(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    spec, proc = _started_mux(sshd_vm, sshd_vm_factory)
    known = KnownHosts(Path(spec.known_hosts))
    pin = known.get(spec.instance_id)
    assert pin is not None
    raw = known._read()  # noqa: SLF001 - as if re-pinned by hand to another key
    raw[spec.instance_id]["key_base64"] = raw[spec.instance_id]["key_base64"][:-8] + "AAAAAAAA"
    known._write(raw)  # noqa: SLF001
    assert proc.wait(timeout=10) == 0


def test_killing_the_mux_mid_command_says_so_in_one_line_and_the_next_command_reconnects(
        sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    _, proc = _started_mux(sshd_vm, sshd_vm_factory)
    t = _open(sshd_vm, sshd_vm_factory)
    try:
        running = t.start("echo started; sleep 30")
        assert running.read(100) == b"started\n"
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(ConnectionLostError) as lost:
            running.read_all()
            running.wait()
        running.close()
        assert "\n" not in str(lost.value.message) and "connection lost" in lost.value.message
        assert t.run(["echo", "again"]).text == "again\n"
        assert t.connects == 1
    finally:
        t.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_users_process_is_refused(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory,
                                          cloudtrain_home: Path) -> None:
    _started_mux(sshd_vm, sshd_vm_factory)
    directory = cloudtrain_home / "mux"
    path = next(directory.glob("*.sock"))
    # Defence in depth: as if the directory and socket modes were loosened, another uid reaches it.
    opened = [p for p in (cloudtrain_home, *cloudtrain_home.parents) if p != Path("/")]
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (*opened, directory, path)}
    try:
        for p in opened + [directory]:
            p.chmod(modes[p] | 0o711)
        path.chmod(0o666)
        child = textwrap.dedent(f"""
            import os, socket
            os.chdir({str(directory)!r})
            s = socket.socket(socket.AF_UNIX)
            s.connect({path.name!r})
            s.settimeout(10)
            try:
                s.sendall(b'{{"op": "helper"}}\\n')
                print(repr(s.recv(100)))
            except (BrokenPipeError, ConnectionResetError):
                print("closed")
        """)
        out = subprocess.run(["/usr/bin/python3", "-c", child], user=65534, capture_output=True, text=True, timeout=30)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("b''", "closed"), out.stdout  # closed without a word
