"""Cluster keys, host key pins by instance id, and the generated OpenSSH config (used by real ssh)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from cloudtrain import paths
from cloudtrain.providers.base import HostSpec
from cloudtrain.remote.keys import (
    HostKeyMismatchError,
    KnownHosts,
    cluster_key,
    delete_cluster_key,
    ensure_ssh_include,
    remove_ssh_config,
    resolve_endpoint,
    ssh_config_path,
    write_ssh_config,
)
from cloudtrain.remote.ssh import open_transport
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from tests.remote.conftest import fast_config


def test_cluster_key_is_private_and_stable() -> None:
    first = cluster_key("exp1")
    assert first.private_path == paths.home() / "keys" / "exp1" / "id_ed25519"
    assert stat.S_IMODE(first.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.private_path.parent.stat().st_mode) == 0o700
    assert first.public_openssh.startswith("ssh-ed25519 ") and first.public_openssh.endswith(" cloudtrain-exp1")
    assert cluster_key("exp1") == first
    assert cluster_key("exp2").public_openssh != first.public_openssh

    first.private_path.chmod(0o644)  # e.g. restored from a backup
    cluster_key("exp1")
    assert stat.S_IMODE(first.private_path.stat().st_mode) == 0o600

    delete_cluster_key("exp1")
    assert not first.private_path.parent.exists()
    assert cluster_key("exp1").public_openssh != first.public_openssh


def test_cluster_name_cannot_escape_the_keys_directory() -> None:
    from cloudtrain.errors import UsageError

    with pytest.raises(UsageError):
        cluster_key("../evil")


def test_pins_are_by_instance_id() -> None:
    known = KnownHosts()
    known.check("i-1", "ssh-ed25519", b"key-one", "54.1.2.3")
    known.check("i-1", "ssh-ed25519", b"key-one", "54.9.9.9")  # new address, same machine: fine
    known.check("i-2", "ssh-ed25519", b"key-two", "54.1.2.3")  # reused address, new machine: fine
    with pytest.raises(HostKeyMismatchError) as caught:
        known.check("i-1", "ssh-ed25519", b"key-evil", "54.1.2.3")
    message = caught.value.one_line()
    assert "i-1" in message and known.get("i-1").fingerprint in message  # type: ignore[union-attr]
    assert "SHA256:" in message.split("offered")[1]
    lines = known.openssh_file.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["i-1", "i-2"]

    assert known.forget("i-1") and not known.forget("i-1")
    known.check("i-1", "ssh-ed25519", b"key-evil", "54.1.2.3")  # a new instance with that id is learned afresh
    assert len(known.openssh_file.read_text().splitlines()) == 2


def test_ssh_config_blocks_per_node_and_cluster(tmp_path: Path) -> None:
    from cloudtrain.providers.base import Instance, InstanceState

    nodes = [
        Instance(id=f"i-{rank}", cluster="exp", state=InstanceState.RUNNING, public_ip=f"54.0.0.{rank}", ssh_user="ubuntu")
        for rank in range(2)
    ]
    key = cluster_key("exp").private_path
    config = fast_config(proxy_command="bastion-relay %h %p")
    entries = [resolve_endpoint(instance=n, config=config, key_path=key) for n in nodes]
    path = write_ssh_config("exp", entries)
    write_ssh_config("other", [resolve_endpoint(instance=nodes[0], config=fast_config(),
                                                host=HostSpec("10.0.0.5", user="me", port=2222))])
    text = path.read_text()
    assert path == ssh_config_path()
    assert "Host exp\n" in text and "Host exp-1\n" in text and "Host other\n" in text
    assert "    HostName 54.0.0.1\n" in text and "    User ubuntu\n" in text and "    Port 2222\n" in text
    assert f"    IdentityFile {key}\n" in text
    assert "    ProxyCommand bastion-relay %h %p\n" in text
    assert f"    UserKnownHostsFile {KnownHosts().openssh_file}\n" in text
    assert "    HostKeyAlias i-1\n" in text

    write_ssh_config("exp", entries[:1])  # rewritten, not appended
    text = path.read_text()
    assert text.count("Host exp\n") == 1 and "Host exp-1\n" not in text and "Host other\n" in text
    remove_ssh_config("exp")
    assert "Host exp" not in path.read_text() and "Host other\n" in path.read_text()


def test_ensure_ssh_include_is_opt_in_idempotent_and_keeps_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    user_config = tmp_path / "user" / ".ssh" / "config"
    user_config.parent.mkdir(parents=True)
    user_config.write_text("Host work\n    HostName work.example\n")
    assert ensure_ssh_include() is True
    assert ensure_ssh_include() is False
    lines = user_config.read_text().splitlines()
    include = next(i for i, line in enumerate(lines) if line.startswith("Include "))
    assert lines[include] == f"Include {ssh_config_path()}"
    assert include < lines.index("Host work")  # before any Host block, so it applies everywhere
    assert "    HostName work.example" in lines


def test_openssh_uses_the_generated_config_and_the_same_pins(
    sshd_vm: SshdVM, sshd_vm_factory: SshdFactory
) -> None:
    """`ssh <cluster>` works after `up`, and OpenSSH refuses a changed host key just like we do."""
    key = cluster_key("exp")
    sshd_vm.authorize(key.public_openssh)
    instance = sshd_vm.instance("i-exp-0", cluster="exp", address="54.20.0.1")
    config = fast_config(proxy_command=sshd_vm.proxy_command)
    open_transport(cluster="exp", instance=instance, config=config, key_path=key.private_path).close()
    write_ssh_config("exp", [resolve_endpoint(instance=instance, config=config, key_path=key.private_path)])

    def ssh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ssh", "-F", str(ssh_config_path()), "-o", "BatchMode=yes", *args],
                              capture_output=True, text=True, timeout=30)

    result = ssh("exp", "echo", "$HOME")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sshd_vm.home

    sshd_vm.restart(new_host_key=True)
    result = ssh("exp", "true")
    assert result.returncode != 0
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr or "Host key verification failed" in result.stderr
