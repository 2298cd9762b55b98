"""The connection half of SSHTransport (remote/ssh.py): opening it (through a ProxyCommand where
one is set, host key pinned, the key or agent), reusing one kept from an earlier command
(remote/muxkeep.py in this process, the node's mux across processes: remote/muxlink.py),
retrying a machine still booting with backoff and a line saying what it waits for, and
re-opening a connection that dropped between two commands. Split from ssh.py, which runs the
commands; `Connecting` works on the attributes SSHTransport.__init__ sets.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from cloudtrain.errors import RemoteError
from cloudtrain.remote import muxkeep, muxlink
from cloudtrain.remote.channel import ConnectionLostError, SSHAuthError, SSHConnectError, lost
from cloudtrain.remote.keys import HostKeyMismatchError
from cloudtrain.remote.reach import WAIT_NOTICE_S, WaitNotice, handshake_failure, socket_failure

if TYPE_CHECKING:
    import paramiko

    from cloudtrain.remote.connection import Connection

log = logging.getLogger("cloudtrain.remote.ssh")  # one logger for the transport, as before the split

_KEEPALIVE_S = 15


class Connecting:
    """Connection management for SSHTransport (see the module docstring)."""


    def connect(self, retry_for: float | None = None) -> None:
        """Open the connection, retrying with capped exponential backoff for up to retry_for s.

        A wait that outlasts WAIT_NOTICE_S says what it waits for, and again every
        _WAIT_REPEAT_S with how long it has waited: minutes of silence read as a hang.

        First, a connection kept from an earlier command (remote/muxlink.py): parked by a
        transport of this process, or the node's mux."""
        if self._reuse():
            return
        self._connect_direct(retry_for)

    def _reuse(self) -> bool:
        if self.persist_s <= 0 or self._helper_off or self._conn is not None or self._link is not None:
            return False
        spec = self.mux_spec()
        shared = muxkeep.share(spec)
        if shared is not None:
            with self._lock:
                self._conn, self.reused = shared, "process"
            return True
        parked = muxkeep.take_parked(spec)
        with self._lock:
            if parked is not None:
                self._conn, helper = parked
                if helper is not None:
                    helper.counter, helper.after = self.round_trips, ()
                    self._helper = helper
                self.reused = "process"
                return True
            self._link = muxlink.find(spec, self.known_hosts.get(self.endpoint.instance_id))
            if self._link is not None:
                self.reused = "mux"
            return self._link is not None

    def mux_spec(self) -> muxlink.MuxSpec:
        return muxlink.MuxSpec.of(self.endpoint, cluster=self.cluster, known_hosts=self.known_hosts.path,
                                  connect_timeout=self.connect_timeout, persist_s=self.persist_s)

    def detach_connection(self) -> Connection:
        """Connect (one attempt) and hand the connection over: remote/mux.py keeps it, not this transport."""
        self._connect_direct(0.0)
        with self._lock:
            conn, self._conn = self._conn, None
        assert conn is not None
        return conn

    def _connect_direct(self, retry_for: float | None = None) -> None:
        budget = self.retry_for if retry_for is None else retry_for
        started = time.monotonic()
        delay = 0.25
        attempts = 0
        notice = WaitNotice(f"SSH on {self.label} (instance {self.endpoint.instance_id})", budget)
        while True:
            if self._given_up.is_set():
                raise SSHConnectError(f"gave up on {self.label} (instance {self.endpoint.instance_id}): "
                                      "the cloud says the machine is gone")
            attempts += 1
            try:
                conn = self._attempt(notice if attempts == 1 else None)
            except HostKeyMismatchError:
                raise
            except SSHAuthError as exc:
                if not self.retry_auth or time.monotonic() - started >= budget:
                    raise
                last = exc.message
            except SSHConnectError as exc:
                last = exc.message
                if time.monotonic() - started >= budget:
                    if attempts == 1:
                        raise SSHConnectError(f"cannot reach {self.label} (instance {self.endpoint.instance_id}): "
                                              f"{exc.message}", hint=exc.hint) from None
                    raise SSHConnectError(
                        f"cannot reach {self.label} (instance {self.endpoint.instance_id}) after {attempts} "
                        f"attempt(s) in {time.monotonic() - started:.0f}s: {exc.message}",
                        hint=exc.hint,
                    ) from None
            else:
                with self._lock:
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = conn
                    self.connects += 1
                if self.persist_s > 0:
                    muxkeep.register(self.mux_spec(), conn)
                notice.done()
                return
            log.debug("%s: connect attempt %d failed (%s); retrying in %.2fs", self.label, attempts, last, delay)
            notice.tick(time.monotonic() - started, last)
            remaining = budget - (time.monotonic() - started)
            self._given_up.wait(max(0.0, min(delay, remaining)))  # a sleep that give_up() ends
            delay = min(delay * 2, 5.0)

    def _attempt(self, notice: WaitNotice | None) -> Connection:
        """One connect; with `notice`, a line if it has not answered after WAIT_NOTICE_S (one
        attempt alone may take connect_timeout_s: a host that accepts and never speaks)."""
        if notice is None or self.connect_timeout <= WAIT_NOTICE_S:
            return self._connect_once()
        timer = threading.Timer(WAIT_NOTICE_S, notice.slow_attempt, args=(self.connect_timeout,))
        timer.daemon = True
        timer.start()
        try:
            return self._connect_once()
        finally:
            timer.cancel()

    def _connect_once(self) -> Connection:
        # paramiko is loaded here, by a command that connects itself: one served by the node's mux
        # (remote/mux.py) never needs it.
        import paramiko

        from cloudtrain.remote.connection import Connection, PinPolicy, abandon, make_transport

        ep = self.endpoint
        where = f"{ep.address}:{ep.port}"
        pkey = self._load_key()
        sock, proxy, proxy_err = self._open_socket()
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(PinPolicy(self.known_hosts, ep, learn=self.learn_host_keys))
        began = time.monotonic()
        try:
            client.connect(
                hostname=ep.address,
                port=ep.port,
                username=ep.user,
                pkey=pkey,
                allow_agent=pkey is None,
                look_for_keys=pkey is None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                sock=sock,
                transport_factory=make_transport,
            )
        except HostKeyMismatchError:
            abandon(client, sock, proxy, proxy_err)
            raise
        except paramiko.AuthenticationException as exc:
            abandon(client, sock, proxy, proxy_err)
            key = f"key {ep.identity_file}" if ep.identity_file else "your agent/default keys"
            raise SSHAuthError(
                f"{ep.user}@{where} (instance {ep.instance_id}) refused {key}: {exc}",
                hint="check the user name and that the public key is in the node's ~/.ssh/authorized_keys",
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # Whether the other end ever said "SSH-2.0-...": paramiko reports a silent peer as a
            # banner timeout or, when its own negotiation timer fires first, "No existing session".
            started = client.get_transport()
            answered = started is not None and bool(getattr(started, "remote_version", ""))
            said = abandon(client, sock, proxy, proxy_err)
            # Through a ProxyCommand a quick end is the proxy's (it could not reach the machine), not
            # a server that answered in another protocol: no elapsed time, no such guess.
            elapsed = None if proxy else time.monotonic() - began
            what, hint = handshake_failure(exc, self.connect_timeout, answered, elapsed)
            if proxy and said:
                hint = f"ProxyCommand {ep.expanded_proxy_command()!r} said: {said}"
            raise SSHConnectError(f"{where}: {what}", hint=hint) from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(_KEEPALIVE_S)
        return Connection(client, proxy, proxy_err)

    def _open_socket(self) -> tuple[socket.socket, subprocess.Popen[bytes] | None, IO[bytes] | None]:
        ep = self.endpoint
        command = ep.expanded_proxy_command()
        if command:
            ours, theirs = socket.socketpair()
            errors = tempfile.TemporaryFile()
            try:
                proxy = subprocess.Popen(
                    command, shell=True, stdin=theirs, stdout=theirs, stderr=errors, start_new_session=True
                )
            except OSError as exc:
                ours.close()
                raise SSHConnectError(f"ProxyCommand {command!r} failed to start: {exc}") from None
            finally:
                theirs.close()
            return ours, proxy, errors
        from cloudtrain.remote.connection import tune_tcp

        try:
            sock = socket.create_connection((ep.address, ep.port), timeout=self.connect_timeout)
        except OSError as exc:
            what, hint = socket_failure(exc, self.connect_timeout)
            raise SSHConnectError(f"{ep.address}:{ep.port}: {what}", hint=hint) from None
        tune_tcp(sock)
        return sock, None, None

    def _load_key(self) -> paramiko.PKey | None:
        import paramiko

        path = self.endpoint.identity_file
        if path is None:
            return None
        try:
            return paramiko.PKey.from_path(path)
        except FileNotFoundError:
            from cloudtrain import paths

            if Path(path).resolve().is_relative_to((paths.home_path() / "keys").resolve()):
                # Ours: `down` (another terminal's, or a recovering run's teardown of a lost node)
                # removed it with the cluster. The recipe's `key:` has nothing to do with it.
                raise SSHAuthError(f"SSH key {path} does not exist: cloudtrain made it for cluster {self.cluster} "
                                   "and removed it when the cluster was taken down",
                                   hint=f"`cloudtrain status {self.cluster}` shows what is left") from None
            raise SSHAuthError(f"SSH key {path} does not exist", hint="fix `key:` in the recipe's hosts") from None
        except paramiko.PasswordRequiredException:
            raise SSHAuthError(
                f"SSH key {path} is encrypted", hint="load it into ssh-agent and leave `key:` unset"
            ) from None
        except (paramiko.SSHException, ValueError, OSError) as exc:
            raise SSHAuthError(f"cannot read SSH key {path}: {exc}") from None

    @property
    def connected(self) -> bool:
        """Whether a connection is open and not yet seen to have dropped (a drop is noticed by the
        transport's reader thread, a moment after it happens)."""
        with self._lock:
            if self._link is not None and self._link.alive():
                return True
            return self._conn is not None and self._conn.alive()

    def _live_connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and self._conn.alive():
                return self._conn
            if self._conn is not None:
                log.info("%s: connection dropped; reconnecting", self.label)
                self._conn.close()
                self._conn = None
                self._connect_direct(retry_for=self.reconnect_for)
            else:
                self._connect_direct()
            assert self._conn is not None
            return self._conn

    def _open_channel(self) -> tuple[Connection, paramiko.Channel]:
        import paramiko

        from cloudtrain.remote.connection import WINDOW_BYTES

        for attempt in range(2):
            conn = self._live_connection()
            transport = conn.transport
            try:
                if transport is None:
                    raise EOFError("no transport")
                self.round_trips.session()
                self.round_trips.sent()
                self.round_trips.waiting("channel open")
                chan = transport.open_session(window_size=WINDOW_BYTES, timeout=self.connect_timeout)
                return conn, chan
            except paramiko.ChannelException as exc:
                raise RemoteError(
                    f"{self.label}: the node refused a new session ({exc})",
                    hint="too many commands at once for sshd's MaxSessions?",
                ) from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                # Nothing ran yet, so trying once more on a fresh connection is safe.
                self._discard(conn)
                if attempt:
                    raise self._lost("opening a channel", exc) from None
        raise AssertionError("unreachable")

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def _lost(self, doing: str, exc: BaseException | None) -> ConnectionLostError:
        return lost(self.label, doing, exc)
