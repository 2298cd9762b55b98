"""Cleanup that cannot be skipped: while a command undoes what it made, INT, TERM and HUP are
reported and recorded, not obeyed, until its cloud calls are done."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_CLEANUP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _report(signum: int, frame: object) -> None:
    try:
        sys.stderr.write(f"cloudtrain: {signal_name(signum)}: cleaning up, please wait (teardown must finish)\n")
    except OSError as exc:  # the terminal is gone (SIGHUP): cleanup goes on all the same
        logging.getLogger(__name__).debug("could not report %s: %s", signal_name(signum), exc)


def defer_interrupts() -> None:
    """The command was interrupted once and is cleaning up (ending the job, collecting, tearing
    down, writing run.json, saying where the run is): from now until it exits, INT, TERM and HUP
    are reported, not obeyed. A second Ctrl-C must not cut that short anywhere, not only inside
    the cloud calls `no_interrupts` guards."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for name in _CLEANUP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _report)


@contextmanager
def no_interrupts() -> Iterator[list[int]]:
    """Cleanup must finish: INT, TERM or HUP (a closed terminal) during teardown is reported and
    recorded (the list it yields), not obeyed, until the cloud calls are done."""
    import signal
    import threading

    hits: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield hits
        return

    def note(signum: int, frame: object) -> None:
        hits.append(signum)
        try:
            sys.stderr.write(f"cloudtrain: {signal_name(signum)}: cleaning up, please wait (teardown must finish)\n")
        except OSError as exc:  # the terminal is gone (SIGHUP): cleanup goes on all the same
            logging.getLogger(__name__).debug("could not report %s: %s", signal_name(signum), exc)

    previous = {}
    for name in _CLEANUP_SIGNALS:
        if hasattr(signal, name):
            number = getattr(signal, name)
            previous[number] = signal.signal(number, note)
    try:
        yield hits
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
