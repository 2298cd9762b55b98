"""SSH identity and trust: per-cluster keys, host keys pinned by instance id, a generated ssh config.

Host keys are pinned by INSTANCE ID, not address: clouds hand the same public IP to a new VM
tomorrow, and a test routes many fake addresses to loopback. OpenSSH (used by rsync and by the
user's own `ssh <cluster>`) sees the same pins through a generated known_hosts file whose host
names are instance ids, matched with `HostKeyAlias`.

Files (all under $CLOUDTRAIN_HOME):
  keys/<cluster>/id_ed25519[.pub]  private key 0600 in a 0700 directory
  known_hosts.json                 the pins (source of truth)
  ssh/known_hosts                  OpenSSH view of the pins, regenerated on every change
  ssh/config                       Host blocks per cluster node, for `Include` in ~/.ssh/config
  ssh/nodes/<instance>.conf        one node's block, used by rsync's `ssh -F`
"""

from __future__ import annotations

import base64
import fcntl
import getpass
import hashlib
import json
import os
import re
import shlex
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from cloudtrain import paths
from cloudtrain.config import Config
from cloudtrain.errors import ConfigError, RemoteError, UsageError
from cloudtrain.providers.base import HostSpec, Instance

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# What an endpoint may hold, because OpenSSH 9.2 (Debian 12) puts %h/%r into a ProxyCommand
# unquoted (CVE-2023-51385, refused only from 9.6 on) and a newline in a value would add
# directives to the generated ssh config. Allow-lists, matched whole: host names and IPv4/IPv6
# literals (no `%zone`: `%` starts an ssh_config token), POSIX-style user names plus `@` for
# directory users, cloud instance ids. A leading `-` would become an option of the proxy
# (`ssh -W %h:%p bastion`), so the first character is never one.
_SAFE_ENDPOINT = {
    "address": (re.compile(r"[A-Za-z0-9_:][A-Za-z0-9._:-]{0,252}"), "letters, digits and . _ - :"),
    "user": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,127}"), "letters, digits and . _ - @"),
    "instance id": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:@-]{0,254}"), "letters, digits and . _ - : @"),
}
# OpenSSH HostKeyAlgorithms that prove possession of a key of each type; pinned in the per-node
# config so OpenSSH negotiates the same key type paramiko pinned.
_HOSTKEY_ALGORITHMS = {
    "ssh-ed25519": "ssh-ed25519",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384": "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521": "ecdsa-sha2-nistp521",
    "ssh-rsa": "rsa-sha2-512,rsa-sha2-256,ssh-rsa",
}
_BEGIN = "# >>> cloudtrain cluster {name} (generated; edits are overwritten)"
_END = "# <<< cloudtrain cluster {name}"


class HostKeyMismatchError(RemoteError):
    """The node presented a host key different from the one pinned for its instance id."""


class UnsafeEndpointError(RemoteError):
    """An address, user or instance id that a shell or an ssh config would interpret, not just carry.

    A RemoteError (not a UsageError) on purpose: the value may come from a cloud's API or tag, and
    `down` treats an unreachable node as "files stay there", not as a reason to stop.
    """


# ----------------------------------------------------------------------------- cluster keys


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_openssh: str


def generate_ed25519(private_path: Path, comment: str) -> str:
    """Write a new ed25519 private key (OpenSSH format, 0600) and its .pub; return the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {comment}"
    # mkstemp creates the file 0600: the key never exists with looser permissions, even briefly.
    fd, tmp = tempfile.mkstemp(prefix=f".{private_path.name}.", dir=private_path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    os.replace(tmp, private_path)
    private_path.with_name(private_path.name + ".pub").write_text(line + "\n")
    return line


def _check_name(kind: str, name: str) -> str:
    # fullmatch: `$` would also accept a name ending in a newline.
    if not _SAFE_NAME.fullmatch(name):
        raise UsageError(f"{kind} name {name!r} cannot be used in a file name")
    return name


def _keys_dir(cluster: str) -> Path:
    return paths.home() / "keys" / _check_name("cluster", cluster)


def cluster_key(cluster: str) -> KeyPair:
    """The cluster's ed25519 key pair, created on first use and the same afterwards."""
    directory = _keys_dir(cluster)
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory.parent, 0o700)
    os.chmod(directory, 0o700)
    private = directory / "id_ed25519"
    with _locked(directory / ".lock"):
        if not private.exists():
            public = generate_ed25519(private, f"cloudtrain-{cluster}")
        else:
            # OpenSSH refuses keys others can read; repair a copy that lost its mode.
            if private.stat().st_mode & 0o077:
                os.chmod(private, 0o600)
            public = _public_line(private, cluster)
    return KeyPair(private_path=private, public_openssh=public)


def _public_line(private: Path, cluster: str) -> str:
    pub = private.with_name(private.name + ".pub")
    if pub.exists():
        return pub.read_text().strip()
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private.read_bytes(), password=None)
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    text = f"{line.decode()} cloudtrain-{cluster}"
    pub.write_text(text + "\n")
    return text


def delete_cluster_key(cluster: str) -> None:
    directory = _keys_dir(cluster)
    for name in ("id_ed25519", "id_ed25519.pub", ".lock"):
        (directory / name).unlink(missing_ok=True)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()


# ----------------------------------------------------------------------------- known hosts


def fingerprint(key_blob: bytes) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key blob."""
    digest = base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


@dataclass(frozen=True)
class HostKeyPin:
    instance_id: str
    key_type: str
    key_base64: str
    fingerprint: str
    address: str
    recorded_at: float


class KnownHosts:
    """Host key pins keyed by instance id. Safe for several cloudtrain processes at once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.home() / "known_hosts.json"
        self.openssh_file = self.path.parent / "ssh" / "known_hosts"

    def get(self, instance_id: str) -> HostKeyPin | None:
        raw = self._read().get(instance_id)
        return HostKeyPin(**raw) if raw else None

    def pins(self) -> list[HostKeyPin]:
        return [HostKeyPin(**raw) for raw in self._read().values()]

    def check(self, instance_id: str, key_type: str, key_blob: bytes, address: str) -> HostKeyPin:
        """Accept and record the key on first contact; refuse a different key later."""
        offered = fingerprint(key_blob)
        with _locked(self.path.with_name(self.path.name + ".lock")):
            pins = self._read()
            raw = pins.get(instance_id)
            if raw is not None:
                pin = HostKeyPin(**raw)
                if pin.key_type == key_type and pin.key_base64 == base64.b64encode(key_blob).decode():
                    return pin
                raise HostKeyMismatchError(
                    f"host key for instance {instance_id} ({address}) changed: pinned {pin.key_type} "
                    f"{pin.fingerprint}, offered {key_type} {offered}; refusing to connect",
                    hint=f"if the machine was really reinstalled, run `cloudtrain down` on its cluster or "
                    f"remove {instance_id!r} from {self.path}",
                )
            pin = HostKeyPin(instance_id, key_type, base64.b64encode(key_blob).decode(), offered, address, time.time())
            pins[instance_id] = asdict(pin)
            self._write(pins)
            return pin

    def forget(self, instance_id: str) -> bool:
        """Drop a pin (the instance was terminated). Returns whether one existed. The caller then
        ends the node's kept connections (remote/muxkeep.stop), so that none outlives the pin it was
        checked against; one still logging in finds no pin to log in with."""
        with _locked(self.path.with_name(self.path.name + ".lock")):
            pins = self._read()
            existed = pins.pop(instance_id, None) is not None
            if existed:
                self._write(pins)
        return existed

    def ensure_openssh_file(self) -> Path:
        if not self.openssh_file.exists():
            with _locked(self.path.with_name(self.path.name + ".lock")):
                self._write(self._read())
        return self.openssh_file

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise RemoteError(f"{self.path} is corrupt: {exc}", hint="fix or delete it; pins are re-learned") from None
        return data.get("pins", {})

    def _write(self, pins: dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path, json.dumps({"version": 1, "pins": pins}, indent=1, sort_keys=True) + "\n")
        lines = [f"{iid} {raw['key_type']} {raw['key_base64']}" for iid, raw in sorted(pins.items())]
        self.openssh_file.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.openssh_file, "".join(line + "\n" for line in lines))


# ----------------------------------------------------------------------------- endpoints & ssh config


@dataclass(frozen=True)
class Endpoint:
    """How to reach one node, in OpenSSH terms. proxy_command keeps its %h/%p/%r tokens."""

    instance_id: str
    address: str
    port: int
    user: str
    identity_file: Path | None
    proxy_command: str | None

    @property
    def label(self) -> str:
        return f"{self.user}@{self.address}" + (f":{self.port}" if self.port != 22 else "")

    def expanded_proxy_command(self) -> str | None:
        """The ProxyCommand with %h %p %r %n replaced by shell-quoted values, ready for `sh -c`.

        resolve_endpoint already refuses values a shell would interpret, so for every endpoint it
        makes the quoting changes nothing (a template's own `"%h:%p"` keeps working); it is what
        keeps an endpoint built any other way from running `$(...)` or `;cmd` on this machine.
        """
        if not self.proxy_command:
            return None
        tokens = {"h": self.address, "p": str(self.port), "r": self.user, "n": self.address}

        def expand(match: re.Match[str]) -> str:
            token = match.group(1)
            if token == "%":
                return "%"
            return shlex.quote(tokens[token]) if token in tokens else match.group(0)

        return re.sub(r"%(.)", expand, self.proxy_command)

    def check_safe(self, sources: dict[str, str] | None = None) -> Endpoint:
        """Refuse (UnsafeEndpointError) an address, user or instance id outside the allow-lists."""
        values = {"instance id": self.instance_id, "address": self.address, "user": self.user}
        for kind, value in values.items():
            pattern, allowed = _SAFE_ENDPOINT[kind]
            if pattern.fullmatch(value):
                continue
            shown = value if len(value) <= 200 else value[:200] + "..."
            source = f" (from {sources[kind]})" if sources and kind in sources else ""
            raise UnsafeEndpointError(
                f"refusing ssh {kind} {shown!r} of instance {self.instance_id!r}{source}: a shell or an ssh "
                f"config would read it as more than a name",
                hint=f"allowed: {allowed}, not starting with '-'",
            )
        return self


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root" if hasattr(os, "geteuid") and os.geteuid() == 0 else "ubuntu"


def resolve_endpoint(
    *, instance: Instance, config: Config, host: HostSpec | None = None, key_path: Path | None = None
) -> Endpoint:
    """Apply the precedence rules: recipe host > instance record > defaults."""
    address = (host.address if host else None) or instance.public_ip
    if not address:
        raise RemoteError(f"instance {instance.id} has no public address to connect to",
                          hint="is it still starting, or in a private subnet without a proxy_command?")
    port = (host.port if host and host.port else None) or instance.ssh_port or 22
    user = (host.user if host else None) or instance.ssh_user or current_user()
    identity = Path(host.key).expanduser() if host and host.key else key_path
    proxy = (host.proxy_command if host else None) or config.ssh.proxy_command
    # Checked here, where values from recipes, cloud APIs and instance tags come together, and
    # before anything hands them to a ProxyCommand, paramiko or a config file.
    sources = {
        "address": "the recipe's hosts" if host and host.address else "the instance's public address",
        "user": "the recipe's hosts" if host and host.user else
                "the instance record, e.g. its ssh-user tag" if instance.ssh_user else "the local user name",
        "instance id": "the provider",
    }
    return Endpoint(instance.id, address, int(port), user, identity, proxy).check_safe(sources)


def _quote_value(value: str) -> str:
    # ssh_config values: `%` starts a token in paths, whitespace needs double quotes. A newline
    # would end the line (and start a directive of the value's choosing); a `"` would end the quotes.
    if _has_control(value) or '"' in value:
        raise UnsafeEndpointError(f"refusing to write {value!r} to an ssh config: it has a control character or '\"'")
    value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _has_control(value: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


def render_host_block(alias: str, endpoint: Endpoint, known_hosts_file: Path, *, key_type: str | None = None,
                      connect_timeout: float | None = None) -> str:
    """One `Host` block. HostName and User are validated, and ProxyCommand keeps its %-tokens.

    OpenSSH expands those tokens itself, unquoted (9.2 does not refuse shell metacharacters in
    them). We keep them rather than expanding here because the user's own `ssh <cluster>` then
    shows their template as written, and with HostName and User held to check_safe's allow-lists
    the unquoted expansion is only ever a plain word.
    """
    endpoint.check_safe()
    if endpoint.proxy_command and _has_control(endpoint.proxy_command):
        raise UnsafeEndpointError(
            f"refusing ProxyCommand {endpoint.proxy_command!r} for instance {endpoint.instance_id!r}: "
            f"it has a control character, which would end its line in the ssh config"
        )
    lines = [
        f"Host {alias}",
        f"    HostName {endpoint.address}",
        f"    User {endpoint.user}",
        f"    Port {endpoint.port}",
        f"    HostKeyAlias {endpoint.instance_id}",
        f"    UserKnownHostsFile {_quote_value(str(known_hosts_file))}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    ServerAliveInterval 15",
        "    ServerAliveCountMax 4",
    ]
    if endpoint.identity_file:
        lines += [f"    IdentityFile {_quote_value(str(endpoint.identity_file))}", "    IdentitiesOnly yes"]
    if endpoint.proxy_command:
        lines.append(f"    ProxyCommand {endpoint.proxy_command}")
    if key_type in _HOSTKEY_ALGORITHMS:
        lines.append(f"    HostKeyAlgorithms {_HOSTKEY_ALGORITHMS[key_type]}")
    if connect_timeout:
        lines.append(f"    ConnectTimeout {max(1, int(connect_timeout))}")
    return "\n".join(lines) + "\n"


def ssh_config_path() -> Path:
    return paths.home() / "ssh" / "config"


def node_config(endpoint: Endpoint, known_hosts: KnownHosts, *, connect_timeout: float | None = None) -> Path:
    """A one-node OpenSSH config (Host `ct-node`) for tools we spawn, e.g. rsync's `ssh -F`."""
    pin = known_hosts.get(endpoint.instance_id)
    text = render_host_block(
        "ct-node", endpoint, known_hosts.ensure_openssh_file(), key_type=pin.key_type if pin else None,
        connect_timeout=connect_timeout,
    )
    text += "    BatchMode yes\n    LogLevel ERROR\n"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", endpoint.instance_id)
    path = paths.home() / "ssh" / "nodes" / f"{safe}.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        _atomic_write(path, text)
    return path


def write_ssh_config(cluster: str, entries: Sequence[Endpoint]) -> Path:
    """(Re)write the cluster's Host blocks: `<cluster>` for rank 0, `<cluster>-<rank>` for the rest.

    `entries` are in rank order. Other clusters' blocks in the file are kept.
    """
    _check_name("cluster", cluster)
    known = KnownHosts()
    blocks = [_BEGIN.format(name=cluster)]
    for rank, endpoint in enumerate(entries):
        alias = cluster if rank == 0 else f"{cluster}-{rank}"
        pin = known.get(endpoint.instance_id)
        blocks.append(render_host_block(alias, endpoint, known.ensure_openssh_file(),
                                        key_type=pin.key_type if pin else None))
    blocks.append(_END.format(name=cluster))
    return _replace_section(cluster, "\n".join(blocks) + "\n")


def remove_ssh_config(cluster: str) -> None:
    _replace_section(cluster, "")


def _replace_section(cluster: str, section: str) -> Path:
    path = ssh_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name("config.lock")):
        text = path.read_text() if path.exists() else ""
        pattern = re.compile(
            re.escape(_BEGIN.format(name=cluster)) + r".*?" + re.escape(_END.format(name=cluster)) + r"\n?",
            re.DOTALL,
        )
        text = pattern.sub("", text)
        if section:
            text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + section
        _atomic_write(path, text, mode=0o600)
    return path


def ensure_ssh_include() -> bool:
    """Add `Include <generated config>` at the top of ~/.ssh/config (on by default, `ssh.add_include:
    false` turns it off). True when it changed."""
    user_dir = Path.home() / ".ssh"
    user_config = user_dir / "config"
    if user_config.is_symlink():
        # A dotfiles setup links ~/.ssh/config to the real file: edit that file, keep the link
        # (replacing the link with a copy would silently fork the user's config).
        real = user_config.resolve()
        if not real.parent.is_dir():
            raise ConfigError(f"~/.ssh/config is a symlink to {real}, whose directory does not exist: "
                              "cloudtrain cannot add its Include there",
                              hint="fix the link, or set ssh.add_include: false in the config")
        user_config = real
    target = ssh_config_path()
    include = f"Include {_quote_value(str(target))}"
    existing = user_config.read_text() if user_config.exists() else ""
    if any(line.strip().lower() == include.lower() for line in existing.splitlines()):
        return False
    user_dir.mkdir(mode=0o700, exist_ok=True)
    # At the top: an Include after a `Host` line would only apply inside that block.
    header = f"# Added by cloudtrain: `ssh <cluster>` reaches cloudtrain's nodes.\n{include}\n\n"
    mode = user_config.stat().st_mode & 0o777 if user_config.exists() else 0o600
    _atomic_write(user_config, header + existing, mode=mode)
    return True


# ----------------------------------------------------------------------------- file helpers


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
