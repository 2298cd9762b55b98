"""`python -m cloudtrain.remote.mux`: one node's SSH connection, kept for the next commands.

Started detached by remote/muxlink.py when a command that connected itself exits. It reads its
MuxSpec on stdin, logs in with the same pins and key (remote/ssh.py), starts a node helper ahead
(channel open + exec sent, hello left unread for the client), and listens on its unix socket.
Each client gets that helper's stream relayed byte for byte, and the mux starts the next one at
once. The mux exits, closing its connection:
- ssh.persist_s after the last client left (never later: the check runs every second),
- when its connection drops, or what it was made with changes (host key pin, key file, helper),
- at once on a `stop` request (`down`: muxkeep.stop).
- when the node stops answering: it asks for a sign of life every _PING_S (an SSH keepalive
  request with a reply); one unanswered for _SILENT_S means the machine is gone (stopped, rebooted,
  moved: a powered-off VM sends no FIN, so the connection looks open until the next packet),
It writes nothing anywhere but its socket: no logs (stdout/stderr are /dev/null).

A client is served only by a connection the node answered on since the last ping was sent: when one
is still unanswered (a machine that went silent), the mux pokes the connection (a machine started
again at the same address resets it) and waits up to _CONFIRM_S for the answer; none, and the client
is told no (it connects itself, nothing sent) and the mux exits. So a command after a `stop` and
`start` never gets a helper of the machine's previous boot, whose first request would fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path

import paramiko

from cloudtrain.errors import RemoteError
from cloudtrain.remote import muxlink
from cloudtrain.remote.connection import WINDOW_BYTES, Connection
from cloudtrain.remote.helper import helper_source, launch
from cloudtrain.remote.keys import Endpoint, KnownHosts

_CHUNK = 1 << 18
_TICK_S = 1.0
_PING_S = 1.0  # a sign of life asked of the node this often
_SILENT_S = 15.0  # a ping unanswered this long: the machine is gone, the mux exits
_CONFIRM_S = 5.0  # a client waits at most this for an answer still outstanding, then connects itself
_PING = "keepalive@openssh.com"  # sshd answers any global request asking for a reply (here: failure)


class Mux:
    def __init__(self, spec: muxlink.MuxSpec, conn: Connection, path: Path, digest: str, source: str) -> None:
        self.spec = spec
        self.conn = conn
        self.path = path
        self.digest = digest
        self.source = source
        self.known_hosts = KnownHosts(Path(spec.known_hosts))
        self.stopping = threading.Event()
        self._lock = threading.Condition()
        self._spare: paramiko.Channel | None = None
        self._preparing = False
        self._clients = 0
        self._idle_since = time.monotonic()
        self._open: set[paramiko.Channel] = set()
        self._wake_r, self._wake_w = os.pipe()  # a stop request ends the accept loop's wait at once
        self._asked_at: float | None = None  # the ping in flight (monotonic), None: all answered
        self._pings = 0  # pings answered so far

    # ------------------------------------------------------------------ is the node still there

    def ping_loop(self) -> None:
        """Ask the node for a sign of life every _PING_S, one at a time, until the mux stops."""
        while not self.stopping.is_set():
            transport = self.conn.transport
            if transport is None or not transport.is_active():
                self.stopping.set()
                break
            with self._lock:
                self._asked_at = time.monotonic()
            # Blocks until the reply (sshd's "failure" is one) or until the transport is closed.
            transport.global_request(_PING, wait=True)
            if not transport.is_active():
                self.stopping.set()
                with self._lock:
                    self._lock.notify_all()
                break
            with self._lock:
                self._asked_at = None
                self._pings += 1
                self._lock.notify_all()
            self.stopping.wait(_PING_S)

    def _silent_for(self) -> float:
        with self._lock:
            return 0.0 if self._asked_at is None else time.monotonic() - self._asked_at

    def _node_answers(self) -> bool:
        """Whether the node answered since the ping now in flight was sent (waiting for it if one is)."""
        if self.stopping.is_set() or not self.conn.alive():
            return False
        with self._lock:
            if self._asked_at is None:
                return True
            answered = self._pings
        transport = self.conn.transport
        # One more packet: a machine started again at this address answers it with a reset.
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError, AttributeError):
            if transport is not None:
                transport.global_request(_PING, wait=False)
        deadline = time.monotonic() + min(_CONFIRM_S, self.spec.connect_timeout)
        with self._lock:
            while self._pings == answered and not self.stopping.is_set() and time.monotonic() < deadline:
                self._lock.wait(0.1)
            ok = self._pings != answered and not self.stopping.is_set()
        if not ok:
            self.stopping.set()  # the node is gone or unreachable: of no use to the next clients either
            os.write(self._wake_w, b"x")
        return ok

    # ------------------------------------------------------------------ the helper started ahead

    def _prepare(self) -> None:
        """Open a channel and start a node helper on it (in the background: nobody waits on it)."""
        with self._lock:
            if self._spare is not None or self._preparing or self.stopping.is_set():
                return
            self._preparing = True
        chan: paramiko.Channel | None = None
        try:
            transport = self.conn.transport
            if transport is None:
                raise EOFError("no transport")
            chan = transport.open_session(window_size=WINDOW_BYTES, timeout=self.spec.connect_timeout)
            launch(chan, self.source)
        except (paramiko.SSHException, EOFError, OSError):
            if chan is not None:
                chan.close()
            chan = None
        with self._lock:
            self._preparing = False
            self._spare = chan
            self._lock.notify_all()
        if chan is None:
            self.stopping.set()  # a connection that cannot open a channel is of no use to anyone

    def _take(self) -> tuple[paramiko.Channel | None, bool]:
        if not self._node_answers():
            return None, False
        with self._lock:
            if self._spare is not None and (self._spare.closed or self._spare.eof_received):
                self._spare.close()  # its helper ended (the node's side of it went away)
                self._spare = None
            fresh = self._spare is None
            if fresh and not self._preparing:
                threading.Thread(target=self._prepare, daemon=True).start()
            deadline = time.monotonic() + self.spec.connect_timeout + 5
            while self._spare is None and not self.stopping.is_set() and time.monotonic() < deadline:
                self._lock.wait(0.5)
            chan, self._spare = self._spare, None
            if chan is not None:
                self._open.add(chan)
        threading.Thread(target=self._prepare, daemon=True).start()
        return chan, fresh

    # ------------------------------------------------------------------ clients

    def serve(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            ready, _, _ = select.select([listener, self._wake_r], [], [], _TICK_S)
            if listener in ready:
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                if muxlink.peer_uid(client) != os.getuid():
                    client.close()  # another user's process reached the socket (root, or a bug): refused
                    continue
                with self._lock:
                    self._clients += 1
                threading.Thread(target=self._client, args=(client,), daemon=True).start()
            self._check()

    def _check(self) -> None:
        if not self.conn.alive() or self._silent_for() >= _SILENT_S:
            self.stopping.set()
            return
        with contextlib.suppress(OSError, ValueError, RemoteError):
            pin = self.known_hosts.get(self.spec.instance_id)
            if muxlink.identity(self.spec, pin, helper_source()) == self.digest:
                with self._lock:
                    idle = self._clients == 0 and time.monotonic() - self._idle_since >= self.spec.persist_s
                if idle:
                    self.stopping.set()
                return
        self.stopping.set()  # the pin, the key or the helper changed (or cannot be read): not ours to serve

    def _client(self, client: socket.socket) -> None:
        try:
            client.settimeout(5.0)
            request = b""
            while b"\n" not in request and len(request) < 4096:
                piece = client.recv(4096)
                if not piece:
                    return
                request += piece
            op = json.loads(request.split(b"\n", 1)[0]).get("op")
            if op == "stop":
                self.stopping.set()
                self._shutdown()
                os.write(self._wake_w, b"x")
                client.sendall(b'{"ok": true}\n')
                return
            if op != "helper":
                client.sendall(b'{"ok": false}\n')
                return
            chan, fresh = self._take()
            if chan is None:
                client.sendall(b'{"ok": false}\n')
                return
            client.settimeout(None)
            try:
                client.sendall(json.dumps({"ok": True, "fresh": fresh}).encode() + b"\n")
                self._relay(client, chan)
            finally:
                chan.close()
                with self._lock:
                    self._open.discard(chan)
        except (OSError, ValueError, EOFError, paramiko.SSHException):
            return  # the client went away: its helper channel is closed below, which ends it on the node
        finally:
            client.close()
            with self._lock:
                self._clients -= 1
                self._idle_since = time.monotonic()

    def _relay(self, client: socket.socket, chan: paramiko.Channel) -> None:
        """Bytes both ways until either end closes. The helper's stderr is dropped (debug chatter)."""
        def upstream() -> None:
            # An error either way ends the relay: the downstream loop sees the channel closed.
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                while data := client.recv(_CHUNK):
                    chan.sendall(data)
            chan.close()

        pump = threading.Thread(target=upstream, daemon=True)
        pump.start()
        while True:
            while chan.recv_stderr_ready():
                chan.recv_stderr(_CHUNK)
            if chan.recv_ready():
                client.sendall(chan.recv(_CHUNK))
                continue
            if chan.eof_received or chan.closed or self.stopping.is_set():
                break
            select.select([chan], [], [], _TICK_S)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        pump.join(timeout=5)

    def _shutdown(self) -> None:
        with self._lock:
            channels = list(self._open) + ([self._spare] if self._spare is not None else [])
            self._spare = None
        for chan in channels:
            chan.close()
        self.conn.close()


def main() -> int:
    spec = muxlink.MuxSpec(**json.loads(sys.stdin.buffer.read() or b"{}"))
    os.umask(0o077)
    directory = muxlink.mux_dir()
    source = helper_source()
    known_hosts = KnownHosts(Path(spec.known_hosts))
    digest = muxlink.identity(spec, known_hosts.get(spec.instance_id), source)
    if directory is None or digest is None or spec.persist_s <= 0:
        return 0
    path = directory / muxlink.socket_name(spec, digest)
    if not muxlink.lock_for_life(path.with_suffix(".lock")):
        return 0  # another mux serves (or is starting for) this node
    from cloudtrain.remote.ssh import SSHTransport

    endpoint = Endpoint(spec.instance_id, spec.address, spec.port, spec.user,
                        None if spec.identity_file is None else Path(spec.identity_file), spec.proxy_command)
    transport = SSHTransport(endpoint, cluster=spec.cluster, known_hosts=known_hosts,
                             connect_timeout=spec.connect_timeout, retry_for=0.0, reconnect_for=0.0)
    # A mux never pins a key: the command before it did, and `down` may have forgotten it since.
    transport.learn_host_keys = False
    try:
        conn = transport.detach_connection()
    except (RemoteError, OSError, paramiko.SSHException, EOFError):
        return 1  # nobody to tell: the next command connects itself, and says why if it cannot
    mux = Mux(spec, conn, path, digest, source)
    if muxlink.identity(spec, known_hosts.get(spec.instance_id), source) != digest:
        mux._shutdown()  # noqa: SLF001 - the pin or key changed while we logged in (`down`?)
        return 0
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with muxlink.sun_path(temporary) as address:
            listener.bind(address)
        os.chmod(temporary, 0o600)
        listener.listen(16)
        # Published once its first helper is started: the first client's request goes at once.
        mux._prepare()  # noqa: SLF001
        if mux.stopping.is_set():
            return 1
        threading.Thread(target=mux.ping_loop, daemon=True).start()
        os.replace(temporary, path)  # clients never see a socket nobody listens on
        mux.serve(listener)
    finally:
        listener.close()
        mux.stopping.set()
        # Our lock is still held, so no successor has put its socket there yet.
        for leftover in (temporary, path):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        mux._shutdown()  # noqa: SLF001
    return 0


if __name__ == "__main__":
    # os._exit: no interpreter teardown after the connection is closed (its threads are daemons
    # with nothing left to do), and the lock goes with the process itself (lock_for_life).
    os._exit(main())
