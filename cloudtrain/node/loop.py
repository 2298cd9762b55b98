"""The loop: decide every tick_s, act, log every decision (`watchdog.pyz run CONFIG`).

Each tick reads the config again, counts the budget, looks at the jobs, the ssh sessions and the
GPUs (signals.py), renews the liveness mark while the node works, and acts (actions.perform) when
the lease has fallen due, the budget is spent, or the node has been idle for `autostop.idle_s`.

Activity (what restarts the idle clock), by `autostop.wait_for`:
  jobs_and_ssh  a cloudtrain job of this cluster running (or starting) on this node, a new job
                appearing, or an SSH session (signals.ssh_activity)
  jobs          jobs only
  none          nothing: the machine stops idle_s after the watchdog started or its settings changed
Jobs are read the way templates/runner.sh reports them (jobs.py). The idle clock counts from when
the activity ended: a job's own end time (runner.sh writes ended_at), else the tick that saw it gone.

Notify: just before it acts, the loop tells watchdog.stopped, watchdog.deleted or deadline.reached
(tell.py), once per action however often it is retried; budget.warning once per budget.
After an action succeeds the loop waits `retry_s` (default 300) for the machine to go down before
acting again; a failed action is retried on the next ticks, with backoff.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from .actions import LivenessMark, perform, tag_expiry
from .files import Log, read_json, read_text, try_lock, write_json
from .install import remove_hook
from .jobs import observe_jobs
from .notices import NOTICE_TICK_S, watch_for_notice
from .protocol import (
    BUDGET_WARNING_SHARE,
    DEFAULT_RETRY_S,
    EVENT_BUDGET_WARNING,
    EVENT_DEADLINE,
    EVENT_STOPPED,
    NOTIFY_TYPES,
    Paths,
    seconds,
    tick_of,
)
from .settings import describe_settings, lease_left
from .signals import GpuWatch, session_rule, ssh_activity
from .tell import tell, tell_in_background


class Watchdog:
    def __init__(self, config_path: str) -> None:
        self.paths = Paths(config_path)
        self.log = Log(self.paths.log)
        self.state = read_json(self.paths.state) or {}
        self.last_m = time.monotonic()
        self.idle_from = self.last_m
        self.idle_since = "start"  # what the idle clock counts from, for the log
        self.settings_key = None
        self.known_jobs = None
        self.acted_at = None
        self.failures = 0
        self.next_try = 0.0
        self.cfg = None
        self.said_no_ssh = False
        self.over_seen = None  # jobs already over when last looked at
        self.prev_running = set()
        self.sessions_seen = 0  # the last ssh session count above zero, until their end is confirmed
        self.sessions_absent = 0  # looks in a row that found none of them
        self.wake_in = None  # seconds to the next decision (a tick, or sooner when a limit falls due)
        self.lease_key = None
        self.noticed = os.path.exists(self.paths.notice)
        self.hook_text = read_text(self.paths.hook)  # how this loop survives reboots (its files may go)
        self.gpu = GpuWatch()  # while jobs run (gpu_util_below)
        self.mark = LivenessMark()
        self.told = False  # this stop's or delete's event sent (once, however often the action is retried)
        self.tagged = False  # this stop's expiry tags written (or tried), once per stop

    def load(self):
        cfg = read_json(self.paths.config)
        if cfg is None:
            if not os.path.exists(self.paths.config):
                return None  # the cluster's files are gone (down): nothing left to watch
            self.log("error", f"{self.paths.config} is not readable JSON; keeping the previous settings")
            return self.cfg
        self.cfg = cfg
        return cfg

    def tick(self) -> bool:
        """One decision. False: the loop should end."""
        cfg = self.load()
        if cfg is None:
            if self.hook_text and not self.hook_text.startswith("none"):
                # Gone with the cluster's files: no reboot may start this loop again.
                remove_hook(self.paths, self.hook_text, self.cfg or {})
            return False
        self.hook_text = read_text(self.paths.hook) or self.hook_text  # (written after a systemd start)
        now_m = time.monotonic()
        delta, self.last_m = now_m - self.last_m, now_m
        self.wake_in = tick_of(cfg)
        if cfg.get("interruption") and not self.noticed:
            self.watch_for_notice(cfg)
        auto, budget, lease = cfg.get("autostop"), cfg.get("budget"), cfg.get("lease")
        if not auto and not budget and not lease:
            self.log("exit", "nothing to enforce (autostop, budget and lease are off)")
            remove_hook(self.paths)
            return False
        lease_key = json.dumps(lease, sort_keys=True)
        if lease_key != self.lease_key:
            # A new or extended lease changes no idle clock: it is a deadline, not activity.
            if self.lease_key is not None:
                self.log("config", describe_settings(cfg))
            self.lease_key = lease_key
        key = json.dumps([auto, (budget or {}).get("epoch"), cfg.get("action")], sort_keys=True)
        if key != self.settings_key:
            if self.settings_key is not None:
                self.log("config", describe_settings(cfg))
            self.settings_key = key
            self.idle_from, self.idle_since = now_m, "settings"
            self.acted_at = None
            self.failures, self.next_try = 0, 0.0
            self.told = False
            self.tagged = False
        used = None
        if budget:
            if self.state.get("epoch") != budget.get("epoch"):
                self.state = {"epoch": budget.get("epoch"), "used_s": float(budget.get("used_s") or 0.0)}
            else:
                self.state["used_s"] = float(self.state.get("used_s", 0.0)) + delta
            used = self.state["used_s"]
            limit = float(budget["limit_s"])
            if used >= BUDGET_WARNING_SHARE * limit and used < limit and not self.state.get("warned"):
                # Once per budget (its epoch), kept across restarts: the laptop may be closed.
                self.state["warned"] = True
                said = "budget: {:.0f}s of running time of {:.0f}s ({:.0%}; {})".format(
                    used, limit, used / limit, budget.get("why", ""))
                self.tell_in_background(cfg, EVENT_BUDGET_WARNING, said, None,
                                        {"used_s": round(used), "limit_s": round(limit)})
            try:
                write_json(self.paths.state, self.state)
            except OSError as exc:
                self.log("error", f"cannot save the budget count: {exc}")

        now = time.time()
        wait_for = (auto or {}).get("wait_for", "jobs_and_ssh")
        jobs = observe_jobs(self.paths, now)
        # A job that appeared since the last look and is already over counts from its end (below).
        new_jobs = [] if self.known_jobs is None else [
            j for j in jobs["all"] if j not in self.known_jobs and j not in jobs["over"]]
        self.known_jobs = set(jobs["all"])
        sessions, kept = None, 0
        if wait_for == "jobs_and_ssh" and cfg.get("count_ssh"):
            activity = ssh_activity(cfg.get("ssh_port"))
            if activity is not None and activity[0] == 0 and self.sessions_seen:
                # A vanished session is read again at once: one read of a busy table can miss it.
                activity = ssh_activity(cfg.get("ssh_port"))
            sessions, kept = (None, 0) if activity is None else activity
            if sessions is None and not self.said_no_ssh:
                self.said_no_ssh = True
                self.log("error", "cannot count ssh sessions (no sshd port known or no /proc/net/tcp); jobs only")
        session_busy, sessions_ended, self.sessions_seen, self.sessions_absent = session_rule(
            self.sessions_seen, sessions, self.sessions_absent)
        busy, gpu_since, gpu_text = [], None, ""
        if auto and wait_for in ("jobs", "jobs_and_ssh"):
            if jobs["running"]:
                verdict, gpu_since, gpu_text, sample_in = self.gpu.verdict(cfg, auto, jobs["running"], now_m)
                if sample_in is not None:
                    self.wake_in = min(self.wake_in, sample_in)
                if verdict == "busy":
                    busy.append("{} job(s) running ({}){}".format(len(jobs["running"]), ", ".join(jobs["running"][:3]),
                                                                  f"; {gpu_text}" if gpu_text else ""))
            if jobs["starting"]:
                busy.append("job(s) starting ({})".format(", ".join(jobs["starting"][:3])))
            if new_jobs:
                busy.append("new job(s) ({})".format(", ".join(new_jobs[:3])))
            if session_busy:
                busy.append(session_busy)
        if not jobs["running"]:
            self.gpu.forget()  # a job's GPUs are judged from its own samples only
        working = bool(jobs["running"] or jobs["starting"] or new_jobs or session_busy)
        if busy:
            self.idle_from, self.idle_since = now_m, "busy"
        elif auto and wait_for in ("jobs", "jobs_and_ssh"):
            mark, why = self.activity_ended(jobs, sessions_ended, now, now_m)
            if gpu_since is not None and gpu_since > mark:
                mark, why = gpu_since, "the GPUs went quiet"
            if mark > self.idle_from:
                self.idle_from, self.idle_since = mark, why
        if self.acted_at is None:
            try:
                self.mark.keep(cfg, working, now_m, self.log, lambda: self.ssh_busy(cfg))
            except Exception as exc:  # noqa: BLE001 - a failed mark must never keep the node from stopping
                self.log("error", f"liveness mark: {type(exc).__name__}: {exc}")
        self.over_seen = set(jobs["over"])
        self.prev_running = set(jobs["running"])
        idle_s = now_m - self.idle_from
        budget_text = ""
        if budget:
            budget_text = "; budget {:.0f}/{:.0f}s".format(used, float(budget["limit_s"]))
        facts = "jobs running {}, ssh sessions {}{}{}{}".format(
            len(jobs["running"]), "-" if sessions is None else sessions,
            " (+{} cloudtrain's, idle: not counted)".format(kept) if kept else "", budget_text,
            f"; {gpu_text}" if gpu_text and not busy else "")

        action = cfg.get("action") or {}
        effect = action.get("effect", "stop")
        if self.acted_at is not None:
            since = now_m - self.acted_at
            if since < seconds(cfg, "retry_s", DEFAULT_RETRY_S):
                self.log("waiting", f"{effect} requested {since:.0f}s ago; {facts}")
                return True
            self.log("error", f"still running {since:.0f}s after the {effect}; acting again")
            self.acted_at = None
        reason = None
        left = lease_left(lease, now, now_m) if lease else None
        if lease and left is None:
            self.log("error", f"the lease {lease!r} is not readable; it is not enforced")
        if left is not None and left <= 0:
            reason = "lease: {} ({}), {} job(s) still running".format(
                "ended" if left > -1 else f"ended {-left:.0f}s ago", lease.get("why", ""), len(jobs["running"]))
        elif budget and used is not None and used >= float(budget["limit_s"]):
            reason = "budget: {:.0f}s of running time >= limit {:.0f}s ({}), {} job(s) still running".format(
                used, float(budget["limit_s"]), budget.get("why", ""), len(jobs["running"]))
        elif auto and idle_s >= float(auto["idle_s"]):
            reason = "autostop: idle {:.0f}s >= {:g}s".format(idle_s, float(auto["idle_s"]))
        if reason is None:
            # Wake when a limit falls due rather than up to a tick later.
            if auto and not busy:
                self.wake_in = min(self.wake_in, max(0.05, float(auto["idle_s"]) - idle_s))
            if budget and used is not None:
                self.wake_in = min(self.wake_in, max(0.05, float(budget["limit_s"]) - used))
            if left is not None:
                self.wake_in = min(self.wake_in, max(0.05, left))
                facts += "; lease {:.0f}s left".format(left)
            if busy:
                self.log("busy", "{}; {}".format("; ".join(busy), facts))
            elif auto:
                self.log("idle", "idle {:.0f}/{:g}s since {}; {}".format(idle_s, float(auto["idle_s"]), self.idle_since, facts))
            else:
                self.log("idle", f"autostop off; {facts}")
            return True
        if now_m < self.next_try:
            self.log("waiting", f"{reason}; retrying the {effect} in {self.next_try - now_m:.0f}s")
            return True
        if not action:
            self.log("error", f"{reason}, but the config has no action; nothing done")
            return True
        if not self.told:
            # Before the action (a stopped machine sends nothing), within NOTIFY_BUDGET_S.
            self.told = True
            kind = EVENT_DEADLINE if reason.startswith("lease") else NOTIFY_TYPES.get(effect, EVENT_STOPPED)
            try:
                tell(cfg, self.paths, self.log, kind, reason)
            except Exception as exc:  # noqa: BLE001 - a notification never keeps the machine up
                self.log("error", f"notify: {type(exc).__name__}: {exc}")
        if effect == "stop" and not self.tagged:
            self.tagged = True  # once per stop, however often the action is retried
            tag_expiry(cfg, self.log)
        self.log(effect, "{} -> {}".format(reason, action.get("kind")))
        ok, detail = perform(action, cfg)
        if ok:
            self.log(effect, f"done: {detail}")
            self.failures = 0
            if action.get("exit_after"):
                self.log("exit", f"the machine stays up ({effect} done): the watchdog ends")
                return False
            self.acted_at = time.monotonic()
            return True
        self.failures += 1
        backoff = min(DEFAULT_RETRY_S, tick_of(cfg) * (2 ** min(self.failures, 10)))
        self.next_try = time.monotonic() + backoff
        self.log("error", f"{effect} failed (try {self.failures}, next in {backoff:.0f}s): {detail}")
        return True

    def watch_for_notice(self, cfg: dict) -> None:
        """The cloud's interruption notice (notices.watch_for_notice), looked for every NOTICE_TICK_S."""
        self.wake_in = min(self.wake_in, NOTICE_TICK_S)
        if watch_for_notice(cfg, self.paths, self.log, self.tell_in_background):
            self.noticed = True

    def tell_in_background(self, cfg: dict, kind: str, reason: str, event_id: str | None, extra: dict) -> None:
        tell_in_background(cfg, self.paths, self.log, kind, reason, event_id, extra)

    def activity_ended(self, jobs: dict, sessions_ended: bool, now: float, now_m: float) -> tuple[float, str]:
        """When the activity since the last look ended (monotonic), now that none is left, and what
        it was: a job's own end time (runner.sh writes ended_at), else this tick (an SSH session or
        a lost job ended at some unknown moment since the last look: counting from now never stops early)."""
        mark, why = float("-inf"), ""
        if self.over_seen is None:
            return mark, why  # the first look: the idle clock starts at the watchdog's start
        for name in jobs["over"]:
            if name in self.over_seen:
                continue
            ended = read_text(os.path.join(self.paths.jobs, name, "ended_at"))
            try:
                # ended_at has whole seconds: one more never stops early.
                at = now_m - max(0.0, now - (float(ended) + 1.0))
            except ValueError:
                at = now_m
            if at > mark:
                mark, why = at, f"job {name} ended"
        lost = self.prev_running - set(jobs["running"]) - set(jobs["over"])
        if lost and now_m > mark:
            mark, why = now_m, f"job {min(lost)} was lost"
        if sessions_ended and now_m > mark:
            mark, why = now_m, "the last ssh session ended"
        return mark, why

    def ssh_busy(self, cfg: dict) -> bool:
        """Whether a user's ssh session runs now (for the liveness mark, when autostop did not ask)."""
        activity = ssh_activity(cfg.get("ssh_port"))
        return bool(activity and activity[0])

    def run(self) -> int:
        lock = try_lock(self.paths)
        if lock is None:
            return 0  # another loop watches this cluster on this machine
        with open(self.paths.pid, "w", encoding="ascii") as handle:
            handle.write(f"{os.getpid()}\n")
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        cfg = self.load()
        if cfg is None:
            return 0
        self.log("start", "pid {}, python {}; {}; reboot hook: {}".format(
            os.getpid(), sys.executable, describe_settings(cfg), read_text(self.paths.hook) or "none"))
        try:
            while not stopping:
                try:
                    if not self.tick():
                        break
                except Exception as exc:  # noqa: BLE001 - a watchdog that dies stops nobody
                    self.log("error", f"{type(exc).__name__}: {exc}")
                deadline = time.monotonic() + (self.wake_in or tick_of(self.cfg or {}))
                while not stopping and time.monotonic() < deadline:
                    if not os.path.exists(self.paths.config):
                        break  # the cluster's files are gone (down): the next tick ends the loop now
                    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            if stopping:
                self.log("exit", "stopped by a signal")
        finally:
            try:
                os.unlink(self.paths.pid)
            except OSError:
                pass
            lock.close()
        return 0
