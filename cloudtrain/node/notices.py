"""The clouds' interruption notices, read from this machine's metadata server (docs/recovery.md).

`interruption` in the config names the cloud (set for runs that recover); `metadata_url` rebases
the URLs, for tests. Every NOTICE_TICK_S the loop asks whether the cloud is taking the machine back
(NOTICES: EC2's spot/instance-action, GCE's instance/preempted, Azure's Scheduled Events Preempt).
On a notice it writes interruption.json beside the config (the CLI reads it) and ends the running
jobs with runner.sh kill: TERM now, so a job can write a last checkpoint, KILL after a grace that
fits inside the cloud's warning (NOTICE_GRACE_S); where the CLI left on_notice.sh beside the config
(a run with `upload:`), it starts it: the results and checkpoints go to the bucket. Then it tells
run.preempted (tell.py). Once per machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from .actions import rebase
from .files import write_json
from .jobs import observe_jobs
from .protocol import EVENT_PREEMPTED, NOTICE_SCRIPT, Paths, preemption_event_id

# Each entry: the URL, its headers, the session-token request EC2's IMDSv2 needs first, and how an
# answer reads as a notice (interruption_notice).
NOTICES = {
    # 404 until EC2 schedules the stop or termination, then {"action": ..., "time": ...} (2 minutes).
    "aws": {"url": "http://169.254.169.254/latest/meta-data/spot/instance-action", "headers": {},
            "token": {"url": "http://169.254.169.254/latest/api/token", "method": "PUT",
                      "headers": {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                      "header": "X-aws-ec2-metadata-token"}},
    # "TRUE" once Compute Engine has started to preempt the VM (about 30 s before it goes).
    "gcp": {"url": "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
            "headers": {"Metadata-Flavor": "Google"}},
    # Scheduled Events: an event of type Preempt (a spot eviction, at least 30 s ahead).
    "azure": {"url": "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
              "headers": {"Metadata": "true"}},
}
NOTICE_TICK_S = 5.0  # how often a notice is looked for (the shortest warning, GCP's, is about 30 s)
NOTICE_GRACE_S = {"aws": 100.0, "gcp": 20.0, "azure": 20.0}  # TERM, then KILL after this (inside the warning)


def interruption_notice(kind: str, cfg: dict) -> tuple[bool, str]:
    """(True, what) when this machine's cloud has announced that it takes the machine back."""
    import urllib.error
    import urllib.request

    spec = NOTICES.get(kind)
    if spec is None:
        return False, f"no interruption notice known for {kind!r}"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: never a proxy
    headers = dict(spec["headers"])
    try:
        token = spec.get("token")
        if token:
            request = urllib.request.Request(rebase(token["url"], cfg.get("metadata_url")), data=b"",
                                             headers=token["headers"], method=token["method"])
            with direct.open(request, timeout=5) as answer:
                headers[token["header"]] = answer.read(4096).decode("utf-8", "replace").strip()
        request = urllib.request.Request(rebase(spec["url"], cfg.get("metadata_url")), headers=headers)
        with direct.open(request, timeout=5) as answer:
            body = answer.read(65536).decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False, "no notice"  # EC2: nothing scheduled
        return False, f"metadata server: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"metadata server: {type(exc).__name__}: {exc}"
    if kind == "gcp":
        return body.upper() == "TRUE", f"instance/preempted {body[:20]}"
    if kind == "aws":
        try:
            notice = json.loads(body)
        except ValueError:
            return False, f"unreadable instance-action {body[:80]!r}"
        return True, "spot/instance-action {} at {}".format(notice.get("action"), notice.get("time"))
    try:
        events = json.loads(body).get("Events") or []
    except (ValueError, AttributeError):
        return False, f"unreadable scheduled events {body[:80]!r}"
    me = str(cfg.get("instance_id") or "").rsplit("/", 1)[-1].rsplit(":", 1)[-1].lower()
    for event in events:
        resources = [str(r).lower() for r in event.get("Resources") or []]
        if event.get("EventType") == "Preempt" and (not resources or me in resources):
            return True, "scheduled event Preempt {} not before {}".format(event.get("EventId"), event.get("NotBefore"))
    return False, "no Preempt event"


def end_jobs_on_notice(paths: Paths, jobs: list, grace: float) -> None:
    """TERM every running job now (it may write a last checkpoint), KILL what is left after `grace`
    seconds: runner.sh kill, in the background, so the loop goes on."""
    for name in jobs:
        subprocess.Popen(["sh", paths.runner, "kill", os.path.join(paths.jobs, name), str(int(grace))],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)


def watch_for_notice(cfg: dict, paths: Paths, log, tell_in_background) -> bool:  # noqa: ANN001
    """The cloud's interruption notice, asked once: when seen, say so in a file the CLI reads, TERM
    the running jobs so that they can write a last checkpoint while the machine is still here, start
    on_notice.sh where the CLI left one, and tell run.preempted. True: the notice was seen."""
    kind = str(cfg["interruption"])
    seen, detail = interruption_notice(kind, cfg)
    if not seen:
        return False
    running = observe_jobs(paths, time.time())["running"]
    upload = os.path.exists(paths.notice_script)
    try:
        write_json(paths.notice, {"kind": kind, "detail": detail, "at": time.time(), "jobs": running, "upload": upload},
                   mode=0o644)
    except OSError as exc:
        log("error", f"cannot record the interruption notice: {exc}")
    log("interruption", "{}; TERM to {} job(s): {}".format(detail, len(running), ", ".join(running) or "none"))
    end_jobs_on_notice(paths, running, NOTICE_GRACE_S.get(kind, 20.0))
    if upload:  # in the background, in a session of its own: the loop goes on
        subprocess.Popen(["sh", paths.notice_script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        log("interruption", f"started {NOTICE_SCRIPT}: the results and checkpoints to the bucket")
    # After the jobs were TERMed (their checkpoint comes first) and in a thread (the loop goes on
    # watching): the machine may have seconds left, and with the laptop closed this is the only one
    # who knows. The id is the laptop's for the same preemption: a receiver hears it once.
    incarnation = cfg.get("incarnation")
    event_id = preemption_event_id(str(cfg.get("cluster")), str(incarnation)) if incarnation else None
    tell_in_background(cfg, EVENT_PREEMPTED, detail, event_id, {"jobs": list(running)})
    return True
