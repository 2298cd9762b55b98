"""Cluster keys, host key pins by instance id, and the generated OpenSSH config (used by real ssh)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from cloudtrain import paths
from cloudtrain.errors import ConfigError
from cloudtrain.providers.base import HostSpec, Instance, InstanceState
from cloudtrain.remote.keys import (
    Endpoint,
    HostKeyMismatchError,
    KnownHosts,
    UnsafeEndpointError,
    cluster_key,
    delete_cluster_key,
    ensure_ssh_include,
    node_config,
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


def test_cluster_name_with_a_trailing_newline_is_refused() -> None:
    """`$` in a regex also matches before a final newline; a name must match as a whole."""
    from cloudtrain.errors import UsageError

    with pytest.raises(UsageError):
        cluster_key("exp\n")
    assert not (paths.home() / "keys" / "exp\n").exists()


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


def test_ensure_ssh_include_is_idempotent_and_keeps_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


# Values a cloud tag (ssh user), a cloud API or a recipe (address, user) could carry. Each would run
# a command through a ProxyCommand's %h/%r, pass an option to the proxy, or inject ssh_config lines.
HOSTILE = [
    "x;touch {m}",
    "$(touch {m})",
    "`touch {m}`",
    "a b|touch {m}",
    "-oProxyCommand=touch {m}",
    "ok\n    ProxyCommand touch {m}",
]


@pytest.mark.parametrize("field", ["address", "user"])
@pytest.mark.parametrize("template", HOSTILE)
def test_unsafe_address_or_user_is_refused_before_any_shell_runs(
    field: str, template: str, tmp_path: Path, sshd_vm_factory: SshdFactory
) -> None:
    marker = tmp_path / "pwned"
    value = template.format(m=marker)
    instance = Instance(
        id="i-hostile", cluster="c", state=InstanceState.RUNNING,
        public_ip=value if field == "address" else "54.30.0.1",
        ssh_user=value if field == "user" else "ubuntu",  # e.g. from the instance's ssh-user tag
    )
    # The proxy runs in tmp_path so that whatever a broken expansion does stays there; %r is
    # echoed only to bring the user name into the shell command.
    proxy = f"cd {shlex.quote(str(tmp_path))} && echo %r >/dev/null && {sshd_vm_factory.proxy_command}"
    with pytest.raises(UnsafeEndpointError) as caught:
        open_transport(cluster="c", instance=instance, config=fast_config(proxy_command=proxy),
                       key_path=sshd_vm_factory.client_key.private_path)
    assert not marker.exists()
    message = caught.value.one_line()
    assert "i-hostile" in message and repr(value) in message and "\n" not in message

    # The same values from a recipe's `hosts:` entry are refused the same way.
    host = HostSpec(value if field == "address" else "10.0.0.5", user=value if field == "user" else "me")
    with pytest.raises(UnsafeEndpointError):
        resolve_endpoint(instance=instance, config=fast_config(), host=host)


@pytest.mark.parametrize("field", ["address", "user", "instance_id"])
def test_generated_ssh_config_never_carries_unsafe_values(field: str, tmp_path: Path) -> None:
    """OpenSSH 9.2 expands %h/%r into ProxyCommand unquoted, and a newline would add directives."""
    marker = tmp_path / "pwned"
    values = {"instance_id": "i-1", "address": "54.0.0.1", "user": "ubuntu"}
    values[field] = f"x;touch {marker}" if field != "instance_id" else "i-1\n    ProxyCommand touch x"
    endpoint = Endpoint(values["instance_id"], values["address"], 22, values["user"], None, "nc %h %p # %r")
    write_ssh_config("other", [resolve_endpoint(instance=Instance(id="i-0", cluster="other",
                     state=InstanceState.RUNNING, public_ip="54.0.0.9"), config=fast_config())])
    before = ssh_config_path().read_text()
    with pytest.raises(UnsafeEndpointError):
        write_ssh_config("exp", [endpoint])
    assert ssh_config_path().read_text() == before
    with pytest.raises(UnsafeEndpointError):
        node_config(endpoint, KnownHosts())
    assert not list((paths.home() / "ssh" / "nodes").glob("*.conf"))


def test_safe_addresses_and_users_are_accepted() -> None:
    for address in ("10.0.0.5", "gpu-2.lab.example.com", "::1", "2001:db8::17", "host_1"):
        for user in ("ubuntu", "ec2-user", "svc.ml_1", "alice@corp.example", "_build"):
            instance = Instance(id="i-ok", cluster="c", state=InstanceState.RUNNING, public_ip=address, ssh_user=user)
            endpoint = resolve_endpoint(instance=instance, config=fast_config(proxy_command="nc %h %p"))
            assert (endpoint.address, endpoint.user) == (address, user)
            assert endpoint.expanded_proxy_command() == f"nc {address} 22"


SYMLINKED = [  # how ~/.ssh/config points at the user's real file (dotfiles repos do this)
    "absolute",
    "relative",
    "chained",  # a link to a link
]


@pytest.mark.parametrize("how", SYMLINKED)
def test_the_include_edits_a_symlinked_configs_target_and_keeps_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    ssh_dir = tmp_path / "user" / ".ssh"
    ssh_dir.mkdir(parents=True)
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "ssh_config"
    real.write_text("Host work\n  User me\n")
    real.chmod(0o600)
    link = ssh_dir / "config"
    if how == "absolute":
        link.symlink_to(real)
    elif how == "relative":
        link.symlink_to(Path("..") / ".." / "dotfiles" / "ssh_config")
    else:
        middle = dotfiles / "current"
        middle.symlink_to(real)
        link.symlink_to(middle)
    pointing = os.readlink(link)
    assert ensure_ssh_include() is True
    assert link.is_symlink() and os.readlink(link) == pointing  # the same link
    assert link.resolve() == real.resolve()
    text = real.read_text()
    assert text.startswith("# Added by cloudtrain") and text.endswith("Host work\n  User me\n")
    assert real.stat().st_mode & 0o777 == 0o600
    assert ensure_ssh_include() is False  # found through the link: idempotent


def test_a_dangling_symlinked_config_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    ssh_dir = tmp_path / "user" / ".ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "config").symlink_to(tmp_path / "gone" / "ssh_config")
    with pytest.raises(ConfigError, match="symlink") as caught:
        ensure_ssh_include()
    assert "add_include" in (caught.value.hint or "")
    assert (ssh_dir / "config").is_symlink() and not (tmp_path / "gone").exists()
