"""The test kit itself: sshd VMs behave like separate machines; routing and the flaky proxy work."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.config import Config
from cloudtrain.remote import jobs
from cloudtrain.remote.ssh import open_transport
from cloudtrain.testing.route import Refused, admits, resolve
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.tcpproxy import TcpProxy

CONFIG = Config(ssh={"connect_retries_s": 0})


def _ssh(vm: SshdVM, factory: SshdFactory, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(factory.client_key.private_path), "-p", str(vm.port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{vm.user}@127.0.0.1", command],
        capture_output=True, text=True, timeout=30,
    )


def test_each_vm_has_its_own_home_cwd_and_path(sshd_vm_factory: SshdFactory) -> None:
    a, b = sshd_vm_factory.start_many(2)
    assert a.port != b.port and a.home != b.home
    for vm in (a, b):
        result = _ssh(vm, sshd_vm_factory, 'echo "$HOME"; pwd; echo ~; command -v python3')
        assert result.returncode == 0, result.stderr
        home, cwd, tilde, python = result.stdout.split()
        assert home == cwd == tilde == vm.home
        assert Path(python).parent == Path(sys.executable).parent  # the tests' interpreter, with TF
    assert _ssh(a, sshd_vm_factory, "exit 5").returncode == 5


def test_rsync_and_scp_work_through_the_forced_command(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hi")
    options = ["-i", str(sshd_vm_factory.client_key.private_path), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    ssh = " ".join(["ssh", "-p", str(sshd_vm.port), *options])
    result = subprocess.run(["rsync", "-a", "-e", ssh, f"{tmp_path}/f.txt", f"{sshd_vm.user}@127.0.0.1:copied.txt"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert (Path(sshd_vm.home) / "copied.txt").read_text() == "hi"
    # scp speaks SFTP since OpenSSH 9: the subsystem goes through the forced command too.
    result = subprocess.run(["scp", "-P", str(sshd_vm.port), *options, f"{tmp_path}/f.txt",
                             f"{sshd_vm.user}@127.0.0.1:scp.txt"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert (Path(sshd_vm.home) / "scp.txt").read_text() == "hi"


def test_stop_is_a_power_off_and_start_a_boot(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory) -> None:
    t = open_transport(cluster="c", instance=sshd_vm.instance(), config=CONFIG,
                       key_path=sshd_vm_factory.client_key.private_path)
    layout = jobs.NodeLayout.for_cluster(t, "c")
    jobs.install_runtime(t, layout)
    t.run(["mkdir", "-p", layout.workdir])
    jobs.submit(t, layout, "sleeper", "sleep 300", {})
    assert jobs.status(t, layout, "sleeper").state == "running"
    old_key = sshd_vm.host_key_fingerprint
    sshd_vm.stop()
    assert not sshd_vm.running
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", sshd_vm.port)) != 0
    sshd_vm.start()
    assert sshd_vm.host_key_fingerprint == old_key
    assert jobs.status(t, layout, "sleeper").state == "lost"  # the job died with the machine
    t.close()
    sshd_vm.restart(new_host_key=True)
    assert sshd_vm.host_key_fingerprint != old_key


def test_route_map_static_and_pool(tmp_path: Path) -> None:
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"routes": {"54.0.0.1": 1001, "54.0.0.9:2222": 1009}, "pool": [1001, 1002, 1003]}))
    assert resolve("54.0.0.1", 22, routes) == 1001
    assert resolve("54.0.0.9", 2222, routes) == 1009
    assert resolve("54.7.7.7", 22, routes) == 1002  # 1001 is taken by a static route
    assert resolve("54.8.8.8", 22, routes) == 1003
    assert resolve("54.7.7.7", 22, routes) == 1002  # sticky
    try:
        resolve("54.9.9.9", 22, routes)
    except LookupError as exc:
        assert "no free VM" in str(exc)
    else:
        raise AssertionError("pool exhaustion must fail")


def test_pool_routes_unknown_cloud_addresses_to_vms(sshd_vm_factory: SshdFactory) -> None:
    vms = [sshd_vm_factory.start(pool=True) for _ in range(2)]
    config = Config(ssh={"connect_retries_s": 0, "proxy_command": sshd_vm_factory.proxy_command})
    homes = set()
    for address in ("54.33.0.1", "54.33.0.2"):
        with open_transport(cluster="c", instance=vms[0].instance(f"i-{address}", address=address),
                            config=config, key_path=sshd_vm_factory.client_key.private_path) as t:
            homes.add(t.home)
    assert homes == {vm.home for vm in vms}


def test_tcp_proxy_relays_and_cuts() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    proxy = TcpProxy(server.getsockname()[1])
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        peer, _ = server.accept()
        client.sendall(b"ping")
        assert peer.recv(4) == b"ping"
        proxy.cut_after(10)
        peer.sendall(b"x" * 100)
        client.settimeout(5)
        received = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                chunk = client.recv(1000)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        assert len(received) < 104 and proxy.cuts == 1
        client2 = socket.create_connection(("127.0.0.1", proxy.port))  # disarmed after one cut
        peer2, _ = server.accept()
        client2.sendall(b"y" * 100)
        assert len(peer2.recv(1000)) > 0
        assert proxy.cut_all() == 1
    finally:
        proxy.close()
        server.close()


RULES = [  # GCP's default network plus cloudtrain's rules for its tag, in the route map's format
    {"name": "default-allow-ssh", "priority": 65534, "action": "allow", "sources": ["0.0.0.0/0"], "ports": ["22"]},
    {"name": "ours-ssh", "priority": 1000, "action": "allow", "sources": ["203.0.113.7/32"], "ports": ["22"]},
    {"name": "ours-deny", "priority": 1100, "action": "deny", "sources": ["0.0.0.0/0"], "ports": []},
]
ADMITS = [  # (rules, source, port, the rule that admits or None)
    (RULES, "203.0.113.7", 22, "ours-ssh"),
    (RULES, "198.51.100.1", 22, None),
    (RULES[:1], "198.51.100.1", 22, "default-allow-ssh"),  # without the deny: open to all
    (RULES, "203.0.113.7", 2222, None),
    ([], "203.0.113.7", 22, None),  # nothing matches: the implied deny / DenyAllInBound
    ([{"name": "same", "priority": 100, "action": "allow", "sources": ["0.0.0.0/0"], "ports": ["20-30"]},
      {"name": "deny-wins", "priority": 100, "action": "deny", "sources": ["0.0.0.0/0"], "ports": ["22"]}],
     "203.0.113.7", 22, None),  # one priority: deny first
]


@pytest.mark.parametrize("rules,source,port,rule", ADMITS)
def test_network_rules_are_evaluated_as_clouds_do(rules: list, source: str, port: int, rule: str | None) -> None:
    found = admits(rules, source, port)
    assert (found or {}).get("name") == rule


def test_a_route_with_rules_refuses_a_source_they_do_not_admit(tmp_path: Path) -> None:
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"routes": {"34.1.2.3": 40001}, "pool": [], "assigned": {},
                                  "ingress": {"34.1.2.3": RULES}, "source": "198.51.100.1"}))
    with pytest.raises(Refused, match="do not admit 198.51.100.1 on port 22"):
        resolve("34.1.2.3", 22, routes)
    routes.write_text(json.dumps({**json.loads(routes.read_text()), "source": "203.0.113.7"}))
    assert resolve("34.1.2.3", 22, routes) == 40001
    layered = {**json.loads(routes.read_text()), "ingress": {"34.1.2.3": [RULES, RULES[2:]]}}
    routes.write_text(json.dumps(layered))  # two NSGs: the second denies all
    with pytest.raises(Refused):
        resolve("34.1.2.3", 22, routes)
