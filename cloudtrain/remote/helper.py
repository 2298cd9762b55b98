"""The laptop half of the node helper: every command of a CLI invocation over ONE SSH session.

A new exec channel per command costs two round trips (channel open, exec) plus a session on the
node (PAM, a login shell: ~90 ms on a stock sshd) before the command even starts. The helper
(templates/sync_helper.py `serve`) is started once per connection, on one channel, and runs each
command it is sent in turn; a command then costs one round trip, and commands sent together
(`start` does not wait: it only sends) are answered together, in order: a pipeline.

Responses come back strictly in request order, so a process must be read in the order it was
started (an earlier one's output is buffered when a later one is read first). A process that is
abandoned before its end (an early close, a timeout) leaves the helper in an unknown state: the
helper is discarded (its channel closed, which ends it and its command on the node) and the next
command starts a new one.

Started with an exec request that does not ask for a reply (the hello is the reply), so starting
the helper costs the channel open and one turn; with the node's home remembered from an earlier
hello (remote/homecache.py), not even that: the first request goes with the start, carrying the
home it assumes, which the helper checks (exit 125 if it is not its own).
"""

from __future__ import annotations

import json
import logging
import select
import shlex
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

from cloudtrain import paths
from cloudtrain.errors import RemoteError
from cloudtrain.node.protocol import NODE_HELPER_MARK
from cloudtrain.remote.channel import CHUNK, Connection, ConnectionLostError, InputSource, lost, transfer_errors
from cloudtrain.remote.roundtrips import RoundTrips
from cloudtrain.remote.transport import SKIPPED

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("cloudtrain.remote.ssh")

HEADER = struct.Struct(">cII")
_STDERR_KEEP = 1 << 20


class HelperUnavailable(RemoteError):
    """The node could not start the helper (no python3): commands go on their own channels."""


class NotDelivered(ConnectionLostError):
    """The link failed while a request was being sent: the helper never runs a request whose
    frames did not all arrive, so it did not run and may be sent again on a new connection."""


class HomeMoved(RemoteError):
    """The node's home is not the one remembered: requests built for it were refused, none ran."""


HOME_REFUSED = 125  # the helper's exit code for a request built for another home
# NODE_HELPER_MARK (the node protocol's) is the helper's last argument (sync_helper.py reads only
# `serve` before it): how the node's watchdog knows a session that runs nothing but our helper, idle,
# for cloudtrain's own kept connection and not a user's (cloudtrain/node/signals.py ssh_activity).


def helper_source() -> str:
    return (paths.templates_dir() / "sync_helper.py").read_text()


def launch(chan: paramiko.Channel, source: str | None = None) -> None:
    """Send the exec request that starts the helper on `chan`, asking for no reply: the hello
    answers, and paramiko's exec_command would wait a turn more."""
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    command = f"exec python3 -c {shlex.quote(source or helper_source())} serve {NODE_HELPER_MARK}"
    message = Message()
    message.add_byte(cMSG_CHANNEL_REQUEST)
    message.add_int(chan.remote_chanid)
    message.add_string("exec")
    message.add_boolean(False)
    message.add_string(command)
    chan.transport._send_user_message(message)  # noqa: SLF001 - see above


class NodeHelper:
    def __init__(self, label: str, conn: Connection, chan: paramiko.Channel, counter: RoundTrips) -> None:
        self.label = label
        self.conn = conn
        self.chan = chan
        self.counter = counter
        self.home = ""
        self.commands: dict[str, bool] = {}
        self.broken = False
        self.assumed_home: str | None = None  # sent with every request until the hello confirms it
        self.moved_to: str | None = None  # the hello's home, when it was not the assumed one
        self.on_hello: Callable[[str], None] | None = None
        self.hello_timeout = 30.0
        self.owner: int | None = None  # the thread whose requests are in flight
        # Requests sent now run only if these (earlier requests) exit 0 (SSHTransport.only_if).
        self.after: tuple[HelperProcess, ...] = ()
        self._next = 1
        self._buffer = bytearray()
        self._open: deque[HelperProcess] = deque()  # started and not yet finished, in request order
        self._send_lock = threading.Lock()

    @classmethod
    def start(cls, label: str, conn: Connection, chan: paramiko.Channel, counter: RoundTrips,
              timeout: float, *, assumed_home: str | None = None,
              on_hello: Callable[[str], None] | None = None) -> NodeHelper:
        """Start the helper; wait for its hello unless `assumed_home` lets requests go first."""
        counter.sent()
        launch(chan)
        helper = cls(label, conn, chan, counter)
        helper.on_hello = on_hello
        if assumed_home is not None:
            helper.home = helper.assumed_home = assumed_home
            helper.hello_timeout = timeout
        else:
            helper._hello(timeout)
        return helper

    @classmethod
    def attach(cls, label: str, conn: Connection, chan: paramiko.Channel, counter: RoundTrips, timeout: float, *,
               on_hello: Callable[[str], None] | None = None) -> NodeHelper:
        """A helper started earlier by someone else (remote/mux.py): its hello is the first frame
        and is already on its way, so reading it here waits for no turn of the node's."""
        helper = cls(label, conn, chan, counter)
        helper.on_hello = on_hello
        helper._hello(timeout)
        return helper

    @property
    def hello_pending(self) -> bool:
        return not self.commands and not self.broken

    def ensure_hello(self) -> None:
        """Read the hello now (it is the first frame), e.g. for the commands it lists."""
        if self.hello_pending:
            self._hello(self.hello_timeout)

    # ------------------------------------------------------------------ use

    @property
    def alive(self) -> bool:
        return not self.broken and not self.chan.closed and self.conn.alive()

    @property
    def idle(self) -> bool:
        """Alive with nothing in flight: another transport may take it over (remote/muxlink.py park)."""
        return self.alive and not self._open and not self.hello_pending

    def usable_by(self, thread: int) -> bool:
        return self.alive and (self.owner in (None, thread))

    def submit(self, argv: Sequence[str], *, input: InputSource | None = None, timeout: float | None = None,
               what: str = "") -> HelperProcess:
        """Send one request; nothing is awaited (read the process for its answer)."""
        rid = self._next
        self._next += 1
        self.owner = threading.get_ident()
        proc = HelperProcess(self, rid, what or f"running {argv[0]!r}",
                             None if timeout is None else timeout + 3)
        self._open.append(proc)
        request: dict[str, object] = {"argv": [str(a) for a in argv], "timeout": timeout}
        return self._submit(request, proc, input, what)

    def submit_op(self, op: str, root: str, input: bytes, what: str = "", *, expect: bool = False) -> HelperProcess:
        """A one-shot sync_helper.py operation (manifest, verify) served in the helper's own process.
        `expect`: a manifest whose input pairs each name with the record expected; exit 0 if all match."""
        rid = self._next
        self._next += 1
        self.owner = threading.get_ident()
        proc = HelperProcess(self, rid, what or op, None)
        self._open.append(proc)
        request: dict[str, object] = {"op": op, "root": root}
        if expect:
            request["expect"] = True
        return self._submit(request, proc, input, what)

    def _submit(self, request: dict[str, object], proc: HelperProcess, input: InputSource | None,
                what: str) -> HelperProcess:
        rid = proc.rid
        if self.assumed_home is not None:
            request["home"] = self.assumed_home
        if self.after:
            # A request of an earlier helper (discarded since) is unknown to this one: id 0 (never a
            # request's) makes the node skip, never run unchecked.
            request["after"] = [p.rid if p.helper is self else 0 for p in self.after]
            proc.after = self.after
        header = json.dumps(request).encode()
        frames = [HEADER.pack(b"R", rid, len(header)) + header]
        if input is None:
            frames.append(HEADER.pack(b"E", rid, 0))
            self._send(b"".join(frames), what)
        elif isinstance(input, (bytes, bytearray, memoryview)):
            view = memoryview(input)
            for start in range(0, len(view), CHUNK):
                piece = view[start : start + CHUNK]
                frames.append(HEADER.pack(b"I", rid, len(piece)) + piece)
            frames.append(HEADER.pack(b"E", rid, 0))
            self._send(b"".join(frames), what)
        else:
            self._send(frames[0], what)
            proc.writer = threading.Thread(target=self._feed, args=(rid, input), daemon=True,
                                           name=f"ssh-helper-stdin-{rid}")
            proc.writer.start()
        return proc

    def discard(self) -> None:
        """Close the helper's channel: on the node it ends its command and exits."""
        self.broken = True
        try:
            self.chan.close()
        except transfer_errors() as exc:  # the connection is gone already: so is the helper
            log.debug("%s: closing the helper channel: %s", self.label, exc)

    # ------------------------------------------------------------------ wire

    def _send(self, data: bytes, what: str) -> None:
        try:
            with self._send_lock:
                self.counter.sent()
                self.chan.sendall(data)
        except transfer_errors() as exc:
            self.discard()
            said = lost(self.label, what or "sending a command", exc)
            raise NotDelivered(said.message, hint=said.hint) from None

    def _feed(self, rid: int, source: IO[bytes]) -> None:
        try:
            while chunk := source.read(CHUNK):
                with self._send_lock:
                    self.counter.sent()
                    self.chan.sendall(HEADER.pack(b"I", rid, len(chunk)) + chunk)
            with self._send_lock:
                self.chan.sendall(HEADER.pack(b"E", rid, 0))
        except (*transfer_errors(), ValueError) as exc:
            # The connection died or the source broke: the reader sees the channel end and says so.
            log.debug("%s: helper input %d not fully delivered: %s", self.label, rid, exc)
            self.discard()

    def _hello(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        frame = self._frame(deadline, "starting the node helper")
        self._take_hello(frame)

    def _take_hello(self, frame: tuple[bytes, int, bytes] | None) -> None:
        if frame is None or frame[0] != b"H":
            said = b""
            while self.chan.recv_stderr_ready():
                said += self.chan.recv_stderr(CHUNK)
            self.discard()
            raise HelperUnavailable(f"{self.label}: no node helper ({said.decode(errors='replace').strip()[-200:]})")
        hello = json.loads(frame[2])
        home = str(hello.get("home") or "")
        self.commands = {str(k): bool(v) for k, v in dict(hello.get("commands") or {}).items()} or {"python3": True}
        if self.assumed_home is not None and home != self.assumed_home:
            self.moved_to = home
        else:
            self.home = home
        if self.on_hello is not None and home.startswith("/"):
            self.on_hello(home)

    def _frame(self, deadline: float | None, what: str) -> tuple[bytes, int, bytes] | None:
        """The next frame from the node; None at the channel's end."""
        while True:
            if len(self._buffer) >= HEADER.size:
                kind, rid, size = HEADER.unpack_from(self._buffer)
                if len(self._buffer) >= HEADER.size + size:
                    payload = bytes(self._buffer[HEADER.size : HEADER.size + size])
                    del self._buffer[: HEADER.size + size]
                    return kind, rid, payload
            if not self._fill(deadline, what):
                return None

    def _fill(self, deadline: float | None, what: str) -> bool:
        chan = self.chan
        waited = False
        while True:
            try:
                if chan.recv_stderr_ready():
                    log.debug("%s: node helper said: %s", self.label, chan.recv_stderr(CHUNK)[-500:])
                    continue
                if chan.recv_ready():
                    self._buffer += chan.recv(CHUNK)
                    if not waited:
                        self.counter.answered(what)
                    return True
            except transfer_errors() as exc:
                self.discard()
                raise lost(self.label, what, exc) from None
            if chan.eof_received or chan.closed:
                if chan.recv_ready():
                    continue
                if not self.conn.alive():
                    self.discard()
                    raise lost(self.label, what, self.conn.exception())
                return False
            if not waited:
                self.counter.waiting(what)
                waited = True
            if deadline is not None and time.monotonic() > deadline:
                self.discard()
                raise RemoteError(f"{self.label}: {what} timed out")
            if not self.conn.alive():
                self.discard()
                raise lost(self.label, what, self.conn.exception())
            limit = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                select.select([chan], [], [], limit)
            except (OSError, ValueError) as exc:
                self.discard()
                raise lost(self.label, what, exc) from None

    def _pump(self, proc: HelperProcess) -> None:
        """Read one frame for whichever open process it belongs to (in order, earlier ones first)."""
        if self.hello_pending:
            # The first frame is the hello; a channel that ends before it never ran the helper.
            self._take_hello(self._frame(proc.deadline, proc.what))
            return
        frame = self._frame(proc.deadline, proc.what)
        if frame is None:
            self.discard()
            raise RemoteError(f"{self.label}: the node helper ended while {proc.what}",
                              hint="the next command starts a new one")
        kind, rid, payload = frame
        owner = next((p for p in self._open if p.rid == rid), None)
        if owner is None:
            self.discard()
            raise RemoteError(f"{self.label}: the node helper answered an unknown request {rid}")
        if kind == b"O":
            owner.out.append(payload)
        elif kind == b"X":
            owner.err += payload
            del owner.err[:-_STDERR_KEEP]
        elif kind in (b"C", b"S"):
            owner.code = int(payload or b"255") if kind == b"C" else SKIPPED
            if owner.code == HOME_REFUSED and self.moved_to is not None:
                owner.moved_to = self.moved_to
            self._open.remove(owner)
            if not self._open:
                self.owner = None


class HelperProcess:
    """One command run by the helper; the RemoteProcess interface (read, wait, close, stderr)."""

    def __init__(self, helper: NodeHelper, rid: int, what: str, timeout: float | None) -> None:
        self.helper = helper
        self.rid = rid
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.out: deque[bytes] = deque()
        self.err = bytearray()
        self.code: int | None = None
        self.moved_to: str | None = None
        self.writer: threading.Thread | None = None
        self.after: tuple[HelperProcess, ...] = ()  # runs only if these exit 0

    @property
    def conn(self) -> Connection:
        return self.helper.conn

    @property
    def stderr(self) -> bytes:
        return bytes(self.err)

    def stderr_tail(self) -> str:
        text = self.err.decode(errors="replace").strip()
        return text.splitlines()[-1] if text else ""

    def read(self, size: int = CHUNK) -> bytes:
        while not self.out:
            if self.code is not None:
                if self.moved_to is not None:
                    self.wait()  # raises HomeMoved
                return b""
            self._pump()
        chunk = self.out.popleft()
        if len(chunk) > size:
            self.out.appendleft(chunk[size:])
            chunk = chunk[:size]
        return chunk

    def read_all(self) -> bytes:
        chunks = []
        while chunk := self.read():
            chunks.append(chunk)
        return b"".join(chunks)

    def wait(self) -> int:
        while self.code is None:
            self._pump()
        if self.moved_to is not None:
            raise HomeMoved(f"{self.helper.label}: the node's home directory is {self.moved_to}, not "
                            f"{self.helper.assumed_home} as when cloudtrain last saw it; nothing was run",
                            hint="run the command again (the new home is remembered)")
        if self.writer is not None:
            self.writer.join(timeout=5)
        return self.code

    def close(self) -> None:
        if self.code is None and any(p.code not in (None, 0) for p in self.after):
            # The node skips it (a check it was sent after failed): that answer is on its way.
            while self.code is None:
                self._pump()
        if self.code is None:
            # Abandoned mid-way: what the helper still sends for it would confuse the next reader.
            self.helper.discard()

    def _pump(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.helper.discard()
            raise RemoteError(f"{self.helper.label}: {self.what} timed out after {self.timeout}s")
        self.helper._pump(self)  # noqa: SLF001 - the two classes are one mechanism
