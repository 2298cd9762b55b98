"""Telling (notify): the node's own events (docs/notifications.md), sent just before it stops or
deletes itself, so a closed laptop still hears. Standard library only.

`notify` in the config (cloudtrain/run/watchdog.py): {"cloud", "targets": [{"name", "ref", "url",
"on": [types], "secret_file"}]}; each secret is a 0600 file beside the config, never in the config, a
log line or a command line. The envelope and signature are cloudtrain/notify/model.py's and
signing.py's (Standard Webhooks), redone with the standard library. Each send is tried within
NOTIFY_BUDGET_S, all targets together; each result is a `notify` line and a line of
notify.sent.jsonl, which ensure returns (the CLI records it as delivered by the node).
"""

from __future__ import annotations

import json
import os
import threading
import time

from .files import read_text
from .protocol import ENVELOPE_VERSION, SENT_LOG, Paths, is_secret_file

NOTIFY_BUDGET_S = 3.0  # all targets together: the stop waits no longer than this
NOTIFY_WAITS = (0.2, 0.5, 1.0)  # between attempts, the same id on each
SENT_KEEP = 50  # lines kept: the CLI records idempotently, and a node sends once per stop
_SENT_LOCK = threading.Lock()  # the loop and a notice's sender thread may both append


def node_event(cfg: dict, kind: str, reason: str, event_id: str | None = None,
               extra: dict | None = None) -> tuple[str, str]:
    """(id, body): the envelope as the laptop builds it (version 1, key-sorted, compact)."""
    import secrets as random

    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".{:03d}Z".format(int(now % 1 * 1000))
    event_id = event_id or "msg_" + random.token_hex(12)
    data = {"cluster": cfg.get("cluster"), "cloud": (cfg.get("notify") or {}).get("cloud"),
            "instance": cfg.get("instance_id"), "reason": reason, **(extra or {})}
    envelope = {"version": ENVELOPE_VERSION, "type": kind, "id": event_id, "timestamp": stamp, "source": "node",
                "data": {k: v for k, v in data.items() if v is not None}}
    return event_id, json.dumps(envelope, sort_keys=True, separators=(",", ":"))


def webhook_headers(secret: str, event_id: str, body: str) -> dict:
    """Standard Webhooks: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}"> keyed with the base64
    bytes after whsec_ (cloudtrain/notify/signing.py)."""
    import base64
    import hashlib
    import hmac

    text = secret.strip()
    text = text[len("whsec_"):] if text.startswith("whsec_") else text
    key = base64.b64decode(text + "=" * (-len(text) % 4))
    stamp = str(int(time.time()))
    digest = hmac.new(key, f"{event_id}.{stamp}.{body}".encode(), hashlib.sha256).digest()
    return {"webhook-id": event_id, "webhook-timestamp": stamp,
            "webhook-signature": "v1," + base64.b64encode(digest).decode(), "content-type": "application/json",
            "user-agent": "cloudtrain-watchdog/1"}


def post_hook(target: dict, root: str, event_id: str, body: str, deadline: float) -> tuple[bool, int, str]:
    """One target, tried until delivered (2xx) or out of time: (ok, attempts, error)."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):  # a redirected POST loses its body: refused
            return None

    opener = urllib.request.build_opener(NoRedirect)
    attempts, error = 0, ""
    try:
        secret = read_text(os.path.join(root, os.path.basename(str(target["secret_file"]))))
        if not secret:
            return False, 0, "its secret file is missing (`cloudtrain up` sends it again)"
        webhook_headers(secret, event_id, body)
    except (KeyError, ValueError) as exc:
        return False, 0, f"no usable secret: {type(exc).__name__}"
    while time.monotonic() < deadline:
        attempts += 1
        headers = webhook_headers(secret, event_id, body)  # the attempt's timestamp, the same id
        request = urllib.request.Request(str(target["url"]), data=body.encode(), headers=headers, method="POST")
        try:
            with opener.open(request, timeout=max(0.1, deadline - time.monotonic())) as answer:
                answer.read(1 << 16)
            return True, attempts, ""
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
            exc.close()
            if 400 <= exc.code < 500 and exc.code not in (408, 409, 425, 429):
                break  # refused (a wrong secret or URL): trying again cannot help
        except (OSError, ValueError) as exc:
            error = type(exc).__name__ + (f": {exc.reason}" if isinstance(exc, urllib.error.URLError) else "")
        wait = NOTIFY_WAITS[min(attempts - 1, len(NOTIFY_WAITS) - 1)]
        if time.monotonic() + wait >= deadline:
            break
        time.sleep(wait)
    return False, attempts, error


def tell(cfg: dict, paths: Paths, log, kind: str, reason: str, event_id: str | None = None,
         extra: dict | None = None) -> None:
    """Send `kind` to every target that wants it, in parallel, within NOTIFY_BUDGET_S; log each
    result (the target's name, never its URL) and append it to the sent-log."""
    targets = [t for t in (cfg.get("notify") or {}).get("targets") or () if kind in (t.get("on") or ())]
    if not targets:
        return
    event_id, body = node_event(cfg, kind, reason, event_id, extra)
    deadline = time.monotonic() + NOTIFY_BUDGET_S
    results = {}

    def send(index: int, target: dict) -> None:
        results[index] = post_hook(target, paths.root, event_id, body, deadline)

    threads = [threading.Thread(target=send, args=(i, t), daemon=True) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 0.2)
    lines = []
    for index, target in enumerate(targets):
        ok, attempts, error = results.get(index, (False, 0, "out of time"))
        name = str(target.get("name") or "webhook")
        log("notify", f"{kind} {event_id} to {name}: " + (f"delivered ({attempts} attempt(s))" if ok
                                                          else f"not delivered after {attempts} attempt(s): {error}"))
        lines.append(json.dumps({"id": event_id, "type": kind, "target": target.get("ref"), "name": name,
                                 "status": "delivered" if ok else "failed", "attempts": attempts, "error": error or None,
                                 "at": time.time(), "body": body}, sort_keys=True))
    path = paths.sent_log
    try:
        with _SENT_LOCK:
            kept = read_text(path).splitlines()[-(SENT_KEEP - len(lines)):] if os.path.exists(path) else []
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in [*kept, *lines]))
            os.replace(path + ".tmp", path)
    except OSError as exc:
        log("error", f"cannot write {SENT_LOG}: {exc}")


def sent_log(paths: Paths) -> list:
    """The sent-log's entries (ensure returns them: the CLI records them as delivered by the node)."""
    found = []
    for line in read_text(paths.sent_log).splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def write_secrets(paths: Paths, cfg: dict, secrets: dict) -> None:
    """Each target's secret as a 0600 file beside the config (from ensure's stdin); those of targets
    no longer configured removed."""
    wanted = {os.path.basename(str(t.get("secret_file"))) for t in (cfg.get("notify") or {}).get("targets") or ()}
    for name, value in (secrets or {}).items():
        name = os.path.basename(str(name))
        if name in wanted:
            tmp = os.path.join(paths.root, f".{name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(str(value))
            os.replace(tmp, os.path.join(paths.root, name))
    for name in os.listdir(paths.root):
        if is_secret_file(name) and name not in wanted:
            os.unlink(os.path.join(paths.root, name))


def tell_in_background(cfg: dict, paths: Paths, log, kind: str, reason: str, event_id: str | None,  # noqa: ANN001
                       extra: dict) -> None:
    """`tell` in a thread of its own: the loop goes on (a notification never holds it)."""

    def send() -> None:
        try:
            tell(cfg, paths, log, kind, reason, event_id, extra)
        except Exception as exc:  # noqa: BLE001 - a notification never holds the loop
            log("error", f"notify: {type(exc).__name__}: {exc}")

    threading.Thread(target=send, daemon=True).start()
