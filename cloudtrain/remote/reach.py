"""Why a node could not be reached, in words (refused, unreachable, unknown name, no SSH server),
and the lines a long connect wait prints: split from ssh.py, which opens the connections."""

from __future__ import annotations

import logging
import socket

from cloudtrain.remote.channel import describe

log = logging.getLogger("cloudtrain.remote.ssh")

# Waiting for SSH: silent for a few seconds (a VM's sshd coming up), then a line saying what for.
WAIT_NOTICE_S = 5.0
WAIT_REPEAT_S = 30.0
_CHECK_HOST = "check the address and port (a typo?), that the machine is on and sshd runs, and that no firewall drops the port"


class WaitNotice:
    """The lines a long connect wait prints: what it waits for, how long so far, the last error."""

    def __init__(self, what: str, budget: float) -> None:
        self.what = what
        self.budget = budget
        self.next_at = WAIT_NOTICE_S
        self.said = False

    def tick(self, waited: float, last: str) -> None:
        if waited < self.next_at or self.budget - waited < 1:
            return
        log.warning("waiting for %s: %.0fs of up to %.0fs (a new machine may still be booting); last: %s",
                    self.what, waited, self.budget, last)
        self.said = True
        self.next_at = waited + WAIT_REPEAT_S

    def slow_attempt(self, timeout: float) -> None:
        """From a timer: the first attempt has had no answer for WAIT_NOTICE_S."""
        log.warning("waiting for %s: no answer after %.0fs (this attempt gives up after %.0fs)",
                    self.what, WAIT_NOTICE_S, timeout)
        self.said = True
        self.next_at = WAIT_NOTICE_S + WAIT_REPEAT_S

    def done(self) -> None:
        if self.said:
            log.warning("%s answered", self.what)


def socket_failure(exc: OSError, timeout: float) -> tuple[str, str]:
    """(what happened, what to check) for a TCP connect that failed: refused, unreachable, unknown name."""
    if isinstance(exc, socket.gaierror):
        return f"unknown host name ({exc.strerror or exc})", "check the address in the recipe's hosts (a typo?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)", _CHECK_HOST
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"unreachable: no answer within {timeout:g}s", _CHECK_HOST
    return f"unreachable: {exc.strerror or describe(exc)}", _CHECK_HOST


def handshake_failure(exc: BaseException, timeout: float, answered: bool = True,
                      elapsed: float | None = None) -> tuple[str, str]:
    """(what happened, what to check) for an SSH handshake that failed after TCP connected.
    `elapsed`: how long the attempt took; a failure well before the timeout was no silence."""
    import paramiko  # loaded already: the handshake was paramiko's

    if isinstance(exc, OSError) and not isinstance(exc, paramiko.SSHException):
        return socket_failure(exc, timeout)
    text = describe(exc)
    quick = elapsed is not None and elapsed < 0.8 * timeout
    if not answered and quick and (isinstance(exc, EOFError) or "banner" in text.lower()):
        # It answered at once, and not with "SSH-2.0-...": another server (HTTP, a proxy, a
        # database) on that port, which replied to our greeting and hung up.
        return (f"the port answered within {elapsed:.1f}s, but not as an SSH server (something else listens "
                "there: a web server, a proxy?)", "check that the port is the machine's SSH port (usually 22)")
    if not answered and not isinstance(exc, EOFError) or "banner" in text.lower():
        return (f"no SSH server answered within {timeout:g}s: the port accepts connections but says nothing",
                "check that the address and port are the machine's SSH port (a typo?)")
    return f"SSH handshake failed: {text}", "is the machine up, sshd running and the port open to you?"
