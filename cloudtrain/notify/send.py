"""Sending what the outbox holds, within a time budget.

A command that sends gives it at most `budget_s` (about a second): each target gets its own thread,
tries again with a short backoff while there is time, and whatever is not sent by then stays in
the outbox for the next command. A receiver that is slow, down or answers 500 therefore never
fails the command and delays it by at most the budget. Errors kept or shown are redacted: the
URL and secret values a delivery used never appear in them.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from cloudtrain import __version__
from cloudtrain.notify import outbox
from cloudtrain.notify.model import line
from cloudtrain.notify.outbox import Claim
from cloudtrain.notify.signing import BadSecret, headers, secret_key
from cloudtrain.notify.targets import MissingVariable, NotifyTarget, TargetRef, expand, resolve

BUDGET_S = 1.0  # what a command that sends gives it, at most (plus the state writes after)
_IN_ROUND_WAITS = (0.1, 0.3, 0.9)  # the backoff between attempts within one command's budget


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirected POST becomes a GET without the body: report it instead of following it.
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
# What this process has tried: one round per command, so that a receiver down for one command is
# tried again by the next one (outbox.next_wait_s), not used up by this command's later events.
_TRIED: set[tuple[str, str]] = set()


class Permanent(Exception):
    """Trying again within this command would not help (a 4xx, a missing ${VAR}, a bad secret)."""


@dataclass
class _Result:
    claim: Claim
    ok: bool
    attempts: int
    error: str | None
    gone: bool = False


def redact(text: str, secrets: list[str]) -> str:
    for value in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def _webhook(target: NotifyTarget, claim: Claim, timeout: float, secrets: list[str],
             on_wire: Callable[[], None]) -> None:
    try:
        url = expand(target.webhook or "")
        secret = expand(target.secret or "")
    except MissingVariable as exc:
        raise Permanent(str(exc)) from None
    secrets += [url, secret]
    try:
        key = secret_key(secret)
    except BadSecret as exc:
        raise Permanent(f"secret: {exc}") from None
    body = claim.body.encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        **headers(key, claim.event_id, int(time.time()), claim.body),
        "content-type": "application/json", "user-agent": f"cloudtrain/{__version__}"})
    on_wire()
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        code = exc.code
        exc.close()
        message = f"HTTP {code}" + (" (redirect: give the final URL)" if 300 <= code < 400 else "")
        if 400 <= code < 500 and code not in (408, 409, 425, 429):
            raise Permanent(message) from None
        raise OSError(message) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            # Nothing listens: it is down, not busy; the next command tries again, this one goes on.
            raise Permanent(str(exc.reason)) from None
        raise OSError(str(exc.reason)) from None


def _apprise(target: NotifyTarget, claim: Claim, timeout: float, secrets: list[str],
             on_wire: Callable[[], None]) -> None:
    import json
    import logging

    try:
        url = expand(target.apprise or "")
    except MissingVariable as exc:
        raise Permanent(str(exc)) from None
    secrets.append(url)
    import apprise  # the [notify] extra; imported only when an apprise target sends

    channel = apprise.Apprise()
    if not channel.add(url):
        raise Permanent("not a URL Apprise knows (https://github.com/caronc/apprise/wiki lists them)")
    for server in channel:
        server.socket_connect_timeout = server.socket_read_timeout = timeout
    envelope = json.loads(claim.body)
    on_wire()
    with apprise.LogCapture(level=logging.WARNING) as captured:
        sent = channel.notify(title=f"cloudtrain {envelope['type']}", body=line(envelope["type"], envelope["data"]))
    if not sent:
        said = [text for text in captured.getvalue().splitlines() if text.strip()]
        raise OSError(said[-1].strip()[:300] if said else "Apprise could not send it")


class _Closed(Exception):
    """The command's deadline passed before this claim was sent: it is released, not tried."""


class _Gate:
    """Which claims may be on the wire. At the deadline the command closes it and releases every
    claim not yet through: a thread that gets ready later stops there, so no claim is both
    released (the next command sends it) and sent by this one."""

    def __init__(self) -> None:
        self.through: set[str] = set()
        self.closed = False
        self.lock = threading.Lock()

    def pass_(self, key: str) -> None:
        with self.lock:
            if self.closed:
                raise _Closed
            self.through.add(key)

    def close(self) -> set[str]:
        with self.lock:
            self.closed = True
            return set(self.through)


def _deliver_all(target: NotifyTarget | None, claims: list[Claim], deadline: float,
                 results: list[_Result], started: _Gate) -> None:
    """One target's claims in order, each tried until sent or out of time (a thread). A claim is
    `started` once its bytes may be on the wire: one whose thread was still getting ready (Apprise's
    import takes seconds on a busy machine) is released at the deadline, so the next command sends
    it at once instead of after the lease."""
    for claim in claims:
        if time.monotonic() >= deadline:
            return
        key = claim.event_id + claim.target
        if target is None:
            try:
                started.pass_(key)
            except _Closed:
                return
            results.append(_Result(claim, False, 0, "target no longer configured (config or recipe changed)",
                                   gone=True))
            continue
        send = _webhook if target.webhook is not None else _apprise
        attempts, error, ok = 0, None, False
        secrets: list[str] = []  # the values this delivery used (expanded), never shown
        while True:
            attempts += 1
            try:
                send(target, claim, max(0.05, deadline - time.monotonic()), secrets, lambda: started.pass_(key))
                ok = True
                break
            except _Closed:
                return  # released by the command: the next one sends it
            except Permanent as exc:
                error = str(exc)
                break
            except Exception as exc:  # noqa: BLE001 - any failure to send is kept and tried again
                error = str(exc) or type(exc).__name__
            wait = _IN_ROUND_WAITS[min(attempts - 1, len(_IN_ROUND_WAITS) - 1)]
            if attempts > len(_IN_ROUND_WAITS) or time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        results.append(_Result(claim, ok, attempts, None if ok else redact(error or "", secrets)))


@dataclass(frozen=True)
class Flushed:
    delivered: int = 0
    failed: tuple[str, ...] = ()  # one line per delivery not made this time
    left: int = 0  # claims this command had no time for (due again at once)


def flush(store, budget_s: float = BUDGET_S, force: bool = False, again: bool = False,  # noqa: ANN001
          known: dict[str, NotifyTarget] | None = None) -> Flushed:
    """Send what is due (`force`: everything undelivered) within `budget_s`. `again`: also what
    this process tried before (a long-lived `events -f` is many rounds, each after the backoff).
    `known`: targets in hand by reference key; others are read again from their config or recipe."""
    if again:
        _TRIED.clear()
    claims = outbox.claim(store, force=force, skip=frozenset(_TRIED))
    if not claims:
        return Flushed()
    _TRIED.update((c.event_id, c.target) for c in claims)
    deadline = time.monotonic() + budget_s
    by_target: dict[str, list[Claim]] = {}
    for claim in claims:
        by_target.setdefault(claim.target, []).append(claim)
    results: list[_Result] = []
    started = _Gate()
    threads = []
    for key, group in by_target.items():
        target = (known or {}).get(key) or resolve(TargetRef.parse(key))
        thread = threading.Thread(target=_deliver_all, args=(target, group, deadline, results, started),
                                  name=f"notify-{key[-8:]}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 0.05)
    through = started.close()
    done = list(results)  # a thread still sending past the deadline keeps its lease (no double send)
    for result in done:
        outbox.record(store, result.claim, result.ok, result.attempts, result.error, result.gone)
    finished = {r.claim.event_id + r.claim.target for r in done}
    left = [c for c in claims if c.event_id + c.target not in through and c.event_id + c.target not in finished]
    for claim in left:
        outbox.release(store, claim)
    # Said once per delivery (its first round), not again by every command that retries it.
    failed = tuple(f"{r.claim.event_type} to {r.claim.label}: {r.error}" for r in done
                   if not r.ok and r.claim.rounds == 0)
    return Flushed(sum(r.ok for r in done), failed, len(left))


def report(flushed: Flushed, warn: Callable[[str], None] | None) -> None:
    if warn is None:
        return
    for text in flushed.failed:
        warn(f"notify: {text}; kept: the next command (or `cloudtrain events --retry`) sends it")
