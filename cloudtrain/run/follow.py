"""Following a detached job's log from the CLI: whole lines, resumable, across dropped connections."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from cloudtrain.cluster.nodes import Node
from cloudtrain.errors import JobFailedError, RemoteError
from cloudtrain.events import Reporter, parse_progress
from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import JobState
from cloudtrain.run.stop import StopToken

POLL_S = 0.5
# A job that prints without newlines must not fill the CLI's memory: a longer "line" is shown in
# pieces of this size (a node's output is data to bound, never to trust).
MAX_LINE_BYTES = 1 << 20


def follow(node: Node, job_id: str, offset: int, reporter: Reporter, *, others: Sequence[Node] = (),
           on_offset: Callable[[int], None] | None = None, raw: Callable[[str], None] | None = None,
           until_finished: bool = True, on_worker_failure: Callable[[], None] | None = None,
           submitted: Callable[[], object] | None = None, stop: StopToken | None = None,
           on_event: Callable[[dict[str, Any]], None] | None = None) -> jobs.JobStatus:
    """Stream complete log lines from `offset` until the job ends; survives dropped connections.

    Only whole lines are emitted and `on_offset` gets the byte offset just past each one, so a
    follower that is interrupted and resumed from that offset neither loses nor repeats a line.
    Lines go to `raw` verbatim, or to the reporter (progress events rendered). With `others`
    (the other nodes of a multi-node job), a failed worker ends the job: `on_worker_failure` is
    called to stop the rest, then JobFailedError is raised. `submitted` (jobs.start_submit's answer,
    not yet read) is read once the follow is asked: both go to the node in one round trip.
    `stop`: the attempt's stop token (run/stop.py). Its waits (a poll's interval, the backoff
    after a dropped link) wait on it: once it is set, the follow ends at once instead of sleeping
    on (a retry raises the error it just got, a poll raises AttemptStopped). `on_event`: the run's
    controller hears each progress event of the job (run/controller.py: the reporter only
    displays): those it appends to CLOUDTRAIN_PROGRESS_FILE, which come beside the log, and any
    protocol line it prints. Without it, no events are asked of the node.
    """
    # A Ctrl-C between printing a line and recording its offset would repeat it on resume: each
    # line is printed and recorded under _line(), and Ctrl-C is taken between lines.
    if until_finished and not others:
        with _interrupts_between_lines():
            return _follow_streaming(node, job_id, offset, reporter, on_offset, raw, submitted, stop, on_event)
    if submitted is not None:
        submitted()
    pending = b""
    last_check = 0.0
    events = _Events(on_event)
    while True:
        # The state and the log's (and events') news in one round trip; read on only while chunks come full.
        status, chunk, news = _retry(lambda: jobs.poll(node.transport, node.layout, job_id, offset + len(pending),
                                                       events=events.asked), stop=stop)
        events.feed(news)
        while chunk:
            lines, pending = split_lines(pending + chunk)
            with _interrupts_between_lines():
                offset = _emit_lines(lines, offset, node.rank, reporter, raw, on_offset, on_event)
            if len(chunk) < jobs.LOG_CHUNK:
                break
            chunk = _read_retrying(node, job_id, offset + len(pending), stop)
        if status.finished or not until_finished:
            if pending and status.finished:
                _emit(pending.decode("utf-8", errors="replace"), node.rank, reporter, raw, False)
                offset += len(pending)
                if on_offset:
                    on_offset(offset)
            return status
        if others and time.monotonic() - last_check > 2.0:
            last_check = time.monotonic()
            for other in others:
                st = jobs.status(other.transport, other.layout, job_id)
                if st.finished and st.state != JobState.SUCCEEDED:
                    # One failed worker leaves the others waiting on collectives forever.
                    if on_worker_failure is not None:
                        on_worker_failure()
                    raise JobFailedError(
                        f"job on node {other.rank} {st.state} (exit code {st.exit_code}); stopped the other nodes",
                        st.exit_code or 1,
                    )
        if pause(stop, POLL_S) and stop is not None:
            stop.check()  # the attempt was stopped while the job ran: no more polls


def _follow_streaming(node: Node, job_id: str, offset: int, reporter: Reporter,
                      on_offset: Callable[[int], None] | None, raw: Callable[[str], None] | None,
                      submitted: Callable[[], object] | None = None, stop: StopToken | None = None,
                      on_event: Callable[[dict[str, Any]], None] | None = None) -> jobs.JobStatus:
    """One command on the node streams the log as it grows and returns when the job is over: no
    poll interval on the client, the end is seen within the runner's 50 ms. A dropped link resumes
    from the last byte received."""
    pending = b""
    events = _Events(on_event)
    failures, delay = 0, 0.5
    while True:
        try:
            # The final status is asked with the follow: no round trip of its own once the job ends.
            following = jobs.follow_log(node.transport, node.layout, job_id, offset + len(pending), events.asked)
            final = following.final
            if submitted is not None:
                # The job's start was asked just before: its answer (or its error, raised as the
                # submit's own: never retried as a follow) comes first.
                answer, submitted = submitted, None
                try:
                    answered = answer()
                except BaseException as exc:
                    following.abort()
                    raise _StartFailed() from exc
                if isinstance(answered, jobs.Resent):
                    following.abort()  # skipped with the start: asked again, with the start sent again
                    submitted = answered.answer
                    continue
            for kind, chunk in following.pieces:
                if kind == jobs.EVENTS:
                    events.feed(chunk)
                    continue
                lines, pending = split_lines(pending + chunk)
                offset = _emit_lines(lines, offset, node.rank, reporter, raw, on_offset, on_event)
                failures, delay = 0, 0.5
            break
        except _StartFailed as wrapper:
            raise wrapper.__cause__ from None  # type: ignore[misc]
        except RemoteError:
            if submitted is not None:
                submitted = None
                raise  # the start was asked but its answer never read: its fate is unknown
            failures += 1
            # A stopped attempt (its machine gone, its trial pruned) retries no more: the phase
            # fails now with the error it got, not after up to 7.5 s of backoff.
            if failures >= 5 or pause(stop, delay):
                raise
            delay *= 2
    try:
        status = final()
    except RemoteError:
        status = status_retrying(node, job_id, stop)  # the link dropped just after the log ended
    if not status.finished:
        status = status_retrying(node, job_id, stop)
    if pending:
        _emit(pending.decode("utf-8", errors="replace"), node.rank, reporter, raw, False)
        offset += len(pending)
        if on_offset:
            on_offset(offset)
    return status


class _Events:
    """The job's progress events beside its log (CLOUDTRAIN_PROGRESS_FILE): whole lines go to
    `on_event`; the byte offset asked next resumes after what already came (a dropped link)."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None) -> None:
        self.on_event = on_event
        self.offset = 0
        self.pending = b""

    @property
    def asked(self) -> int | None:
        return None if self.on_event is None else self.offset + len(self.pending)

    def feed(self, data: bytes) -> None:
        if not data or self.on_event is None:
            return
        lines, self.pending = split_lines(self.pending + data)
        for line, used in lines:
            self.offset += used
            event = parse_progress(line.decode("utf-8", errors="replace"))
            if event is not None:
                self.on_event(event)


class _StartFailed(Exception):
    """Carries the job start's own error out of the follow's retry loop."""


def split_lines(data: bytes) -> tuple[list[tuple[bytes, int]], bytes]:
    """(whole lines, each with the bytes it used), and the unfinished rest.

    A line longer than MAX_LINE_BYTES comes out in pieces of that size, so the rest never grows
    past it, whatever the job prints.
    """
    lines: list[tuple[bytes, int]] = []
    start = 0
    while True:
        end = data.find(b"\n", start, start + MAX_LINE_BYTES + 1)
        if end >= 0:
            lines.append((data[start:end], end + 1 - start))
            start = end + 1
        elif len(data) - start > MAX_LINE_BYTES:
            lines.append((data[start : start + MAX_LINE_BYTES], MAX_LINE_BYTES))
            start += MAX_LINE_BYTES
        else:
            return lines, data[start:]


def _emit_lines(lines: list[tuple[bytes, int]], offset: int, rank: int, reporter: Reporter,
                raw: Callable[[str], None] | None, on_offset: Callable[[int], None] | None,
                on_event: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Emit each line and record the offset past it, one line at a time; the new offset."""
    for line, used in lines:
        with _line():
            _emit(line.decode("utf-8", errors="replace"), rank, reporter, raw, True, on_event if rank == 0 else None)
            offset += used
            if on_offset:
                on_offset(offset)
    return offset


class _LineGuard:
    """Ctrl-C is taken between lines, never between printing a line and recording its offset."""

    def __init__(self) -> None:
        self.inside = False
        self.pending = False


_guard = _LineGuard()


@contextmanager
def _line() -> Iterator[None]:
    _guard.inside = True
    try:
        yield
    finally:
        _guard.inside = False
    if _guard.pending:
        _guard.pending = False
        raise KeyboardInterrupt


@contextmanager
def _interrupts_between_lines() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if _guard.inside:
            _guard.pending = True
        else:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # the user's shell asked us to ignore Ctrl-C: keep it that way
        yield
        return
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _emit(text: str, rank: int, reporter: Reporter, raw: Callable[[str], None] | None, progress: bool = True,
          on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
    if raw is not None:
        raw(text)
        return
    event = parse_progress(text) if progress else None
    if event is None:
        reporter.log_line(text, rank)
        return
    reporter.progress(event)
    if on_event is not None:  # a job that prints the protocol instead of writing its progress file
        on_event(event)


def status_retrying(node: Node, job_id: str, stop: StopToken | None = None) -> jobs.JobStatus:
    return _retry(lambda: jobs.status(node.transport, node.layout, job_id), stop=stop)


def _read_retrying(node: Node, job_id: str, offset: int, stop: StopToken | None = None) -> bytes:
    return _retry(lambda: jobs.read_log(node.transport, node.layout, job_id, offset), stop=stop)


def _retry(fn: Callable[[], object], attempts: int = 5, stop: StopToken | None = None):  # noqa: ANN202
    """A dropped link between two polls is normal (laptop sleep, Wi-Fi roam): reconnect and go on,
    unless the attempt was stopped meanwhile (then the error it got is the attempt's last)."""
    delay = 0.5
    for attempt in range(attempts):
        try:
            return fn()
        except RemoteError:
            if attempt == attempts - 1 or pause(stop, delay):
                raise
            delay *= 2
    raise AssertionError("unreachable")


def pause(stop: StopToken | None, seconds: float) -> bool:
    """Wait `seconds` between two tries or polls; True at once when the attempt's stop token is set
    (an Event wait: a stop ends the wait, where time.sleep would sit it out). No token (a CLI's
    `logs -f`, `attach`): a plain sleep, nothing can end it but Ctrl-C."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)
