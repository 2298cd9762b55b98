"""What the laptop and the node agree on: file names, job states, config fields, shared rules.

Both sides import this module: the laptop as cloudtrain.node.protocol, the node from the zipapp
the laptop ships (cloudtrain/node/bundle.py). Standard library only, Python 3.8+. Nothing here
acts; it names things, and holds the few rules whose answer both sides must give alike.

Files beside the watchdog's config, ~/.cloudtrain/<cluster>/ on the node (Paths):
  watchdog.json        the config (CONFIG_FIELDS), written by the CLI (`up`, `run`, `autostop`)
                       and read again on every tick, so a change takes effect on the next one
  watchdog.log         every decision, one line each, `<UTC time> <decision> <detail>` (DECISIONS)
  watchdog.state.json  running time counted against the budget; it survives reboots
  watchdog.pid, watchdog.lock  one loop per cluster and machine (the loop holds an exclusive lock)
  watchdog.hook        how the loop survives reboots (systemd unit, cron line, or none and why)
  interruption.json    the cloud's interruption notice, seen by the node (run/recover.py reads it)
  on_notice.sh         left by the CLI for a run with `upload:`; the node starts it on a notice
  notify.sent.jsonl    what the node told its webhook targets; the CLI reconciles it
  notify-<id>.secret   a webhook target's secret, 0600 (never in the config, a log or argv)
  jobs/<id>/           one job, as templates/runner.sh writes it (JOB_FILES)
  runtime/runner.sh    the job runner; runtime/watchdog.pyz this program
"""

from __future__ import annotations

import enum
import os

VERSION = 1

# ------------------------------------------------------------------------------------ file names

CONFIG_NAME = "watchdog.json"
LOG_NAME = "watchdog.log"
STATE_NAME = "watchdog.state.json"
LOCK_NAME = "watchdog.lock"
PID_NAME = "watchdog.pid"
HOOK_NAME = "watchdog.hook"
PROGRAM_NAME = "watchdog.pyz"  # in the runtime directory, beside runner.sh
RUNTIME_DIR = "runtime"
RUNNER_NAME = "runner.sh"
JOBS_DIR = "jobs"
NOTICE_FILE = "interruption.json"  # the notice as the node saw it; the CLI reads it (run/recover.py)
NOTICE_SCRIPT = "on_notice.sh"  # the CLI's upload on a notice (run/recover_upload.py); the node starts it
SENT_LOG = "notify.sent.jsonl"  # what the node sent; the CLI reconciles it into its outbox
SECRET_PREFIX, SECRET_SUFFIX = "notify-", ".secret"


def secret_file(key: str) -> str:
    """The 0600 file beside the config that holds a webhook target's secret (key: its ref's id)."""
    return f"{SECRET_PREFIX}{key}{SECRET_SUFFIX}"


def is_secret_file(name: str) -> bool:
    return name.startswith(SECRET_PREFIX) and name.endswith(SECRET_SUFFIX)


class Paths:
    """The files of one cluster's watchdog on a node, from its config's path."""

    def __init__(self, config_path: str) -> None:
        self.config = os.path.abspath(config_path)
        self.root = os.path.dirname(self.config)
        self.log = os.path.join(self.root, LOG_NAME)
        self.state = os.path.join(self.root, STATE_NAME)
        self.lock = os.path.join(self.root, LOCK_NAME)
        self.pid = os.path.join(self.root, PID_NAME)
        self.hook = os.path.join(self.root, HOOK_NAME)
        self.jobs = os.path.join(self.root, JOBS_DIR)
        self.runner = os.path.join(self.root, RUNTIME_DIR, RUNNER_NAME)
        self.notice = os.path.join(self.root, NOTICE_FILE)
        self.notice_script = os.path.join(self.root, NOTICE_SCRIPT)
        self.sent_log = os.path.join(self.root, SENT_LOG)


# ------------------------------------------------------------------------------------ jobs

# A job's directory, as templates/runner.sh writes it: `pid` (the supervisor's), `identity`
# (BOOT:PID:TICKS of the supervisor, process identity), `started_at`, `ended_at` (whole epoch
# seconds), `exit_code` (written last: the job and everything it started are over), `cancelled`
# (ended by `runner.sh kill`), `log`, `cmd.sh`.
JOB_PID, JOB_IDENTITY, JOB_EXIT_CODE = "pid", "identity", "exit_code"
JOB_ENDED_AT, JOB_CANCELLED = "ended_at", "cancelled"
KILLED_BY_TERM = 143  # a job ended by TERM (runner.sh kill, or from outside) counts as killed


class JobState(str, enum.Enum):
    """A job's state, as `runner.sh status` reports it (cloudtrain.node.jobs.read_job: the same rule)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"  # the supervisor is gone without an exit code: the node rebooted or was killed

    def __str__(self) -> str:
        return str(self.value)

    @property
    def over(self) -> bool:
        """Ended with an exit code (lost is not: when it ended is unknown)."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)

    @property
    def open(self) -> bool:
        return self in (JobState.PENDING, JobState.RUNNING)


# ------------------------------------------------------------------------------------ the config

WAIT_FOR = ("jobs_and_ssh", "jobs", "none")
DEFAULT_TICK_S = 15.0
DEFAULT_RETRY_S = 300.0
MARK_EVERY_S = 300.0  # the liveness mark's renewal while the node works (cloudtrain/cluster/liveness.py)
GPU_SAMPLE_S = 10.0  # how often the GPUs are sampled while a job runs (`gpu_sample_s` overrides, for tests)

# watchdog.json, field by field (the CLI writes it: cloudtrain/run/watchdog.py node_config; the node
# reads it on every tick). Anything else in the file is ignored by the node.
CONFIG_FIELDS = {
    "version": "VERSION",
    "cluster": "the cluster's name",
    "incarnation": "this life of the cluster (its uid): names a preemption's event",
    "instance_id": "the machine's id at its cloud",
    "rank": "the node's rank in the cluster",
    "tick_s": f"seconds between decisions ({DEFAULT_TICK_S:g})",
    "autostop": "{idle_s, down, wait_for, gpu_util_below, delete_after_stopped_days} or null",
    "budget": "{limit_s, used_s, epoch, why} or null: a hard limit on running time",
    "lease": "{until, why, sent_at} or null: a sweep VM's hard deadline (ensure adds mono_until, boot_id)",
    "action": "what the provider says the node must do to stop or delete itself (actions.perform)",
    "action_key": "<instance>:<stop|delete>: the action is kept on the node per key",
    "interruption": "the cloud whose interruption notice the node watches for, or null",
    "mark": "the node's own liveness-mark call, or {kind: none, why}",
    "mark_key": "the instance the mark is kept for",
    "mark_every_s": f"the mark's renewal while the node works ({MARK_EVERY_S:g})",
    "busy_jobs": "fnmatch patterns of job ids busy whatever the GPUs do (setup, bucket copies)",
    "count_ssh": "whether an ssh session counts as activity",
    "ssh_port": "sshd's port (ensure reads it from $SSH_CONNECTION when null)",
    "notify": "{cloud, targets: [{name, ref, url, on, secret_file}]}: the node's webhook targets",
    "keep": "fields this write leaves as the node has them (not written)",
    "written_at": "the CLI's clock when it wrote this (ignored when comparing configs)",
    "retry_s": f"seconds to wait for the machine to go down after acting ({DEFAULT_RETRY_S:g})",
    "gpu_sample_s": f"GPU sampling period ({GPU_SAMPLE_S:g}; tests)",
    "shutdown_command": "argv replacing the OS shutdown (tests)",
    "metadata_url": "replaces the metadata server's scheme and host (tests)",
    "ca_file": "CA bundle for the node's HTTPS calls (tests)",
    "persist": "auto | none: whether the loop survives reboots (systemd unit or cron line)",
}


def config_fields(fields: dict) -> dict:
    """`fields` as a config to send, every name one of CONFIG_FIELDS (a misspelt one fails here, on
    the laptop, rather than being ignored by the node)."""
    unknown = sorted(set(fields) - set(CONFIG_FIELDS))
    if unknown:
        raise KeyError("not watchdog config fields: {}".format(", ".join(unknown)))
    return fields


VOLATILE_FIELDS = ("written_at",)  # change on every write without changing what the loop does
LEASE_STAMPS = ("sent_at", "mono_until", "boot_id")  # when it was sent, and the node's own reading


def seconds(cfg: dict, field: str, default: float, floor: float = 0.05) -> float:
    """A period from the config, `default` where absent or unreadable, never below `floor`."""
    try:
        return max(floor, float(cfg.get(field) or default))
    except (TypeError, ValueError):
        return default


def tick_of(cfg: dict) -> float:
    return seconds(cfg, "tick_s", DEFAULT_TICK_S)


def action_key(instance_id: str, down: bool) -> str:
    return "{}:{}".format(instance_id, "delete" if down else "stop")


def key_wants_delete(key: object) -> bool:
    return str(key or "").endswith(":delete")


# What an action's command (a shutdown or exec action) finds in its environment: the cluster, the
# instance (a test kit's stand-in shutdown reads it: cloudtrain/testing/metadata.py), the effect.
ENV_CLUSTER, ENV_INSTANCE_ID, ENV_EFFECT = "CLOUDTRAIN_CLUSTER", "CLOUDTRAIN_INSTANCE_ID", "CLOUDTRAIN_WATCHDOG_EFFECT"

# ------------------------------------------------------------------------------------ decisions

# The log's decision words (watchdog.log); `cloudtrain logs --watchdog` shows them as they are.
DECISIONS = ("start", "config", "busy", "idle", "stop", "delete", "waiting", "interruption", "mark", "expiry",
             "notify", "error", "exit")

# ------------------------------------------------------------------------------------ shared rules

# The last argument of cloudtrain's node helper (cloudtrain/remote/helper.py): a connection whose
# sessions are only such helpers, idle, is cloudtrain's kept connection (signals.ssh_activity).
NODE_HELPER_MARK = "cloudtrain-node-helper"

# Stopped, then deleted (autostop.delete_after_stopped_days; cloudtrain/expiry.py reads them): before
# it stops the machine, the watchdog tags it with when it may be deleted, so that `cloudtrain gc
# --expired` knows with any laptop's state lost. Digits only: valid as a tag value on every cloud
# and as a GCE label.
TAG_DELETE_AFTER = "cloudtrain-delete-after"
TAG_STOPPED_DAYS = "cloudtrain-delete-after-stopped-days"
DAY_S = 86400


def expiry_tags(days: int | None, now: float) -> dict[str, str]:
    """The tags a stop leaves for `autostop.delete_after_stopped_days` = days (none without it)."""
    if days is None:
        return {}
    whole = int(days)
    return {TAG_DELETE_AFTER: str(int(now + whole * DAY_S)), TAG_STOPPED_DAYS: str(whole)}


def launch_tags(days: int | None) -> dict[str, str]:
    """What a launch request carries for `autostop.delete_after_stopped_days` (nothing without it)."""
    return {} if days is None else {TAG_STOPPED_DAYS: str(int(days))}


# Notifications (docs/notifications.md). A run's spend or a cluster's running time past this share
# of its budget is a budget.warning (the laptop's for spend, the node's for running time).
BUDGET_WARNING_SHARE = 0.8
# The node's events by what it did: a stop or a delete by autostop or the budget; a lease's end.
EVENT_STOPPED, EVENT_DELETED, EVENT_DEADLINE = "watchdog.stopped", "watchdog.deleted", "deadline.reached"
EVENT_PREEMPTED, EVENT_BUDGET_WARNING = "run.preempted", "budget.warning"
NOTIFY_TYPES = {"stop": EVENT_STOPPED, "delete": EVENT_DELETED}
ENVELOPE_VERSION = 1


def preemption_event_id(cluster: str, incarnation: str) -> str:
    """One id for the preemption of one incarnation of a cluster, whoever tells it: each node's
    watchdog on the cloud's notice and the laptop when it sees the node gone. A receiver that keeps
    one event per webhook-id (as Standard Webhooks asks) hears of it once, from whichever came first."""
    import hashlib  # here: every CLI start imports this module, few of them need a digest (~5 ms)

    digest = hashlib.sha256(f"run.preempted:{cluster}:{incarnation}".encode()).hexdigest()
    return "msg_" + digest[:24]
