"""The watchdog and cloudtrain's own kept connection (ssh.persist_s): the node's mux holds an SSH
connection with an idle node helper on it for the next command. That runs nothing of the user's, so
it must not hold autostop off; a user's shell, or a command running through that very connection
(an `exec`'s log follow), still does.

Real sshd VMs (cloudtrain/testing/sshd.py), a real mux (connection reuse on: `no_mux_left`) and
the watchdog running here against the VM's sshd port, as on a node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.config import Config
from cloudtrain.remote import muxkeep, muxlink
from cloudtrain.remote.keys import KnownHosts
from cloudtrain.remote.ssh import SSHTransport, open_transport
from cloudtrain.testing.mux import mux_pids
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from tests.watchdog.conftest import (
    NodeDir,
    decisions,
    logged_in,
    marker_command,
    wait_busy_beyond_idle,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_mux_left")

IDLE_S = 1.0
TICK_S = 0.2


def _open(vm: SshdVM, factory: SshdFactory) -> SSHTransport:
    config = Config(ssh={"connect_timeout_s": 5, "connect_retries_s": 0, "persist_s": 60})
    return open_transport(cluster="test", instance=vm.instance(), config=config,
                          key_path=factory.client_key.private_path)


def _kept_connection(vm: SshdVM, factory: SshdFactory) -> muxlink.MuxSpec:
    """What a command leaves behind as it exits: the node's mux, logged in, its helper started ahead."""
    first = _open(vm, factory)
    assert first.run(["true"]).exit_code == 0
    spec = first.mux_spec()
    first.close()
    muxkeep.forget(spec.instance_id)  # this process's parked copy: only the mux keeps a connection
    muxkeep._forgotten.discard(spec.instance_id)  # noqa: SLF001 - only the parked copy was meant
    assert muxkeep.spawn(spec) is not None
    pin = KnownHosts(Path(spec.known_hosts)).get(spec.instance_id)
    assert muxlink.wait_for(spec, pin, 30) is not None, "the mux never served"
    return spec


def _watch(node: NodeDir, vm: SshdVM, marker: Path) -> None:
    node.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs_and_ssh"}, count_ssh=True,
               ssh_port=vm.port, action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))
    node.run()


def test_an_idle_kept_connection_does_not_hold_autostop_off(node_dir: NodeDir, sshd_vm: SshdVM,
                                                           sshd_vm_factory: SshdFactory, cloudtrain_home: Path,
                                                           tmp_path: Path) -> None:
    _kept_connection(sshd_vm, sshd_vm_factory)
    # The watchdog sees the connection and what it runs: the mux's helper, waiting.
    assert node_dir.write(count_ssh=True, ssh_port=sshd_vm.port)
    seen = node_dir.watchdog("check")
    assert (seen["ssh_sessions"], seen["ssh_kept_idle"]) == (0, 1), seen
    marker = tmp_path / "powered-off"
    _watch(node_dir, sshd_vm, marker)
    wait_until(lambda: marker.exists(), timeout=60, what="the stop, with only cloudtrain's kept connection open")
    assert mux_pids(cloudtrain_home), "the mux (and its connection) was still there when the node stopped"
    log = decisions(node_dir.log)
    assert not any(d == "busy" for d, _ in log), log
    assert any(d == "idle" and "(+1 cloudtrain's, idle: not counted)" in detail for d, detail in log), log


def test_a_users_shell_beside_the_kept_connection_still_counts(node_dir: NodeDir, sshd_vm: SshdVM,
                                                               sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    _kept_connection(sshd_vm, sshd_vm_factory)
    marker = tmp_path / "powered-off"
    with logged_in(sshd_vm, sshd_vm_factory.client_key.private_path):
        _watch(node_dir, sshd_vm, marker)
        # One session: the user's; the mux's is not counted.
        wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, "1 ssh session(s)")
        assert not marker.exists()
    wait_until(lambda: marker.exists(), timeout=60, what="the stop once the user logged out")


def test_a_command_running_through_the_kept_connection_counts(node_dir: NodeDir, sshd_vm: SshdVM,
                                                              sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    _kept_connection(sshd_vm, sshd_vm_factory)
    t = _open(sshd_vm, sshd_vm_factory)
    marker = tmp_path / "powered-off"
    try:
        assert t.reused == "mux"
        # As an `exec` following its job's log: a command the helper runs, for as long as it runs.
        done = tmp_path / "done"
        running = t.start(f"echo started; while [ ! -e {done} ]; do sleep 0.05; done", what="following")
        assert running.read(100) == b"started\n"
        _watch(node_dir, sshd_vm, marker)
        wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, "1 ssh session(s)")
        assert not marker.exists()
        done.touch()
        assert running.read_all() == b"" and running.wait() == 0
        running.close()
    finally:
        t.close()
    wait_until(lambda: marker.exists(), timeout=60, what="the stop once the command ended")
