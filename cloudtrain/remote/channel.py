"""One command on an SSH exec channel: stdout read by the caller, stderr collected, stdin fed.

Split from ssh.py, which manages connections; this module only needs a channel and a way to ask
whether its connection is still alive.
"""

from __future__ import annotations

import io
import logging
import select
import threading
import time
import sys
from typing import IO, TYPE_CHECKING, Protocol

from cloudtrain.errors import RemoteError
from cloudtrain.remote.roundtrips import RoundTrips

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("cloudtrain.remote.ssh")

CHUNK = 1 << 18
_STDERR_KEEP = 1 << 20

InputSource = bytes | bytearray | memoryview | IO[bytes]


class SSHConnectError(RemoteError):
    """The node could not be reached (refused, timed out, no route, proxy failed)."""


class SSHAuthError(RemoteError):
    """The node answered but refused our key."""


class ConnectionLostError(RemoteError):
    """The connection dropped while a command was running; the command's outcome is unknown."""


def lost(label: str, doing: str, exc: BaseException | None, hint: str | None = None) -> ConnectionLostError:
    reason = describe(exc)
    return ConnectionLostError(
        f"{label}: connection lost while {doing}" + (f": {reason}" if reason else ""),
        hint=hint or "the connection is opened again on the next command",
    )


def describe(exc: BaseException | None) -> str:
    """An exception as words; paramiko raises some (EOFError, socket errors) with no message."""
    if exc is None:
        return ""
    text = str(exc).strip()
    return text or {"EOFError": "the other end closed the connection"}.get(type(exc).__name__, type(exc).__name__)


def transfer_errors() -> tuple[type[BaseException], ...]:
    """What paramiko and the socket layer raise when a link drops mid-transfer: EOFError from a
    window adjust on a reset socket, SSHException from the transport, OSError/socket.timeout from the
    socket. paramiko's only once it is loaded: a command served by the node's mux (remote/mux.py)
    never imports it (~0.07 s of its start), so it cannot meet one."""
    ssh = sys.modules.get("paramiko")
    # Another thread may be importing it right now (a node of the same command connecting itself):
    # a module still being initialized has no SSHException yet, and none can have come from it here.
    error = getattr(ssh, "SSHException", None)
    return (EOFError, OSError) if error is None else (EOFError, error, OSError)


class Connection(Protocol):
    def alive(self) -> bool: ...

    def exception(self) -> BaseException | None: ...


class RemoteProcess:
    """One exec channel: stdout is read by the caller, stderr is collected, stdin fed by a thread."""

    def __init__(self, label: str, conn: Connection, chan: paramiko.Channel, what: str,
                 timeout: float | None, counter: RoundTrips | None = None) -> None:
        self.label = label
        self.conn = conn
        self.chan = chan
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._stderr = bytearray()
        self._writer: threading.Thread | None = None
        self.counter = counter

    @property
    def stderr(self) -> bytes:
        return bytes(self._stderr)

    def stderr_tail(self) -> str:
        text = self._stderr.decode(errors="replace").strip()
        return text.splitlines()[-1] if text else ""

    def feed(self, source: InputSource) -> None:
        # Counted as sent here, before the caller's first wait: the writer thread may first run
        # after that wait (a loaded machine) and the answer come within it, and the turn was lost.
        if self.counter is not None:
            self.counter.sent()
        self._writer = threading.Thread(target=self._write, args=(source,), name=f"ssh-stdin-{self.what}", daemon=True)
        self._writer.start()

    def _write(self, source: InputSource) -> None:
        try:
            if isinstance(source, (bytes, bytearray, memoryview)):
                view = memoryview(source)
                for start in range(0, len(view), CHUNK):
                    self.chan.sendall(view[start : start + CHUNK])
            else:
                while chunk := source.read(CHUNK):
                    self.chan.sendall(chunk)
            self.chan.shutdown_write()
        except transfer_errors() as exc:
            # The command exited without reading all its input, or the connection died: either
            # way the exit status (or ConnectionLostError from wait) tells the caller.
            log.debug("%s: stdin not fully delivered: %s", self.what, exc)

    def read(self, size: int = CHUNK) -> bytes:
        """Up to `size` bytes of stdout; b'' at end of output. A dropped link raises ConnectionLostError."""
        chan = self.chan
        while True:
            try:
                if chan.recv_stderr_ready():
                    self._stderr += chan.recv_stderr(CHUNK)
                    del self._stderr[:-_STDERR_KEEP]
                    continue
                if chan.recv_ready():
                    if self.counter is not None:
                        self.counter.answered(self.what)  # a turn even if it was in before this read
                    return chan.recv(size)
            except transfer_errors() as exc:
                raise lost(self.label, self.what, exc) from None
            if chan.eof_received or chan.closed:
                if chan.recv_ready() or chan.recv_stderr_ready():
                    continue
                if chan.closed and not chan.eof_received and not self.conn.alive():
                    # Closed by a dying transport, not by the command: the output is cut short.
                    raise lost(self.label, self.what, self.conn.exception())
                return b""
            self._wait_readable()

    def read_all(self) -> bytes:
        chunks = []
        while chunk := self.read():
            chunks.append(chunk)
        return b"".join(chunks)

    def wait(self) -> int:
        """Exit status of the command once its output ended."""
        while not self.chan.status_event.is_set():
            if self.counter is not None:
                self.counter.waiting(self.what)
            if not self.conn.alive():
                break
            self._check_deadline()
            self.chan.status_event.wait(0.2)
        if self._writer is not None:
            self._writer.join(timeout=5)
        code = self.chan.exit_status
        if code == -1:
            if not self.conn.alive():
                raise lost(self.label, self.what, self.conn.exception())
            # The channel closed without an exit-status: the command died from a signal.
            code = 255
        return code

    def close(self) -> None:
        self.chan.close()

    def _wait_readable(self) -> None:
        if self.counter is not None:
            self.counter.waiting(self.what)
        self._check_deadline()
        if not self.conn.alive() and not (self.chan.recv_ready() or self.chan.recv_stderr_ready()):
            if not (self.chan.eof_received or self.chan.closed):
                raise lost(self.label, self.what, self.conn.exception())
        limit = 1.0 if self.deadline is None else max(0.0, min(1.0, self.deadline - time.monotonic()))
        try:
            select.select([self.chan], [], [], limit)
        except (OSError, ValueError) as exc:
            raise lost(self.label, self.what, exc) from None

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.chan.close()
            raise RemoteError(f"{self.label}: {self.what} timed out after {self.timeout}s")


class _ProcessReader(io.RawIOBase):
    """A RemoteProcess's stdout as a file, for readers like tarfile."""

    def __init__(self, proc: RemoteProcess) -> None:
        self.proc = proc

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.proc.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)




def reader(proc: RemoteProcess) -> io.BufferedReader:
    return io.BufferedReader(_ProcessReader(proc), CHUNK)
