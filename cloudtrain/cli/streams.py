"""Standard output and error that can go away without taking the command with them.

`cloudtrain run ... | head -3`, `| tee log` then Ctrl-C, a closed terminal: the reader of our
stdout or stderr is gone and the next print raises BrokenPipeError (EPIPE; EIO for a terminal that
hung up). A print must never be what stops collect, teardown or run.json: a VM left running costs
money, a lost line costs nothing. So each stream is wrapped once, at the start of every command:
the first failed write marks the stream dead, points its descriptor at /dev/null (children we start
later, and the interpreter's last flush at exit, then write nowhere instead of failing), and keeps
what was not shown, bounded, so that `run` can leave it in the run directory (`keep_in`).
"""

from __future__ import annotations

import errno
import io
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import TextIO

# A dead stream keeps at most this many of its last writes for the run directory.
_KEPT_WRITES = 5000
# EPIPE: the pipe's reader exited. EIO, ENXIO: the terminal hung up (SIGHUP, a closed window).
_GONE = frozenset({errno.EPIPE, errno.EIO, errno.ENXIO})


class GuardedStream(io.TextIOBase):
    """A text stream that stops writing, instead of raising, once its reader is gone."""

    def __init__(self, stream: TextIO, name: str) -> None:
        super().__init__()
        self._stream = stream
        self.name_ = name
        self.lost_at: float | None = None
        self.reason = ""
        self.kept: deque[str] = deque(maxlen=_KEPT_WRITES)

    # What Click and rich ask of a text stream.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._stream, "errors", None)

    @property
    def buffer(self):  # noqa: ANN201 - the wrapped stream's binary buffer, for callers that write bytes
        return self._stream.buffer

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        if self.lost_at is not None:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        return True

    @property
    def dead(self) -> bool:
        return self.lost_at is not None

    def write(self, text: str) -> int:
        if self.lost_at is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if not _reader_gone(exc):
                    raise
                self._lose(exc)
        self.kept.append(text)
        return len(text)

    def flush(self) -> None:
        if self.lost_at is not None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            if not _reader_gone(exc):
                raise
            self._lose(exc)

    def _lose(self, exc: OSError) -> None:
        self.lost_at = time.time()
        self.reason = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        # What the stream still buffers can never be written: drop it with the descriptor's reader.
        _point_at_devnull(self._stream)


def _reader_gone(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno in _GONE


def _point_at_devnull(stream: TextIO) -> None:
    """The stream's descriptor now writes to /dev/null: what is still buffered in it, the
    interpreter's flush at exit and any child that inherits the descriptor write nowhere."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return  # not backed by a descriptor (a test's StringIO): nothing outlives this process
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _ensure_descriptors() -> None:
    """A command started with stdout or stderr closed (`cloudtrain run r.yaml >&-`): the first file
    we open would take descriptor 1 or 2 and whatever a child prints would land in it (the state
    database included). Each missing one is opened on /dev/null first."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def install() -> None:
    """Guard sys.stdout and sys.stderr for the rest of this process (idempotent)."""
    _ensure_descriptors()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, GuardedStream):
            continue
        if stream is None:  # Python found the descriptor closed at start
            stream = open(os.devnull, "w", encoding="utf-8")
        setattr(sys, name, GuardedStream(stream, name))


def lost() -> list[GuardedStream]:
    """The guarded streams whose reader went away, in the order stdout, stderr."""
    return [s for s in (sys.stdout, sys.stderr) if isinstance(s, GuardedStream) and s.dead]


def keep_in(path: Path) -> Path | None:
    """Write what could not be shown (each lost stream's writes since it went away) to `path`.
    Returns the path, or None when nothing was lost."""
    gone = lost()
    if not gone:
        return None
    with open(path, "a", encoding="utf-8") as out:
        for stream in gone:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stream.lost_at or time.time()))
            out.write(f"--- {stream.name_} went away at {when} ({stream.reason}); what cloudtrain wrote to it after:\n")
            out.write("".join(stream.kept))
            if stream.kept and not stream.kept[-1].endswith("\n"):
                out.write("\n")
    return path
