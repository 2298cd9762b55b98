"""Acting on this machine with its own identity: the stop or delete (perform), the liveness mark
(LivenessMark) and the expiry tags before a stop (tag_expiry). Standard library only.

The action (`action` in the config) is what the cloud's provider said the machine must do to stop
or delete itself with no user credentials on it (Provider.watchdog_action):
  {"kind": "shutdown", "effect": "stop"|"delete", "identity": {...}}
        power off from inside (`shutdown_command`, default: shutdown -h now, through sudo -n when
        not root); the cloud turns an OS shutdown into a stop or a delete. The real power-off
        happens only after the instance metadata server confirms this machine is the instance
        (`identity`, see is_the_node); a test kit replaces it with `shutdown_command`
  {"kind": "http", "effect": ..., "method": "POST", "url": "...", "headers": {...}, "body": ...,
   "token": {"url": "...", "headers": {...}, "field": "access_token"}, "ok": [200, 202], "gone_ok": true}
        one API call with a bearer token from the instance metadata server (`metadata_url`
        replaces the token URL's scheme and host: tests point it at a fake)
  {"kind": "exec", "effect": ..., "argv": [...], "exit_after": true}
        run a command (the local provider's stop); exit_after: the machine stays up, so the
        watchdog ends after it

Liveness mark (`mark`, from the provider's MarksItself; docs/design/billing.md): while this node
works (a job, setup or copy running or starting, a user's ssh session), the loop renews the
instance's `cloudtrain-alive` label/tag every `mark_every_s` (300) with the machine's own identity:
{"kind": "http-mark", "key", "token", "get": url, "field": "labels"|"tags", "fingerprint": field or
absent, "method", "url", "ok", "retry"} (read, merge, write back; renew_mark). {"kind": "none",
"why"}: the machine has no identity that may (nothing is tried). A failed mark is logged, retried
with backoff, and changes no decision.

Stopped, then deleted (`autostop.delete_after_stopped_days`: N): just before a stop the loop tags
the machine cloudtrain-delete-after=<epoch seconds, now + N days> and
cloudtrain-delete-after-stopped-days=N with its own identity (the liveness mark's call), an `expiry`
line; `cloudtrain gc --expired --yes` deletes it once that time has passed (protocol.expiry_tags).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

from .protocol import ENV_CLUSTER, ENV_EFFECT, ENV_INSTANCE_ID, MARK_EVERY_S, expiry_tags, seconds, tick_of

ACTION_TIMEOUT_S = 120.0


def default_shutdown_command() -> list:
    if os.geteuid() == 0:
        return ["shutdown", "-h", "now"]
    return ["sudo", "-n", "shutdown", "-h", "now"]


def run_command(argv, env_extra: dict) -> tuple[bool, str]:
    env = dict(os.environ)
    env.update(env_extra)
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=ACTION_TIMEOUT_S, env=env, check=False)
    except FileNotFoundError:
        return False, f"command not found: {argv[0]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if proc.returncode != 0:
        return False, f"{shlex.join(argv)} exited {proc.returncode}: {tail[0][:300]}"
    return True, shlex.join(argv)


def rebase(url: str, base) -> str:
    """`url` with its scheme and host replaced by `base`'s (path and query kept)."""
    if not base:
        return url
    from urllib.parse import urlsplit, urlunsplit

    old, new = urlsplit(url), urlsplit(base)
    return urlunsplit((new.scheme, new.netloc, old.path, old.query, old.fragment))


def bearer(token_spec, cfg: dict) -> tuple[dict | None, str]:
    """{"Authorization": "Bearer ..."} from the instance metadata server (`token_spec` from the
    provider: url, headers, field), or (None, why). Never logged."""
    import urllib.error
    import urllib.request

    if not token_spec:
        return {}, ""
    # The metadata server is link-local: never through a proxy from the environment.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    token_url = rebase(token_spec["url"], cfg.get("metadata_url"))
    request = urllib.request.Request(token_url, headers=dict(token_spec.get("headers") or {}), method="GET")
    try:
        with direct.open(request, timeout=15) as answer:
            token = json.load(answer)[token_spec.get("field", "access_token")]
    except urllib.error.HTTPError as exc:
        return None, f"token from {token_url}: HTTP {exc.code}"
    except (OSError, ValueError, KeyError) as exc:
        return None, f"token from {token_url}: {type(exc).__name__}: {exc}"
    return {"Authorization": f"Bearer {token}"}, ""


def api_call(method: str, url: str, headers: dict, body, cfg: dict) -> tuple[int | None, object, str]:
    """One call of a cloud API: (HTTP status or None, the answer's JSON or None, a line for the log)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=cfg["ca_file"]) if cfg.get("ca_file") else None
    headers = dict(headers)
    if body is not None:
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    else:
        data = b"" if method in ("POST", "PUT", "PATCH") else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as answer:
            status, raw = answer.status, answer.read(1 << 20)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace").replace("\n", " ")
        return exc.code, None, f"{method} {url}: HTTP {exc.code} {detail}"
    except (OSError, ValueError) as exc:
        return None, None, f"{method} {url}: {type(exc).__name__}: {exc}"
    try:
        parsed = json.loads(raw.decode("utf-8", "replace")) if raw.strip() else None
    except ValueError:
        parsed = None
    return status, parsed, f"{method} {url}: HTTP {status}"


def http_action(action: dict, cfg: dict) -> tuple[bool, str]:
    headers, why = bearer(action.get("token"), cfg)
    if headers is None:
        return False, why
    method = action.get("method", "POST").upper()
    status, _, detail = api_call(method, action["url"], {**(action.get("headers") or {}), **headers},
                                 action.get("body"), cfg)
    if status == 404 and action.get("gone_ok"):
        return True, detail
    if status not in (action.get("ok") or [200, 201, 202, 204]):
        return False, detail if status is None or status >= 400 else f"{detail} (unexpected)"
    return True, detail


def renew_mark(mark: dict, cfg: dict, now: float) -> tuple[bool, str]:
    """Set this machine's liveness mark (mark["key"], whole epoch seconds) with its own identity."""
    return set_tags(mark, cfg, {mark["key"]: str(int(now))})


def set_tags(mark: dict, cfg: dict, values: dict) -> tuple[bool, str]:
    """Set `values` among this machine's tags/labels with its own identity (`mark`, the liveness
    mark's call): read the instance, write its label/tag map (mark["field"]) back with them, as the
    CLI's MarksAlive does. Compute Engine guards labels with a fingerprint read alongside: a stale
    one is 412 (someone changed them meanwhile), so the read is done again."""
    headers, why = bearer(mark.get("token"), cfg)
    if headers is None:
        return False, why
    field = mark["field"]
    shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    detail = ""
    for _ in range(3):
        status, answer, detail = api_call("GET", mark["get"], headers, None, cfg)
        if status != 200 or not isinstance(answer, dict):
            return False, detail
        tags = dict(answer.get(field) or {})
        tags.update(values)
        body = {field: tags}
        if mark.get("fingerprint"):
            body[mark["fingerprint"]] = answer.get(mark["fingerprint"])
        method = mark.get("method", "PATCH").upper()
        status, _, detail = api_call(method, mark["url"], headers, body, cfg)
        if status in (mark.get("ok") or [200, 202]):
            return True, f"{shown} ({detail})"
        if status not in (mark.get("retry") or ()):
            return False, detail
    return False, f"{detail} three times (the labels keep changing)"


def is_the_node(identity, cfg: dict) -> tuple[bool, str]:
    """Whether this machine is the instance the action was made for, asked of the cloud's instance
    metadata server (`identity`: {"url", "headers", "expect", "token": {"url", "method", "headers",
    "header"}} from the provider; `metadata_url` rebases it, for tests). No identity, no metadata
    server, or another answer: not the node."""
    import urllib.error
    import urllib.request

    if not identity:
        return False, "the action names no identity to check"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: never a proxy
    headers = dict(identity.get("headers") or {})
    try:
        token = identity.get("token")
        if token:  # EC2's IMDSv2: a session token first
            request = urllib.request.Request(rebase(token["url"], cfg.get("metadata_url")), data=b"",
                                             headers=dict(token.get("headers") or {}),
                                             method=token.get("method", "PUT"))
            with direct.open(request, timeout=5) as answer:
                headers[token["header"]] = answer.read(4096).decode("utf-8", "replace").strip()
        request = urllib.request.Request(rebase(identity["url"], cfg.get("metadata_url")), headers=headers)
        with direct.open(request, timeout=5) as answer:
            seen = answer.read(4096).decode("utf-8", "replace").strip()
    except (OSError, ValueError, KeyError) as exc:
        return False, f"no instance metadata: {type(exc).__name__}: {exc}"
    if seen != str(identity.get("expect", "")):
        return False, f"the metadata server says {seen[:80]!r}, not {identity.get('expect')!r}"
    return True, seen


def perform(action: dict, cfg: dict) -> tuple[bool, str]:
    kind = action.get("kind")
    env = {ENV_CLUSTER: str(cfg.get("cluster", "")), ENV_INSTANCE_ID: str(cfg.get("instance_id", "")),
           ENV_EFFECT: str(action.get("effect", ""))}
    if kind == "shutdown":
        if not cfg.get("shutdown_command"):
            # The real power-off: only on the machine this watchdog was started for (a test kit's
            # "VMs" run on the test machine itself, which must never be powered off).
            mine, why = is_the_node(action.get("identity"), cfg)
            if not mine:
                return False, f"refusing to power off: this machine is not the node ({why})"
        command = cfg.get("shutdown_command") or default_shutdown_command()
        ok, detail = run_command(command, env)
        if not ok and not cfg.get("shutdown_command"):
            for fallback in (["systemctl", "poweroff"], ["sudo", "-n", "systemctl", "poweroff"]):
                ok, more = run_command(fallback, env)
                detail += "; " + more
                if ok:
                    break
        return ok, detail
    if kind == "http":
        return http_action(action, cfg)
    if kind == "exec":
        return run_command(action["argv"], env)
    return False, f"unknown action kind {kind!r}"


def tag_expiry(cfg: dict, log) -> None:  # noqa: ANN001 - log: files.Log
    """Before a stop, with `autostop.delete_after_stopped_days` set: the machine's tags say when
    `gc --expired` may delete it (expiry_tags), written with its own identity (`mark`). Where it
    has none that may, nothing is tried: the launch request's TAG_STOPPED_DAYS and the cloud's own
    stop time say the same (cloudtrain/expiry.py). A failure is logged and never delays the stop."""
    days = (cfg.get("autostop") or {}).get("delete_after_stopped_days")
    if days is None:
        return
    mark = cfg.get("mark") or {}
    if mark.get("kind") != "http-mark":
        why = mark.get("why") or "no identity of its own may tag this machine"
        log("expiry", f"not tagged ({why}): gc counts {int(days)} days from the cloud's stop time")
        return
    try:
        ok, detail = set_tags(mark, cfg, expiry_tags(days, time.time()))
    except Exception as exc:  # noqa: BLE001 - a failed tag must never keep the machine up
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    if ok:
        log("expiry", f"tagged before the stop: {detail}")
    else:
        log("error", f"expiry tags not written ({detail}); gc counts from the cloud's stop time")


class LivenessMark:
    """The node's liveness mark, renewed while it works; its backoff after a failure."""

    def __init__(self) -> None:
        self.marked_at = None  # type: float | None  # when this loop last renewed it (monotonic)
        self.failures = 0
        self.retry = 0.0

    def keep(self, cfg: dict, working: bool, now_m: float, log, ssh_busy) -> None:  # noqa: ANN001
        """While this node works (a job, setup or copy running or starting, a user's ssh session), its
        liveness mark renewed every `mark_every_s` with the machine's own identity (`mark`, from the
        provider), so that `gc` from any state leaves it alone with no CLI holding it. A failed mark
        is logged and tried again (backoff); it changes no decision. ssh_busy(): whether a user's
        ssh session runs, asked only when the autostop rule did not read the sessions."""
        mark = cfg.get("mark") or {}
        if mark.get("kind") != "http-mark":
            return
        every = seconds(cfg, "mark_every_s", MARK_EVERY_S)
        if (self.marked_at is not None and now_m - self.marked_at < every) or now_m < self.retry:
            return
        if not working and cfg.get("count_ssh") and (cfg.get("autostop") or {}).get("wait_for") != "jobs_and_ssh":
            working = ssh_busy()
        if not working:
            return
        ok, detail = renew_mark(mark, cfg, time.time())
        if ok:
            self.marked_at, self.failures, self.retry = now_m, 0, 0.0
            log("mark", f"alive: {detail}")
            return
        self.failures += 1
        backoff = min(every, tick_of(cfg) * (2 ** min(self.failures, 10)))
        self.retry = now_m + backoff
        log("error", f"liveness mark failed (try {self.failures}, next in {backoff:.0f}s): {detail}")
