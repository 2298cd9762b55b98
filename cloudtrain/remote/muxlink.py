"""Reusing a node's SSH connection across commands: the laptop side of remote/mux.py (naming,
finding and stopping a node's mux, its stream as a channel). remote/muxkeep.py keeps connections
within one process and starts the mux at exit.

A CLI command that connected to a node itself leaves its connection PARKED when its transport
closes (a later transport in the same process, e.g. `run --down`'s teardown, takes it with its
node helper: no handshake, no channel open), and at exit hands the node to a mux: a small local
process of its own (`python -m cloudtrain.remote.mux`) that logs in again, keeps one node helper
started ahead, and serves it to the next command over a unix socket. That command then sends its
first request at once: one round trip instead of the handshake, the channel open and the request.

Why a process started at exit rather than the first command becoming the mux: a paramiko
connection cannot move between processes (its keys and sequence numbers live in Python objects
and a reader thread), and a mux started before the first command's work would put its Python
start and handshake in that command's way (measured: docs/design/sync.md). Started at exit, its
handshake happens while the user reads the output.

Security, as OpenSSH's ControlMaster: the socket lives in $CLOUDTRAIN_HOME/mux (0700, ours), is
0600, and the mux checks each peer's uid (SO_PEERCRED). Its name is a digest of everything the
connection was made with (address, port, user, key file and its inode/size/mtime, proxy command,
the pinned host key, the helper's source): a changed pin or key gives another name, and the old
mux sees the change and exits within a second. `down` (KnownHosts.forget, muxkeep.stop) stops the
node's muxes and waits for them. A mux exits by itself after ssh.persist_s without a client.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain import paths

if TYPE_CHECKING:
    from cloudtrain.remote.keys import Endpoint, HostKeyPin

log = logging.getLogger("cloudtrain.remote.ssh")

_CHUNK = 1 << 18
# AF_UNIX paths are limited to 108 bytes; a longer one is reached through /proc/self/fd/N/NAME.
_SUN_PATH_MAX = 100
_PEERCRED = struct.Struct("3i")


@dataclass(frozen=True)
class MuxSpec:
    """What a mux needs to log in to one node (sent to it on stdin, never on its command line)."""

    instance_id: str
    address: str
    port: int
    user: str
    identity_file: str | None
    proxy_command: str | None
    cluster: str
    known_hosts: str
    connect_timeout: float
    persist_s: float

    @classmethod
    def of(cls, endpoint: Endpoint, *, cluster: str, known_hosts: Path, connect_timeout: float,
           persist_s: float) -> MuxSpec:
        return cls(endpoint.instance_id, endpoint.address, endpoint.port, endpoint.user,
                   None if endpoint.identity_file is None else str(endpoint.identity_file),
                   endpoint.proxy_command, cluster, str(known_hosts), connect_timeout, persist_s)


def available() -> bool:
    """Unix sockets with peer credentials (Linux): elsewhere every command connects itself."""
    return hasattr(socket, "SO_PEERCRED") and hasattr(socket, "AF_UNIX")


def mux_dir(create: bool = True) -> Path | None:
    """$CLOUDTRAIN_HOME/mux, 0700 and ours; None if it is not (then nothing is reused)."""
    path = paths.home() / "mux" if create else paths.home_path() / "mux"
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("%s is not a directory only you can use: SSH connections are not reused", path)
        return None
    return path


def identity(spec: MuxSpec, pin: HostKeyPin | None, helper_source: str | None = None) -> str | None:
    """A digest of what a connection made from `spec` was made with; None: no pinned host key
    (`pin`: the node's pin in spec.known_hosts now, read by the caller)."""
    from cloudtrain.remote.helper import helper_source as read_source

    if pin is None:
        return None
    if spec.identity_file is None:
        key_state: object = ["agent", os.environ.get("SSH_AUTH_SOCK", "")]
    else:
        try:
            st = os.stat(spec.identity_file)
        except OSError:
            return None
        key_state = [st.st_ino, st.st_size, st.st_mtime_ns]
    source = helper_source if helper_source is not None else read_source()
    material = [asdict(spec) | {"persist_s": None, "connect_timeout": None}, pin.key_type, pin.key_base64, key_state,
                hashlib.sha256(source.encode()).hexdigest(), sys.version_info[:2]]
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def prefix(instance_id: str) -> str:
    return hashlib.sha256(instance_id.encode()).hexdigest()[:10]


def socket_name(spec: MuxSpec, digest: str) -> str:
    return f"{prefix(spec.instance_id)}-{digest[:20]}.sock"


@contextlib.contextmanager
def sun_path(path: Path) -> Iterator[str]:
    """An address for `path` short enough for AF_UNIX."""
    if len(os.fsencode(str(path))) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def peer_uid(sock: socket.socket) -> int:
    return _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[1]


@contextlib.contextmanager
def held_lock(path: Path, *, wait: bool = False) -> Iterator[bool]:
    """flock on `path` (a mux holds its lock file for its whole life): yields whether it was got."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def lock_for_life(path: Path) -> bool:
    """Take `path`'s lock and never give it back: the kernel does when this process exits (a mux),
    so whoever waits on it (`stop`) knows the process is gone, not only about to be."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    return True


def _remove_stale(path: Path) -> None:
    """The socket is there but nobody listens: remove it, unless a mux is just starting (its lock)."""
    with held_lock(path.with_suffix(".lock")) as free:
        if free:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.debug("removed a stale mux socket %s", path.name)


def connect(path: Path, timeout: float) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with sun_path(path) as address:
            sock.connect(address)
        if peer_uid(sock) != os.getuid():
            log.warning("%s is served by another user's process: not using it", path)
            sock.close()
            return None
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        if path.exists():
            _remove_stale(path)
        return None
    except OSError as exc:
        sock.close()
        log.debug("mux %s: %s", path.name, exc)
        return None
    return sock


def ask(sock: socket.socket, op: str) -> tuple[dict, bytes]:
    """One request line, one answer line (what follows the line belongs to the stream after it)."""
    sock.sendall(json.dumps({"op": op}).encode() + b"\n")
    data = b""
    while b"\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            raise EOFError("the mux closed the connection")
        data += piece
        if len(data) > 65536:
            raise ValueError("the mux's answer is too long")
    line, rest = data.split(b"\n", 1)
    return json.loads(line), rest


class MuxChannel:
    """The node helper's byte stream relayed by a mux, as the part of paramiko.Channel NodeHelper uses."""

    def __init__(self, link: MuxLink, sock: socket.socket, buffered: bytes) -> None:
        self.link = link
        self.sock = sock
        self.sock.setblocking(True)
        self.sock.settimeout(None)
        self._buffer = bytearray(buffered)
        self.eof_received = False
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_stderr_ready(self) -> bool:
        return False  # the mux drops the helper's stderr (debug chatter): nothing of it is logged

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def recv_ready(self) -> bool:
        if self._buffer:
            return True
        if self.eof_received or self.closed:
            return False
        try:
            data = self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            self._ended(exc)
            return False
        if not data:
            self._ended(EOFError("cloudtrain's connection process for this node (its mux) went away"))
            return False
        self._buffer += data
        return True

    def recv(self, size: int) -> bytes:
        if not self._buffer:
            self.recv_ready()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def sendall(self, data: bytes | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            self._ended(exc)
            raise

    def close(self) -> None:
        self.closed = True
        self.sock.close()

    def _ended(self, exc: BaseException) -> None:
        self.eof_received = True
        self.link.lost(exc)


class MuxLink:
    """A node reached through its mux: what NodeHelper calls its connection (alive, exception)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._error: BaseException | None = None
        self._channels: list[MuxChannel] = []

    def alive(self) -> bool:
        return self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def lost(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def helper_channel(self) -> tuple[MuxChannel, bool] | None:
        """A started node helper's stream, and whether the mux had to open it now (a round trip:
        normally one waits, opened ahead). None: no mux answers (the caller connects itself)."""
        if not self.alive():
            return None
        sock = connect(self.path, self.timeout)
        if sock is None:
            return None
        try:
            answer, rest = ask(sock, "helper")
        except (OSError, EOFError, ValueError) as exc:
            sock.close()
            log.debug("mux %s: %s", self.path.name, exc)
            return None
        if not answer.get("ok"):
            sock.close()
            return None
        channel = MuxChannel(self, sock, rest)
        self._channels.append(channel)
        return channel, bool(answer.get("fresh"))

    def close(self) -> None:
        for channel in self._channels:
            if not channel.closed:
                channel.close()
        self._channels.clear()


def find(spec: MuxSpec, pin: HostKeyPin | None) -> MuxLink | None:
    """The node's mux, if one runs for exactly this connection's identity (`pin`: the node's pin)."""
    if spec.persist_s <= 0 or not available():
        return None
    directory = mux_dir(create=False)
    if directory is None:
        return None
    digest = identity(spec, pin)
    if digest is None:
        return None
    path = directory / socket_name(spec, digest)
    if not path.exists():
        return None
    return MuxLink(path, spec.connect_timeout + 10)


def wait_for(spec: MuxSpec, pin: HostKeyPin | None, timeout: float) -> MuxLink | None:
    """Poll until the node's mux serves (for tests and benchmarks that start one and use it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        link = find(spec, pin)
        if link is not None and link.path.exists():
            sock = connect(link.path, 1.0)
            if sock is not None:
                sock.close()
                return link
        time.sleep(0.05)
    return None

