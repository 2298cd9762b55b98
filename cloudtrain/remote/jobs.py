"""Detached jobs on a node through any Transport, driving templates/runner.sh."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain import paths
from cloudtrain.errors import RemoteCommandError, RemoteError
# The job's states are the node's (runner.sh writes them; cloudtrain/node/jobs.py reads them): one definition.
from cloudtrain.node.protocol import JobState
from cloudtrain.remote.transport import SKIPPED, Skipped, Transport

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.LOST})
OPEN_STATES = frozenset({JobState.PENDING, JobState.RUNNING})


@dataclass(frozen=True)
class NodeLayout:
    """Where cloudtrain's files live on a node: ~/.cloudtrain/<cluster>/..."""

    root: str

    @classmethod
    def for_cluster(cls, transport: Transport, cluster: str) -> NodeLayout:
        return cls(f"{transport.home}/.cloudtrain/{cluster}")

    @property
    def runner(self) -> str:
        return f"{self.root}/runtime/runner.sh"

    @property
    def runtime(self) -> str:
        return f"{self.root}/runtime"

    @property
    def workdir(self) -> str:
        return f"{self.root}/workdir"

    def job_dir(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}"


@dataclass(frozen=True)
class JobStatus:
    state: str  # pending | running | succeeded | failed | killed | lost
    pid: int | None
    exit_code: int | None
    started_at: float | None
    ended_at: float | None
    log_bytes: int

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def install_runtime(transport: Transport, layout: NodeLayout) -> None:
    runner = (paths.templates_dir() / "runner.sh").read_bytes()
    transport.put_file(runner, layout.runner, mode=0o755)


def env_script(env: Mapping[str, str]) -> bytes:
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    return ("\n".join(lines) + "\n").encode()


DEADLINE_ENV = "CLOUDTRAIN_DEADLINE_S"


def submit(transport: Transport, layout: NodeLayout, job_id: str, script: str, env: Mapping[str, str],
           deadline_s: float | None = None) -> int:
    """Write the job's files and start it detached; return its pid (process group id).

    `deadline_s` (default: the job's CLOUDTRAIN_DEADLINE_S, if set): the node ends the job after that
    many seconds (whole, rounded down) even if the CLI is gone; it then fails with exit code 124."""
    return start_submit(transport, layout, job_id, script, env, deadline_s)()


@dataclass(frozen=True)
class Resent:
    """What a start's answer returns when the node skipped it and it was sent again (run/attach.py):
    the follow sent with the skipped start was skipped too; ask it again, then read `answer`."""

    answer: Callable[[], int]


def pipelining(transport: Transport) -> bool:
    """Whether requests started one after the other reach the node in order and are answered in
    order (the node helper): only then may a request go before the answer to the one it depends on."""
    check = getattr(transport, "pipelining", None)
    return bool(check is not None and check())


def start_submit(transport: Transport, layout: NodeLayout, job_id: str, script: str, env: Mapping[str, str],
                 deadline_s: float | None = None) -> Callable[[], int]:
    """submit, sent now; the returned call waits for the pid. When the transport pipelines, what is
    asked before calling it (the follow of the job's log) goes to the node in the same round trip
    and runs after the start."""
    job_dir = layout.job_dir(job_id)
    deadline = _deadline(deadline_s if deadline_s is not None else env.get(DEADLINE_ENV))
    # env.sh, cmd.sh and the start in one round trip (the edit-run loop pays for every one): both
    # files arrive as one input, split on the node. The job starts only if all of it arrived: a
    # pipe closed early (Ctrl-C, a dropped link) looks like a short input to `cat`, and a truncated
    # job must never run. umask 077: env.sh may hold secrets from the recipe's envs.
    env_bytes = env_script({"CLOUDTRAIN_WORKDIR": layout.workdir, **env})
    body = env_bytes + script.encode()
    start = ('umask 077 && mkdir -p "$1" && cat > "$1/in.part" && [ "$(wc -c < "$1/in.part")" -eq "$3" ] '
             '&& head -c "$6" "$1/in.part" > "$1/env.sh" && tail -c +"$(($6 + 1))" "$1/in.part" > "$1/cmd.sh" '
             '&& rm -f "$1/in.part" && exec sh "$2" start "$1" "$4" "$5"')
    argv = ["sh", "-c", start, "sh", job_dir, layout.runner, str(len(body)), str(KILL_GRACE_S), str(deadline or ""),
            str(len(env_bytes))]
    if not pipelining(transport):
        text = transport.run(argv, input=body, what="starting the job").text
        return lambda: _pid(transport.label, text)
    proc = transport.start(shlex.join(argv), input=body, what="starting the job")  # type: ignore[attr-defined]

    def finish() -> int:
        try:
            out = proc.read_all().decode(errors="replace")
            code = proc.wait()
        finally:
            proc.close()
        if code == SKIPPED:
            raise Skipped(f"{transport.label}: the job's start was skipped (a check it was sent with failed)")
        if code != 0:
            raise RemoteCommandError(argv, code, proc.stderr.decode(errors="replace"))
        return _pid(transport.label, out)

    return finish


def _pid(label: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise RemoteError(f"{label}: runner printed {text!r} instead of a pid") from None


def _deadline(value: float | str | None) -> int | None:
    """Whole seconds (at least 1) for the runner, or None for no deadline."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        from cloudtrain.errors import UsageError

        raise UsageError(f"{DEADLINE_ENV} must be a number of seconds, got {value!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        from cloudtrain.errors import UsageError

        raise UsageError(f"{DEADLINE_ENV} must be more than 0 seconds, got {value!r}")
    return max(1, int(seconds))


def status(transport: Transport, layout: NodeLayout, job_id: str) -> JobStatus:
    result = transport.run(["sh", layout.runner, "status", layout.job_dir(job_id)], what="checking the job's state")
    return parse_status(transport.label, result.text)


def parse_status(label: str, text: str) -> JobStatus:
    """runner.sh status's JSON line as a JobStatus; anything else is a RemoteError."""
    try:
        data = json.loads(text)
        return JobStatus(
            state=data["state"],
            pid=data["pid"],
            exit_code=data["exit_code"],
            started_at=data["started_at"],
            ended_at=data["ended_at"],
            log_bytes=int(data["log_bytes"]),
        )
    except (ValueError, RecursionError, KeyError, TypeError):  # the node's answer is data, never trusted
        raise RemoteError(f"{label}: unreadable job status {text[:300]!r}") from None


# Seconds a job gets between TERM and KILL; the runner waits a little longer for the supervisor.
KILL_GRACE_S = 10


def kill(transport: Transport, layout: NodeLayout, job_id: str, grace_s: int = KILL_GRACE_S) -> JobStatus | None:
    """End the job and every process it started (TERM, then KILL after grace_s); idempotent.

    Returns how it ended, read in the same round trip (None: the node has no such job)."""
    result = transport.run(["sh", layout.runner, "kill", layout.job_dir(job_id), str(grace_s)],
                           timeout=grace_s + 30, what="stopping the job")
    text = result.text.strip()
    return parse_status(transport.label, text.splitlines()[-1]) if text else None


def kill_all(transport: Transport, layout: NodeLayout, grace_s: int = KILL_GRACE_S) -> None:
    """End every job of the cluster on this node (`down`, `cancel --all`)."""
    script = '[ -f "$1" ] || exit 0; exec sh "$1" kill-all "$2" "$3"'
    transport.run(["sh", "-c", script, "sh", layout.runner, f"{layout.root}/jobs", str(grace_s)], timeout=None,
                  what="stopping the cluster's jobs")


def end_all(transport: Transport, layout: NodeLayout, *, remove: bool, grace_s: int = KILL_GRACE_S) -> None:
    """`down` on a machine that outlives the cluster: the runner (the node may never have had ours),
    every job of the cluster ended, then (`remove`) the cluster's files gone. Through the node helper
    all three go in one round trip, each sent `only_if` the ones before it succeeded: a file is never
    removed under a job that was not ended."""
    kill_script = '[ -f "$1" ] || exit 0; exec sh "$1" kill-all "$2" "$3"'
    kill_argv = ["sh", "-c", kill_script, "sh", layout.runner, f"{layout.root}/jobs", str(grace_s)]
    remove_argv = ["rm", "-rf", layout.root]
    if not pipelining(transport):
        install_runtime(transport, layout)
        transport.run(kill_argv, timeout=None, what="stopping the cluster's jobs")
        if remove:
            transport.run(remove_argv, what="removing cloudtrain's files")
        return
    t: Any = transport  # an SSHTransport with its node helper (pipelining)
    runner = (paths.templates_dir() / "runner.sh").read_bytes()
    steps = [(["put", layout.runner], t.start_put_file(runner, layout.runner, mode=0o755))]
    t.only_if([p for _, p in steps])
    steps.append((kill_argv, t.start(shlex.join(kill_argv), what="stopping the cluster's jobs")))
    if remove:
        t.only_if([p for _, p in steps])
        steps.append((remove_argv, t.start(shlex.join(remove_argv), what="removing cloudtrain's files")))
    t.only_if(())
    failed = None
    for argv, proc in steps:
        try:
            proc.read_all()
            code = proc.wait()
        finally:
            proc.close()
        if code != SKIPPED and code != 0 and failed is None:
            failed = RemoteCommandError(argv, code, proc.stderr.decode(errors="replace"))
    if failed is not None:
        raise failed


LOG, EVENTS = b"L", b"P"  # what a piece of a follow is: the job's log, or its progress events


class Deframer:
    """runner.sh follow's framed output ("L N\\n" or "P N\\n", then N bytes) as (kind, bytes) pieces.
    A frame's bytes may come over several chunks: each part is given as it comes."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._head = b""
        self._kind = LOG
        self._left = 0

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, bytes]]:
        while chunk:
            if self._left:
                part, chunk = chunk[: self._left], chunk[self._left :]
                self._left -= len(part)
                yield self._kind, part
                continue
            end = chunk.find(b"\n")
            if end < 0:
                self._head += chunk
                if len(self._head) > 32:
                    raise RemoteError(f"{self.label}: unreadable job follow: {self._head[:40]!r}")
                return
            head, chunk = self._head + chunk[:end], chunk[end + 1 :]
            self._head = b""
            kind, _, size = head.partition(b" ")
            if kind not in (LOG, EVENTS) or not size.isdigit():
                raise RemoteError(f"{self.label}: unreadable job follow: {head[:40]!r}")
            self._kind, self._left = kind, int(size)

    def close(self) -> None:
        """The follow ended: a frame cut short means the node's files changed under it."""
        if self._left or self._head:
            raise RemoteError(f"{self.label}: the job follow ended inside a frame")


def _follow_argv(layout: NodeLayout, job_id: str, offset: int, events: int | None) -> list[str]:
    argv = ["sh", layout.runner, "follow", layout.job_dir(job_id), str(offset)]
    return argv if events is None else [*argv, str(events)]


def _pieces(label: str, chunks: Iterator[bytes], events: int | None) -> Iterator[tuple[bytes, bytes]]:
    if events is None:
        for chunk in chunks:
            yield LOG, chunk
        return
    deframer = Deframer(label)
    for chunk in chunks:
        yield from deframer.feed(chunk)
    deframer.close()


def stream_log(transport: Transport, layout: NodeLayout, job_id: str, offset: int,
               events: int | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The job's log from byte `offset`, as it is written, until the job is over (runner.sh follow),
    as (LOG, bytes) pieces; with `events` (a byte offset) its progress events too, as (EVENTS, bytes)."""
    chunks = transport.stream(_follow_argv(layout, job_id, offset, events), what="following the job log")
    return _pieces(transport.label, chunks, events)


@dataclass(frozen=True)
class LogFollow:
    pieces: Iterator[tuple[bytes, bytes]]  # (LOG or EVENTS, bytes) from the offsets until the job is over
    final: Callable[[], JobStatus]  # then its state (asked with the follow)
    abort: Callable[[], None]  # give up before reading (the caller's own error)


def follow_log(transport: Transport, layout: NodeLayout, job_id: str, offset: int,
               events: int | None = None) -> LogFollow:
    """stream_log and the job's status once it ends, asked together: over the node helper the
    status request goes with the follow and is answered right after it (no extra round trip).
    Read the stream to its end before asking the status."""
    if not pipelining(transport):
        return LogFollow(stream_log(transport, layout, job_id, offset, events),
                         lambda: status(transport, layout, job_id), lambda: None)
    start = transport.start  # type: ignore[attr-defined]
    job_dir = layout.job_dir(job_id)
    follower = start(shlex.join(_follow_argv(layout, job_id, offset, events)), what="following the job log")
    asked = start(shlex.join(["sh", layout.runner, "status", job_dir]), what="checking the job's state")

    def chunks() -> Iterator[bytes]:
        try:
            while chunk := follower.read():
                yield chunk
            code = follower.wait()
        finally:
            follower.close()
        if code != 0:
            raise RemoteError(f"{transport.label}: following the job log failed (exit {code}): "
                              f"{follower.stderr_tail()}")

    def final() -> JobStatus:
        try:
            text = asked.read_all().decode(errors="replace")
            code = asked.wait()
        finally:
            asked.close()
        if code != 0:
            raise RemoteError(f"{transport.label}: checking the job's state failed (exit {code})")
        return parse_status(transport.label, text)

    def abort() -> None:
        follower.close()
        asked.close()

    return LogFollow(_pieces(transport.label, chunks(), events), final, abort)


# Per job directory: runner.sh's status line, the log's size on a line, then that many bytes of it.
_READ_LOGS = r"""
runner=$1; shift
for d in "$@"; do
  sh "$runner" status "$d" || exit 1
  size=$(wc -c < "$d/log" 2>/dev/null || echo 0)
  echo "$size"
  [ "$size" -gt 0 ] && head -c "$size" "$d/log"
done
exit 0
"""


def read_logs(transport: Transport, layout: NodeLayout, job_ids: Sequence[str]) -> dict[str, tuple[JobStatus, bytes]]:
    """Each job's status and whole log, in one command (one round trip for all of them)."""
    result = transport.run(_read_logs_argv(layout, job_ids), what="fetching the logs")
    return _parse_logs(transport.label, result.stdout, job_ids)


def start_read_logs(transport: Transport, layout: NodeLayout,
                    job_ids: Sequence[str]) -> Callable[[], dict[str, tuple[JobStatus, bytes]]]:
    """read_logs, asked now and answered when the returned function is called: over the node helper
    the request goes with whatever is asked next, in one round trip (answers come in order)."""
    start = getattr(transport, "start", None)
    if start is None:
        return lambda: read_logs(transport, layout, job_ids)
    argv = _read_logs_argv(layout, job_ids)
    proc = start(shlex.join(argv), what="fetching the logs")

    def finish() -> dict[str, tuple[JobStatus, bytes]]:
        try:
            data = proc.read_all()
            code = proc.wait()
        finally:
            proc.close()
        if code != 0:
            raise RemoteError(f"{transport.label}: fetching the logs failed (exit {code}): {proc.stderr_tail()}")
        return _parse_logs(transport.label, data, job_ids)

    return finish


def _read_logs_argv(layout: NodeLayout, job_ids: Sequence[str]) -> list[str]:
    return ["sh", "-c", _READ_LOGS, "sh", layout.runner, *(layout.job_dir(j) for j in job_ids)]


def _parse_logs(label: str, data: bytes, job_ids: Sequence[str]) -> dict[str, tuple[JobStatus, bytes]]:
    at, found = 0, {}
    for job_id in job_ids:
        line_end = data.find(b"\n", at)
        size_end = data.find(b"\n", line_end + 1)
        if line_end < 0 or size_end < 0 or not data[line_end + 1 : size_end].strip().isdigit():
            raise RemoteError(f"{label}: unreadable log listing {data[at:at + 300]!r}")
        state = parse_status(label, data[at:line_end].decode(errors="replace"))
        size = int(data[line_end + 1 : size_end])
        log = data[size_end + 1 : size_end + 1 + size]
        if len(log) != size:
            raise RemoteError(f"{label}: the log of {job_id} arrived cut short ({len(log)} of {size} bytes)")
        found[job_id] = (state, log)
        at = size_end + 1 + size
    return found


LOG_CHUNK = 1 << 20


def poll(transport: Transport, layout: NodeLayout, job_id: str, offset: int, limit: int = LOG_CHUNK,
         events: int | None = None) -> tuple[JobStatus, bytes, bytes]:
    """The job's status, then up to `limit` bytes of its log from `offset`, in one command. The
    status is read first: when it says finished, a short read is the whole rest of the log. With
    `events` (a byte offset), up to `limit` bytes of its progress events from there too (else b"")."""
    job_dir = layout.job_dir(job_id)
    # The events first, after their size on a line: the log's bytes run to the end of the answer.
    script = ('sh "$1" status "$2" || exit 1; '
              'if [ -n "$5" ]; then e=0; [ -f "$2/progress" ] && e=$(($(tail -c +"$5" "$2/progress" | head -c "$4" | wc -c))); '
              'echo "$e"; [ "$e" -gt 0 ] && tail -c +"$5" "$2/progress" | head -c "$e"; fi; '
              '[ -f "$2/log" ] || exit 0; tail -c +"$3" "$2/log" | head -c "$4"')
    result = transport.run(["sh", "-c", script, "sh", layout.runner, job_dir, str(offset + 1), str(limit),
                            "" if events is None else str(events + 1)], what="checking the job")
    line, _, data = result.stdout.partition(b"\n")
    state = parse_status(transport.label, line.decode(errors="replace"))
    if events is None:
        return state, data, b""
    size, _, data = data.partition(b"\n")
    if not size.strip().isdigit() or len(data) < int(size):
        raise RemoteError(f"{transport.label}: unreadable job events {size[:40]!r}")
    return state, data[int(size):], data[: int(size)]


def read_log(transport: Transport, layout: NodeLayout, job_id: str, offset: int, limit: int = LOG_CHUNK) -> bytes:
    """Up to `limit` bytes of the job's log starting at byte `offset` (empty when nothing new)."""
    log = f"{layout.job_dir(job_id)}/log"
    # tail -c +N is 1-based; head bounds one read so a huge log streams in chunks.
    script = 'f="$1"; [ -f "$f" ] || exit 0; tail -c +"$2" "$f" | head -c "$3"'
    result = transport.run(["sh", "-c", script, "sh", log, str(offset + 1), str(limit)], what="reading the job log")
    return result.stdout
