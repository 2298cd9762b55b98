"""SSHTransport against real sshd VMs: commands, files, trees, pins, routing, failures, reconnects."""

from __future__ import annotations

import json
import shlex
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.errors import RemoteCommandError, RemoteError
from cloudtrain.remote import jobs
from cloudtrain.remote.keys import Endpoint, HostKeyMismatchError, KnownHosts, generate_ed25519
from cloudtrain.remote.ssh import SSHAuthError, SSHConnectError, SSHTransport, open_transport
from cloudtrain.remote.transport import Transport
from cloudtrain.testing.sshd import SshdFactory, SshdVM, free_port
from tests.remote.conftest import fast_config


def test_is_a_transport(transport: SSHTransport, sshd_vm: SshdVM) -> None:
    assert isinstance(transport, Transport)
    assert transport.label == f"{sshd_vm.user}@127.0.0.1:{sshd_vm.port}"
    assert transport.home == sshd_vm.home


def test_run_output_exit_codes_and_stdin(transport: SSHTransport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    with pytest.raises(RemoteCommandError) as caught:
        transport.run(["sh", "-c", "echo boom >&2; exit 7"])
    assert caught.value.returncode == 7 and "boom" in caught.value.one_line()

    assert transport.run(["cat"], input=b"hello\x00world").stdout == b"hello\x00world"
    # Large both ways at once: stdin is fed while stdout is drained, so neither side stalls.
    blob = bytes(range(256)) * 40_000
    assert transport.run(["cat"], input=blob).stdout == blob
    assert transport.run(["sh", "-c", "cat >/dev/null; echo done"], input=blob).text == "done\n"
    # A command that ignores its input still finishes.
    assert transport.run(["true"], input=blob).exit_code == 0


def test_run_timeout(transport: SSHTransport) -> None:
    # The command would sleep 60 s: the error (not a fixed bound on elapsed time) shows it was cut.
    with pytest.raises(RemoteError, match="timed out after 0.5s"):
        transport.run(["sleep", "60"], timeout=0.5)
    assert transport.run(["echo", "still usable"]).text == "still usable\n"


def test_one_connection_serves_every_command(transport: SSHTransport) -> None:
    for _ in range(5):
        transport.run(["true"])
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(transport.run(["echo", str(i)]).text)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [f"{i}\n" for i in range(4)]
    assert transport.connects == 1


def test_put_file_is_atomic_with_mode(transport: SSHTransport, sshd_vm: SshdVM) -> None:
    target = f"{transport.home}/deep/new dir/env.sh"
    transport.put_file(b"export A=1\n", target, mode=0o600)
    local = Path(sshd_vm.home) / "deep" / "new dir" / "env.sh"
    assert local.read_bytes() == b"export A=1\n"
    assert stat.S_IMODE(local.stat().st_mode) == 0o600
    transport.put_file(b"#!/bin/sh\n", target, mode=0o755)
    assert stat.S_IMODE(local.stat().st_mode) == 0o755
    assert sorted(p.name for p in local.parent.iterdir()) == ["env.sh"]  # no temp files left


def test_put_tree_and_get_tree_round_trip(transport: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 100)
    (src / "notes.log").write_text("ignored\n")
    stats = transport.put_tree(src, f"{transport.home}/w", ignore=lambda rel: rel.endswith(".log"))
    assert (stats.files_total, stats.files_sent) == (2, 2)
    transport.run(["sh", "-c", "mkdir -p w/outputs && echo 0.99 > w/outputs/acc.txt && ln -s acc.txt w/outputs/latest"])

    got = transport.get_tree(f"{transport.home}/w", ["outputs", "pkg", "missing"], tmp_path / "back")
    assert "outputs/acc.txt" in got.names and "pkg/data.bin" in got.names
    assert got.sizes["pkg/data.bin"] == 25600 and not got.refused
    assert (tmp_path / "back" / "outputs" / "latest").read_text() == "0.99\n"
    assert (tmp_path / "back" / "pkg" / "data.bin").read_bytes() == (src / "pkg" / "data.bin").read_bytes()
    assert transport.get_tree(f"{transport.home}/w", ["nothing-here"], tmp_path / "back2").names == ()


def test_get_tree_refuses_a_hostile_member_and_keeps_the_rest(transport: SSHTransport, tmp_path: Path) -> None:
    transport.run(["sh", "-c", "mkdir -p w/out && ln -s /etc w/out/escape && echo 1 > w/out/good.txt"])
    got = transport.get_tree(f"{transport.home}/w", ["out"], tmp_path / "back")
    assert [r.member for r in got.refused] == ["out/escape"] and "points outside" in got.refused[0].reason
    assert not (tmp_path / "back" / "out" / "escape").exists()
    assert (tmp_path / "back" / "out" / "good.txt").read_text() == "1\n"


def test_changed_host_key_for_same_instance_is_refused(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    key = sshd_vm_factory.client_key.private_path
    instance = sshd_vm.instance("i-0abc")
    open_transport(cluster="c", instance=instance, config=fast_config(), key_path=key).close()
    old = sshd_vm.host_key_fingerprint
    sshd_vm.restart(new_host_key=True)

    with pytest.raises(HostKeyMismatchError) as caught:
        open_transport(cluster="c", instance=instance, config=fast_config(connect_retries_s=5), key_path=key)
    message = caught.value.one_line()
    assert "i-0abc" in message and old in message and sshd_vm.host_key_fingerprint in message

    # A different instance at the same address (the cloud reused the IP) is a new machine: accepted.
    open_transport(cluster="c", instance=sshd_vm.instance("i-0new"), config=fast_config(), key_path=key).close()
    # After the instance is forgotten (terminated), its id may be learned again.
    KnownHosts().forget("i-0abc")
    open_transport(cluster="c", instance=instance, config=fast_config(), key_path=key).close()


def test_fake_public_address_is_routed_through_proxy_command(
    sshd_vm_factory: SshdFactory, tmp_path: Path
) -> None:
    vms = [sshd_vm_factory.start(address="54.10.0.1"), sshd_vm_factory.start(address="54.10.0.2")]
    config = fast_config(proxy_command=sshd_vm_factory.proxy_command)
    key = sshd_vm_factory.client_key.private_path
    for vm, address in zip(vms, ["54.10.0.1", "54.10.0.2"]):
        with open_transport(cluster="c", instance=vm.instance(f"i-{address}", address=address),
                            config=config, key_path=key) as t:
            assert t.label == f"{vm.user}@{address}"
            assert t.home == vm.home
    assert {p.instance_id for p in KnownHosts().pins()} == {"i-54.10.0.1", "i-54.10.0.2"}


@pytest.mark.parametrize(("address", "user"), [
    ("54.10.0.9;touch {m}", "ubuntu"),
    ("54.10.0.9", "$(touch {m})"),
    ("54.10.0.9", "`touch {m}`"),
    ("54.10.0.9 && touch {m}", "it's \"quoted\" $HOME"),
])
def test_proxy_command_tokens_are_data_not_shell(address: str, user: str, tmp_path: Path) -> None:
    """%h/%r reach the ProxyCommand as single words, even for an endpoint nobody validated."""
    marker = tmp_path / "pwned"
    address, user = address.format(m=marker), user.format(m=marker)
    seen = tmp_path / "argv.json"
    code = "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    # cd first: if the expansion ever broke out, its side effects stay in tmp_path.
    proxy = (f"cd {shlex.quote(str(tmp_path))} && {shlex.quote(sys.executable)} -c {shlex.quote(code)} "
             f"{shlex.quote(str(seen))} %h %p %r %% %%h")
    endpoint = Endpoint("i-hostile", address, 22, user, None, proxy)
    transport = SSHTransport(endpoint, cluster="c", known_hosts=KnownHosts(), connect_timeout=5)
    with pytest.raises(SSHConnectError):
        transport.connect()  # the "proxy" records its argv and exits: no SSH server behind it
    assert json.loads(seen.read_text()) == [address, "22", user, "%", "%h"]
    assert not marker.exists()


def test_unreachable_node_fails_with_address_and_hint(sshd_vm_factory: SshdFactory) -> None:
    from cloudtrain.providers.base import Instance, InstanceState

    port = free_port()
    instance = Instance(id="i-dead", cluster="c", state=InstanceState.RUNNING, public_ip="127.0.0.1", ssh_port=port)
    with pytest.raises(SSHConnectError) as caught:
        open_transport(cluster="c", instance=instance, config=fast_config(connect_retries_s=1),
                       key_path=sshd_vm_factory.client_key.private_path)
    assert f"127.0.0.1:{port}" in caught.value.message and "i-dead" in caught.value.message
    assert caught.value.hint


def test_proxy_failure_is_reported_with_its_stderr(sshd_vm_factory: SshdFactory) -> None:
    from cloudtrain.providers.base import Instance, InstanceState

    instance = Instance(id="i-x", cluster="c", state=InstanceState.RUNNING, public_ip="54.99.0.1")
    config = fast_config(proxy_command=sshd_vm_factory.proxy_command)  # nothing routed for 54.99.0.1
    with pytest.raises(SSHConnectError) as caught:
        open_transport(cluster="c", instance=instance, config=config, key_path=sshd_vm_factory.client_key.private_path)
    assert "no route for 54.99.0.1" in (caught.value.hint or "")


def test_connect_waits_for_a_booting_machine(sshd_vm_factory: SshdFactory) -> None:
    vm = sshd_vm_factory.start()
    vm.stop()
    timer = threading.Timer(1.0, vm.start)
    timer.start()
    try:
        with open_transport(cluster="c", instance=vm.instance(), config=fast_config(connect_retries_s=20),
                            key_path=sshd_vm_factory.client_key.private_path) as t:
            assert t.run(["echo", "up"]).text == "up\n"
    finally:
        timer.join()


def test_wrong_key_is_an_auth_error(sshd_vm: SshdVM, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    generate_ed25519(stranger, "stranger")
    with pytest.raises(SSHAuthError) as caught:
        open_transport(cluster="c", instance=sshd_vm.instance(), config=fast_config(), key_path=stranger)
    assert str(stranger) in caught.value.message and "authorized_keys" in (caught.value.hint or "")


def test_reconnects_transparently_between_calls(transport: SSHTransport, sshd_vm: SshdVM) -> None:
    assert transport.run(["echo", "1"]).text == "1\n"
    sshd_vm.restart()  # drops every session, same host key: like a reboot
    assert transport.run(["echo", "2"]).text == "2\n"
    assert transport.connects == 2


SHELL_HOSTILE = "it's a \"test\" $(touch pwned) `touch pwned2`; rm -rf / && echo $HOME * \\ end"


def test_hostile_strings_reach_the_node_intact(transport: SSHTransport, sshd_vm: SshdVM) -> None:
    """Paths, file contents, argv and job env values are data, never shell, all the way down."""
    weird_dir = f"{transport.home}/dir with spaces/it's $(x);"
    path = f"{weird_dir}/file \"q\" $(touch pwned);.txt"
    transport.put_file(SHELL_HOSTILE.encode(), path)
    assert transport.run(["cat", path]).text == SHELL_HOSTILE
    assert transport.run(["printf", "%s", SHELL_HOSTILE]).text == SHELL_HOSTILE
    assert transport.run(["ls", weird_dir]).text.strip() == "file \"q\" $(touch pwned);.txt"

    layout = jobs.NodeLayout.for_cluster(transport, "c")
    jobs.install_runtime(transport, layout)
    transport.run(["mkdir", "-p", layout.workdir])
    job_id = "job 1; $(touch pwned)"
    jobs.submit(transport, layout, job_id, 'printf "%s" "$WEIRD" > "$OUT"',
                {"WEIRD": SHELL_HOSTILE, "OUT": f"{weird_dir}/out"})
    deadline = time.monotonic() + 20
    while not jobs.status(transport, layout, job_id).finished:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert jobs.status(transport, layout, job_id).state == "succeeded"
    assert transport.run(["cat", f"{weird_dir}/out"]).text == SHELL_HOSTILE
    leftovers = transport.run(["sh", "-c", 'find "$HOME" -name "pwned*"']).text
    assert leftovers == ""
    assert not list(Path(sshd_vm.home).rglob("pwned*"))


@pytest.mark.parametrize(("made_by_cloudtrain", "hint_part"), [
    (True, "taken down"),
    (False, "fix `key:` in the recipe's hosts"),
])
def test_a_missing_key_says_whose_it_was(tmp_path: Path, made_by_cloudtrain: bool, hint_part: str) -> None:
    """A key cloudtrain made for a cluster goes with `down` (another terminal's, or a recovering run's
    teardown of a lost node): a command still reaching that cluster is told so, not to fix the
    recipe's `key:`, which the user never set."""
    from cloudtrain import paths

    path = paths.home_path() / "keys" / "gone" / "id_ed25519" if made_by_cloudtrain else tmp_path / "my_key"
    assert made_by_cloudtrain == path.is_relative_to(paths.home_path())
    endpoint = Endpoint("i-gone", "127.0.0.1", 22, "u", path, None)
    transport = SSHTransport(endpoint, cluster="gone", known_hosts=KnownHosts(), connect_timeout=1)
    with pytest.raises(SSHAuthError) as caught:
        transport.connect()
    assert str(path) in caught.value.message and hint_part in caught.value.one_line()


def test_give_up_ends_a_reconnect_loop_that_holds_the_transport(sshd_vm_factory: SshdFactory) -> None:
    """The node is gone (the cloud said so): a command inside a reconnect loop ends with that, not
    after the loop's whole budget, and later commands fail at once (run/recover_watch.py)."""
    from cloudtrain.testing.wait import wait_until

    vm = sshd_vm_factory.start()
    t = open_transport(cluster="c", instance=vm.instance(), config=fast_config(connect_retries_s=600),
                       key_path=sshd_vm_factory.client_key.private_path)
    outcome: list[BaseException | str] = []

    def command() -> None:
        try:
            outcome.append(t.run(["echo", "up"]).text)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    try:
        assert t.run(["true"]).exit_code == 0
        vm.stop()
        wait_until(lambda: not t.connected, timeout=30, what="the client to see sshd gone")
        worker = threading.Thread(target=command)
        worker.start()

        def loop_holds_the_lock() -> bool:
            free = t._lock.acquire(blocking=False)  # noqa: SLF001 - the reconnect loop holds it
            if free:
                t._lock.release()  # noqa: SLF001
            return not free

        wait_until(loop_holds_the_lock, timeout=30, what="the command's reconnect loop")
        t.give_up()
        worker.join(timeout=60)
        assert not worker.is_alive()
        (error,) = outcome
        assert isinstance(error, SSHConnectError) and "the cloud says the machine is gone" in error.message
        with pytest.raises(SSHConnectError, match="gave up"):
            t.run(["true"])
    finally:
        t.close()
