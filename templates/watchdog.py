#!/usr/bin/env python3
"""cloudtrain watchdog: stops (or deletes) this machine when it is idle or over budget.

Standard library only, Python 3.8+: it runs on the node, whatever the job's environment is.

    watchdog.py run    CONFIG   the loop: decide every tick_s, act, log every decision
    watchdog.py check  CONFIG   what counts as activity right now, as one JSON line (acts on nothing)
    watchdog.py ensure CONFIG   a new config on stdin (JSON): written if it changed; the loop started
                                if none runs, surviving reboots where it can; one JSON line back
    watchdog.py stop   CONFIG   end a running loop and remove its reboot hook

CONFIG is ~/.cloudtrain/<cluster>/watchdog.json, written by the CLI (`up`, `run`, `autostop`) and
read again on every tick, so a change takes effect on the next one. Beside it: watchdog.log (every
decision, one line each, `<UTC time> <decision> <detail>`), watchdog.state.json (running time
counted against the budget; it survives reboots), watchdog.pid and watchdog.lock (one loop per
cluster and machine: the loop holds an exclusive lock on it).

Decisions: `start`, `config` (settings changed; the idle clock restarts), `busy`, `idle`, `stop` /
`delete` (acting), `waiting` (acted; the machine should be going down), `interruption`, `mark`,
`expiry`, `notify`, `error`, `exit`.

Stopped, then deleted (`autostop.delete_after_stopped_days`: N): just before a stop the loop tags
the machine cloudtrain-delete-after=<epoch seconds, now + N days> and
cloudtrain-delete-after-stopped-days=N with its own identity (the liveness mark's call, `mark`), an
`expiry` line; `cloudtrain gc --expired --yes` deletes it once that time has passed (tag_expiry).

Notify (`notify`, the recipe's and config's webhook targets that want watchdog.stopped,
watchdog.deleted or deadline.reached): just before it acts, the loop POSTs that event, signed as
Standard Webhooks specifies, with each target's secret from its 0600 file, within NOTIFY_BUDGET_S
(see tell); each result is a `notify` line and a line of notify.sent.jsonl, which ensure returns.

GPUs (`autostop.gpu_util_below`: P): a job that runs while every GPU's utilization.gpu (nvidia-smi,
sampled every gpu_sample_s, default 10 s, while jobs run) stays below P is no activity: the idle
clock counts from the first sample of that quiet run (gpu_rule). A sample that fails, hangs or
cannot be read counts as busy; so does any job whose id matches `busy_jobs` (setup, bucket copies).

Liveness mark (`mark`, from the provider's MarksItself; docs/design/billing.md): while this node
works (a job, setup or copy running or starting, a user's ssh session), the loop renews the
instance's `cloudtrain-alive` label/tag every `mark_every_s` (300) with the machine's own identity:
{"kind": "http-mark", "key", "token", "get": url, "field": "labels"|"tags", "fingerprint": field or
absent, "method", "url", "ok", "retry"} (read, merge, write back; renew_mark). {"kind": "none",
"why"}: the machine has no identity that may (nothing is tried). A failed mark is logged, retried
with backoff, and changes no decision.

Interruption notices (`interruption`: the cloud's name, set for runs that recover, docs/recovery.md):
every NOTICE_TICK_S the loop asks the metadata server whether the cloud is taking the machine back
(NOTICES: EC2's spot/instance-action, GCE's instance/preempted, Azure's Scheduled Events Preempt).
On a notice it writes interruption.json beside the config (the CLI reads it) and ends the running
jobs with runner.sh kill: TERM now, so a job can write a last checkpoint, KILL after a grace that
fits inside the cloud's warning (NOTICE_GRACE_S); where the CLI left on_notice.sh beside the config
(a run with `upload:`), it starts it: the results and checkpoints go to the bucket. Once per machine.

Activity (what restarts the idle clock), by `autostop.wait_for`:
  jobs_and_ssh  a cloudtrain job of this cluster running (or starting) on this node, a new job
                appearing, or an SSH session: an established TCP connection to this node's sshd
                port, unless all it runs is cloudtrain's own node helper, idle (the connection a
                command or its mux keeps for the next one; ssh_activity)
  jobs          jobs only
  none          nothing: the machine stops idle_s after the watchdog started or its settings changed
Jobs are read the way templates/runner.sh reports them (`runner.sh status`): exit_code present means
over; a supervisor pid that is alive means running.

The budget is a hard limit on running time (`budget.limit_s`, from max_hours and max_usd / the
cluster's hourly price): it fires even while a job runs. The laptop sends the time already used
(`budget.used_s`, from billed intervals) with an `epoch`; the node counts on from there, across
reboots, until a config with another epoch arrives.

The lease (`lease`, a sweep VM's) is a hard deadline: {"until": <unix time by which the delete must
have been called>, "why": "...", "sent_at": <the CLI's clock when it sent this>}. When it passes, the
machine is deleted whether or not a job runs (the action is then always a delete: the CLI asks the
provider for the delete action for a node with a lease). Clocks: `until` is the laptop's wall clock.
`ensure` also notes, on this node, when it wrote the lease (`mono_until`: this node's monotonic clock
plus until - sent_at, and the boot it belongs to), so the lease falls due at the EARLIER of
`until` on this node's wall clock and `mono_until` on its monotonic clock (same boot only). A node
clock that is behind (or jumps back) still fires on time, one that is ahead fires early (safe); the
price of the monotonic rule is the config's transit time (well inside the CLI's safety margin).

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
After an action succeeds the loop waits `retry_s` (default 300) for the machine to go down before
acting again; a failed action is retried on the next ticks, with backoff.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

VERSION = 1
WAIT_FOR = ("jobs_and_ssh", "jobs", "none")
DEFAULT_TICK_S = 15.0
DEFAULT_RETRY_S = 300.0
PENDING_GRACE_S = 120.0  # a job dir without a pid counts as "starting" this long
LOG_MAX_BYTES = 1 << 20
ACTION_TIMEOUT_S = 120.0
# The last argument of cloudtrain's node helper (cloudtrain/remote/helper.py NODE_HELPER_MARK): a
# connection whose sessions are only such helpers, idle, is cloudtrain's kept connection (ssh_activity).
NODE_HELPER_MARK = "cloudtrain-node-helper"
MARK_EVERY_S = 300.0  # the liveness mark's renewal while the node works (cloudtrain/cluster/liveness.py)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_json(path: str, data, mode: int = 0o600) -> None:
    """Atomically: readers see the old file or the new one, whole."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


class Paths:
    def __init__(self, config_path: str) -> None:
        self.config = os.path.abspath(config_path)
        self.root = os.path.dirname(self.config)
        self.log = os.path.join(self.root, "watchdog.log")
        self.state = os.path.join(self.root, "watchdog.state.json")
        self.lock = os.path.join(self.root, "watchdog.lock")
        self.pid = os.path.join(self.root, "watchdog.pid")
        self.hook = os.path.join(self.root, "watchdog.hook")
        self.jobs = os.path.join(self.root, "jobs")
        self.runner = os.path.join(self.root, "runtime", "runner.sh")


class Log:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, decision: str, detail: str) -> None:
        line = f"{utc_now()} {decision} {detail}\n"
        try:
            if os.path.getsize(self.path) > LOG_MAX_BYTES:
                os.replace(self.path, self.path + ".1")
        except OSError:
            pass
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError:
            sys.stderr.write(line)


# ------------------------------------------------------------------------------------ what is going on


def job_state(job_dir: str, runner: str) -> str:
    """running | pending | succeeded | failed | killed | lost, as `runner.sh status` says."""
    if os.path.exists(os.path.join(job_dir, "exit_code")):
        return "over"  # written last: the job and everything it started are over
    if os.path.exists(runner):
        try:
            out = subprocess.run(["sh", runner, "status", job_dir], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, timeout=30, check=False).stdout
            return str(json.loads(out.decode("utf-8", "replace"))["state"])
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            pass
    # No runner (never prepared, or removed): the same rules, read here.
    try:
        with open(os.path.join(job_dir, "pid"), encoding="utf-8") as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return "pending"
    if _supervisor_alive(pid, job_dir):
        return "running"
    # The supervisor writes exit_code, then exits: one that ended since the first look left it.
    return "over" if os.path.exists(os.path.join(job_dir, "exit_code")) else "lost"


def _supervisor_alive(pid: int, job_dir: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if (read_text("/proc/{}/stat".format(pid)).rsplit(")", 1)[-1].split() or [""])[0] == "Z":
        return False  # a zombie has ended
    recorded = read_text(os.path.join(job_dir, "identity"))
    # A pid that lives but is another process now (reused after a reboot) is not the supervisor.
    return not recorded or recorded == process_identity(pid)


def process_identity(pid: int) -> str:
    """BOOT:PID:TICKS as runner.sh's proc_identity writes it (cloudtrain/procid.py's format)."""
    stat = read_text("/proc/{}/stat".format(pid)) or ""
    fields = stat.rsplit(")", 1)[-1].split()
    ticks = fields[19] if len(fields) >= 20 else ""
    return "{}:{}:{}".format(read_text("/proc/sys/kernel/random/boot_id") or "", pid, ticks)


def observe_jobs(paths: Paths, now: float) -> dict:
    """Job ids of this cluster on this node by what they count for."""
    found = {"all": [], "running": [], "starting": [], "over": []}
    try:
        names = sorted(os.listdir(paths.jobs))
    except OSError:
        return found
    for name in names:
        job_dir = os.path.join(paths.jobs, name)
        if not os.path.isdir(job_dir):
            continue
        found["all"].append(name)
        state = job_state(job_dir, paths.runner)
        if state == "over":
            found["over"].append(name)
        elif state == "running":
            found["running"].append(name)
        elif state == "pending":
            # Being started right now; a start that failed must not keep the machine up forever.
            try:
                age = now - os.stat(job_dir).st_mtime
            except OSError:
                continue
            if age < PENDING_GRACE_S:
                found["starting"].append(name)
    return found


def ssh_connections(port) -> list | None:
    """Established TCP connections to this node's sshd port (server side), one (client address as
    packed bytes, client port) each, or None if unknown."""
    if not port:
        return None
    listening, established = [], []
    seen = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            address, _, hex_port = fields[1].rpartition(":")
            try:
                if int(hex_port, 16) != int(port):
                    continue
            except ValueError:
                continue
            if fields[3] == "0A":  # LISTEN
                listening.append(address)
            elif fields[3] == "01":  # ESTABLISHED
                established.append((address, fields[2]))
    if not seen:
        return None
    # Server sides only: a connection accepted on one of sshd's listening addresses. (An outgoing
    # connection from another local address may have been given the same port number.)
    wildcard = any(set(a) == {"0"} for a in listening)
    return [_peer(remote) for local, remote in established if not listening or wildcard or local in listening]


def _peer(hex_address: str) -> tuple:
    """/proc/net/tcp's "0100007F:D431" as (packed address, port): the address is 32-bit words in
    this machine's byte order; an IPv4-mapped IPv6 address is the IPv4 one."""
    address, _, port = hex_address.rpartition(":")
    try:
        packed = b"".join(struct.pack("=I", int(address[i:i + 8], 16)) for i in range(0, len(address), 8))
        return _unmapped(packed), int(port, 16)
    except (ValueError, struct.error):
        return b"", -1


def _unmapped(packed: bytes) -> bytes:
    return packed[12:] if len(packed) == 16 and packed[:12] == b"\0" * 10 + b"\xff\xff" else packed


def _client_of(ssh_connection: bytes) -> tuple | None:
    """$SSH_CONNECTION ("client_ip client_port server_ip server_port") as (packed client address, port)."""
    fields = ssh_connection.decode("ascii", "replace").split()
    if len(fields) != 4:
        return None
    host = fields[0].split("%", 1)[0]
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return _unmapped(socket.inet_pton(family, host)), int(fields[1])
        except (OSError, ValueError):
            continue
    return None


def _process_table() -> dict:
    """pid -> (command name, state, parent pid) of every process on this machine."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
            head, _, rest = text.rpartition(")")
            fields = rest.split()
            table[int(name)] = (head.partition("(")[2], fields[0], int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return table


def _proc_strings(pid: int, what: str) -> list:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []  # another user's process, or gone


def ssh_activity(port) -> tuple | None:
    """(sessions that count, idle connections of cloudtrain's own), or None if unknown.

    Every established connection to sshd counts, unless all it runs is cloudtrain's node helper
    waiting for a request: the connection a command or its mux keeps (ssh.persist_s), which runs
    nothing of the user's. What a connection runs: the processes sshd started for its sessions
    (children of an sshd process), matched to the connection by their $SSH_CONNECTION. A node helper
    carries NODE_HELPER_MARK as its last argument (cloudtrain/remote/helper.py); it is idle when no
    command it was sent runs (no child process: a job it started detached itself and counts as a
    job). A connection whose sessions cannot be seen (none yet, a port forward, another user's)
    counts, as do a shell, an sftp server, and a helper running a command (`exec`'s log follow).
    """
    peers = ssh_connections(port)
    if not peers:
        return None if peers is None else (0, 0)
    table = _process_table()
    children = {}
    for pid, (_, state, parent) in table.items():
        if state != "Z":
            children.setdefault(parent, []).append(pid)
    busy, idle_helpers = set(), set()
    for pid, (_, state, parent) in table.items():
        if state == "Z" or parent not in table or not table[parent][0].startswith("sshd"):
            continue
        client = next((_client_of(entry[len(b"SSH_CONNECTION="):]) for entry in _proc_strings(pid, "environ")
                       if entry.startswith(b"SSH_CONNECTION=")), None)
        if client is None:
            continue
        argv = [arg for arg in _proc_strings(pid, "cmdline") if arg]
        helper = len(argv) >= 3 and argv[-1] == NODE_HELPER_MARK.encode() and b"-c" in argv
        (idle_helpers if helper and not children.get(pid) else busy).add(client)
    counted = sum(1 for peer in peers if peer in busy or peer not in idle_helpers)
    return counted, len(peers) - counted


def session_rule(seen: int, now, absent: int):
    """What this look's ssh session count means: (busy text or None, ended now, seen, absent).

    seen: the sessions last seen (0: none); now: this look's count (None: unknown); absent: how
    many looks in a row found none of the `seen` sessions. The kernel hands /proc/net/tcp out a
    page at a time, so on a busy machine one read can miss a live connection: a session counts as
    ended only when two looks in a row (a tick apart, each read twice) find none. Until then the
    node is busy with it, so a user logged in is never taken for idle.
    """
    if now is None:
        return None, False, 0, 0
    if now > 0:
        return f"{now} ssh session(s)", False, now, 0
    if not seen:
        return None, False, 0, 0
    if absent < 1:
        return f"{seen} ssh session(s) (not seen this look; confirming on the next)", False, seen, absent + 1
    return None, True, 0, 0


# ------------------------------------------------------------------------------------ GPU idleness

GPU_QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
GPU_SAMPLE_S = 10.0  # how often the GPUs are sampled while a job runs (`gpu_sample_s` overrides, for tests)
GPU_SAMPLE_TIMEOUT_S = 5.0


def sample_gpus(timeout: float = GPU_SAMPLE_TIMEOUT_S) -> tuple[list | None, str]:
    """Every GPU's utilization.gpu in %, or (None, why) when nvidia-smi is missing, fails, hangs or
    says something else than numbers (MIG's [N/A]): such a sample counts as busy. The sampler runs in
    a session of its own, so that a hung one is ended with whatever it started."""
    try:
        proc = subprocess.Popen(GPU_QUERY, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return None, f"nvidia-smi: {type(exc).__name__}: {exc}"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        return None, f"nvidia-smi timed out after {timeout:g}s"
    text = out.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        return None, "nvidia-smi exited {}: {}".format(proc.returncode, (text.splitlines() or [""])[-1][:120])
    try:
        values = [float(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        return None, f"nvidia-smi said {text[:80]!r}"
    if not values:
        return None, "nvidia-smi listed no GPU"
    return values, ",".join(f"{v:g}%" for v in values)


def gpu_rule(samples: list, below: float, window_s: float, now: float) -> tuple[str, float | None, str]:
    """What the GPUs say of the jobs running: ("busy", None, why), ("quiet", since, why) or
    ("idle", since, why). samples: (monotonic time, [utilization % per GPU] or None for a failed
    sample), oldest first. `since` is the first sample of the trailing run in which every sample read
    every GPU below `below`: the idle clock counts from there (not from the last busy sample: between
    samples nothing is known). "idle": that run spans `window_s`. No sample yet, a failed last sample
    or any GPU at `below` or more: busy (a broken check never stops a VM)."""
    since, count = None, 0
    for at, values in reversed(samples):
        if values is None or any(v >= below for v in values):
            break
        since, count = at, count + 1
    if not samples:
        return "busy", None, f"gpu: no sample yet (< {below:g}% to idle)"
    last = samples[-1][1]
    if last is None:
        return "busy", None, "gpu: the last sample failed (counts as busy)"
    shown = ",".join(f"{v:g}%" for v in last)
    if since is None:
        return "busy", None, f"gpu {shown} (not all < {below:g}%)"
    quiet = now - since
    return ("idle" if quiet >= window_s else "quiet"), since, "gpu {} < {:g}% for {:.0f}/{:g}s ({} sample(s))".format(
        shown, below, quiet, window_s, count)


# ------------------------------------------------------------------------------------ acting


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


# Stopped, then deleted (autostop.delete_after_stopped_days; cloudtrain/expiry.py holds the same two
# names, and tests/watchdog/test_expiry_mark.py pins them equal): before it stops the machine, the
# watchdog tags it with when it may be deleted, so that `cloudtrain gc --expired` knows with any
# laptop's state lost. Digits only: valid as a tag value on every cloud and as a GCE label.
TAG_DELETE_AFTER = "cloudtrain-delete-after"
TAG_STOPPED_DAYS = "cloudtrain-delete-after-stopped-days"


def expiry_tags(days, now: float) -> dict:
    """The tags a stop leaves for `autostop.delete_after_stopped_days` = days (none without it)."""
    if days is None:
        return {}
    days = int(days)
    return {TAG_DELETE_AFTER: str(int(now + days * 86400)), TAG_STOPPED_DAYS: str(days)}


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


# The clouds' interruption notices, read from this machine's metadata server (`interruption` in the
# config names the cloud; `metadata_url` rebases the URLs, for tests). Each entry: the URL, its
# headers, the session-token request EC2's IMDSv2 needs first, and how an answer reads as a notice.
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
NOTICE_FILE = "interruption.json"  # beside the config; the CLI reads it (cloudtrain/run/recover.py)
NOTICE_GRACE_S = {"aws": 100.0, "gcp": 20.0, "azure": 20.0}  # TERM, then KILL after this (inside the warning)
# Left beside the config by the CLI for a run with `upload:` (cloudtrain/run/recover_upload.py): started
# on a notice, it waits for the TERMed job's end and uploads the results and checkpoints to the bucket.
NOTICE_SCRIPT = "on_notice.sh"


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
    env = {"CLOUDTRAIN_CLUSTER": str(cfg.get("cluster", "")), "CLOUDTRAIN_INSTANCE_ID": str(cfg.get("instance_id", "")),
           "CLOUDTRAIN_WATCHDOG_EFFECT": str(action.get("effect", ""))}
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


# ------------------------------------------------------------------------------------ telling (notify)
# The node's own events (docs/notifications.md), sent just before it stops or deletes itself, so a
# closed laptop still hears. `notify` in the config (cloudtrain/run/watchdog.py): {"cloud", "targets":
# [{"name", "ref", "url", "on": [types], "secret_file"}]}; each secret is a 0600 file beside the
# config, never in the config, a log line or a command line. The envelope and signature are
# cloudtrain/notify/model.py's and signing.py's (Standard Webhooks), redone with the standard library.

NOTIFY_BUDGET_S = 3.0  # all targets together: the stop waits no longer than this
NOTIFY_WAITS = (0.2, 0.5, 1.0)  # between attempts, the same id on each
SENT_LOG = "notify.sent.jsonl"  # what the node sent; the CLI reconciles it into its outbox
# budget.warning: the running time passed this share of the budget (cloudtrain/notify/model.py
# BUDGET_WARNING_SHARE, the laptop's for spend).
BUDGET_WARNING_SHARE = 0.8
NOTIFY_TYPES = {"stop": "watchdog.stopped", "delete": "watchdog.deleted"}  # a lease's end: deadline.reached
SENT_KEEP = 50  # lines kept: the CLI records idempotently, and a node sends once per stop
_SENT_LOCK = threading.Lock()  # the loop and a notice's sender thread may both append


def preemption_event_id(cluster: str, incarnation: str) -> str:
    """The laptop's rule (cloudtrain/notify/model.py preemption_event_id): one id per preempted
    incarnation, whichever node or the laptop tells it, so a receiver hears it once."""
    import hashlib

    return "msg_" + hashlib.sha256(f"run.preempted:{cluster}:{incarnation}".encode()).hexdigest()[:24]


def node_event(cfg: dict, kind: str, reason: str, event_id: str | None = None,
               extra: dict | None = None) -> tuple[str, str]:
    """(id, body): the envelope as the laptop builds it (version 1, key-sorted, compact)."""
    import secrets as random

    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".{:03d}Z".format(int(now % 1 * 1000))
    event_id = event_id or "msg_" + random.token_hex(12)
    data = {"cluster": cfg.get("cluster"), "cloud": (cfg.get("notify") or {}).get("cloud"),
            "instance": cfg.get("instance_id"), "reason": reason, **(extra or {})}
    envelope = {"version": 1, "type": kind, "id": event_id, "timestamp": stamp, "source": "node",
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
    path = os.path.join(paths.root, SENT_LOG)
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
    for line in read_text(os.path.join(paths.root, SENT_LOG)).splitlines():
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
        if name.startswith("notify-") and name.endswith(".secret") and name not in wanted:
            os.unlink(os.path.join(paths.root, name))


# ------------------------------------------------------------------------------------ the loop


def describe_settings(cfg: dict) -> str:
    auto, budget, action = cfg.get("autostop"), cfg.get("budget"), cfg.get("action") or {}
    parts = []
    if auto:
        waits = {"jobs_and_ssh": "jobs and ssh sessions", "jobs": "jobs", "none": "nothing"}
        parts.append("autostop after {:g}s idle ({}, waiting for {})".format(
            float(auto["idle_s"]), action.get("effect", "stop"), waits.get(auto.get("wait_for"), auto.get("wait_for"))))
    else:
        parts.append("autostop off")
    if auto and auto.get("gpu_util_below") is not None:
        parts.append("a running job is idle while every GPU stays < {:g}%".format(float(auto["gpu_util_below"])))
    if auto and auto.get("delete_after_stopped_days") is not None:
        parts.append("a stop tags the machine for deletion {:d} days later".format(int(auto["delete_after_stopped_days"])))
    if budget:
        parts.append("budget {:g}s of running time ({})".format(float(budget["limit_s"]), budget.get("why", "")))
    mark = cfg.get("mark") or {}
    if mark.get("kind") == "http-mark":
        parts.append("liveness mark every {:g}s while working".format(float(cfg.get("mark_every_s") or MARK_EVERY_S)))
    elif mark.get("why"):
        parts.append("no liveness mark ({})".format(mark["why"]))
    if cfg.get("lease"):
        parts.append(describe_lease(cfg["lease"]))
    parts.append("action {}".format(action.get("kind", "none")))
    parts.append(f"tick {tick_of(cfg):g}s")
    return ", ".join(parts)


def boot_id() -> str:
    """This boot of the machine (a monotonic clock reading means nothing after a reboot)."""
    return read_text("/proc/sys/kernel/random/boot_id") or "unknown"


def lease_left(lease, now: float, now_m: float) -> float | None:
    """Seconds until the lease falls due (<= 0: due), or None without a valid lease: the earlier of
    its wall-clock time and its monotonic reading on this boot (see the module's docstring)."""
    if not isinstance(lease, dict):
        return None
    try:
        left = float(lease["until"]) - now
    except (KeyError, TypeError, ValueError):
        return None
    mono = lease.get("mono_until")
    if isinstance(mono, (int, float)) and lease.get("boot_id") == boot_id():
        left = min(left, float(mono) - now_m)
    return left


def describe_lease(lease) -> str:
    try:
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(lease["until"])))
    except (KeyError, TypeError, ValueError):
        return "lease invalid"
    return "lease: delete by {} ({})".format(until, lease.get("why", ""))


def tick_of(cfg: dict) -> float:
    try:
        return max(0.05, float(cfg.get("tick_s") or DEFAULT_TICK_S))
    except (TypeError, ValueError):
        return DEFAULT_TICK_S


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
        self.noticed = os.path.exists(os.path.join(self.paths.root, NOTICE_FILE))
        self.hook_text = read_text(self.paths.hook)  # how this loop survives reboots (its files may go)
        self.gpu_samples = []  # (monotonic time, [% per GPU] or None) while jobs run (gpu_util_below)
        self.gpu_why = ""
        self.marked_at = None  # when this loop last renewed the liveness mark (monotonic)
        self.mark_failures = 0
        self.mark_retry = 0.0
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
                self.tell_in_background(cfg, "budget.warning", "budget: {:.0f}s of running time of {:.0f}s ({:.0%}; {})".format(
                    used, limit, used / limit, budget.get("why", "")), None, {"used_s": round(used), "limit_s": round(limit)})
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
                verdict, gpu_since, gpu_text = self.gpu_verdict(cfg, auto, jobs["running"], now_m)
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
            self.gpu_samples = []  # a job's GPUs are judged from its own samples only
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
                self.keep_mark(cfg, working, now_m)
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
            if since < float(cfg.get("retry_s") or DEFAULT_RETRY_S):
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
            kind = "deadline.reached" if reason.startswith("lease") else NOTIFY_TYPES.get(effect, "watchdog.stopped")
            try:
                tell(cfg, self.paths, self.log, kind, reason)
            except Exception as exc:  # noqa: BLE001 - a notification never keeps the machine up
                self.log("error", f"notify: {type(exc).__name__}: {exc}")
        if effect == "stop" and not self.tagged:
            self.tagged = True  # once per stop, however often the action is retried
            self.tag_expiry(cfg)
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

    def gpu_verdict(self, cfg: dict, auto: dict, running: list, now_m: float) -> tuple[str, float | None, str]:
        """gpu_rule for the jobs running, sampling the GPUs when a sample is due. Not armed
        (`autostop.gpu_util_below` unset), or a setup or bucket copy among them (`busy_jobs`, their
        ids' patterns from the CLI): busy, as any job."""
        below = auto.get("gpu_util_below")
        if below is None:
            return "busy", None, ""
        steady = [j for j in running if any(fnmatch.fnmatchcase(j, p) for p in cfg.get("busy_jobs") or ())]
        if steady:
            return "busy", None, "setup or copy ({}): busy whatever the GPUs do".format(", ".join(steady[:3]))
        every = max(0.05, float(cfg.get("gpu_sample_s") or GPU_SAMPLE_S))
        if not self.gpu_samples or now_m - self.gpu_samples[-1][0] >= every:
            values, self.gpu_why = sample_gpus(min(GPU_SAMPLE_TIMEOUT_S, max(1.0, every)))
            self.gpu_samples.append((now_m, values))
            # What gpu_rule can still need: the window and one sample before it.
            keep_from = now_m - float(auto["idle_s"]) - 2 * every
            self.gpu_samples = [s for s in self.gpu_samples if s[0] >= keep_from]
        self.wake_in = min(self.wake_in, every)
        verdict, since, text = gpu_rule(self.gpu_samples, float(below), float(auto["idle_s"]), now_m)
        if self.gpu_samples[-1][1] is None:
            text += f": {self.gpu_why}"
        return verdict, since, text

    def tag_expiry(self, cfg: dict) -> None:
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
            self.log("expiry", f"not tagged ({why}): gc counts {int(days)} days from the cloud's stop time")
            return
        try:
            ok, detail = set_tags(mark, cfg, expiry_tags(days, time.time()))
        except Exception as exc:  # noqa: BLE001 - a failed tag must never keep the machine up
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if ok:
            self.log("expiry", f"tagged before the stop: {detail}")
        else:
            self.log("error", f"expiry tags not written ({detail}); gc counts from the cloud's stop time")

    def keep_mark(self, cfg: dict, working: bool, now_m: float) -> None:
        """While this node works (a job, setup or copy running or starting, a user's ssh session), its
        liveness mark renewed every `mark_every_s` with the machine's own identity (`mark`, from the
        provider), so that `gc` from any state leaves it alone with no CLI holding it. A failed mark
        is logged and tried again (backoff); it changes no decision."""
        mark = cfg.get("mark") or {}
        if mark.get("kind") != "http-mark":
            return
        every = max(0.05, float(cfg.get("mark_every_s") or MARK_EVERY_S))
        if (self.marked_at is not None and now_m - self.marked_at < every) or now_m < self.mark_retry:
            return
        if not working and cfg.get("count_ssh") and (cfg.get("autostop") or {}).get("wait_for") != "jobs_and_ssh":
            activity = ssh_activity(cfg.get("ssh_port"))  # (the autostop rule did not read the sessions)
            working = bool(activity and activity[0])
        if not working:
            return
        ok, detail = renew_mark(mark, cfg, time.time())
        if ok:
            self.marked_at, self.mark_failures, self.mark_retry = now_m, 0, 0.0
            self.log("mark", f"alive: {detail}")
            return
        self.mark_failures += 1
        backoff = min(every, tick_of(cfg) * (2 ** min(self.mark_failures, 10)))
        self.mark_retry = now_m + backoff
        self.log("error", f"liveness mark failed (try {self.mark_failures}, next in {backoff:.0f}s): {detail}")

    def watch_for_notice(self, cfg: dict) -> None:
        """The cloud's interruption notice: once seen, say so in a file the CLI reads, and TERM the
        running jobs so that they can write a last checkpoint while the machine is still here."""
        self.wake_in = min(self.wake_in, NOTICE_TICK_S)
        kind = str(cfg["interruption"])
        seen, detail = interruption_notice(kind, cfg)
        if not seen:
            return
        self.noticed = True
        running = observe_jobs(self.paths, time.time())["running"]
        script = os.path.join(self.paths.root, NOTICE_SCRIPT)
        upload = os.path.exists(script)
        try:
            write_json(os.path.join(self.paths.root, NOTICE_FILE),
                       {"kind": kind, "detail": detail, "at": time.time(), "jobs": running, "upload": upload},
                       mode=0o644)
        except OSError as exc:
            self.log("error", f"cannot record the interruption notice: {exc}")
        self.log("interruption", "{}; TERM to {} job(s): {}".format(detail, len(running), ", ".join(running) or "none"))
        end_jobs_on_notice(self.paths, running, NOTICE_GRACE_S.get(kind, 20.0))
        if upload:  # in the background, in a session of its own: the loop goes on
            subprocess.Popen(["sh", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            self.log("interruption", f"started {NOTICE_SCRIPT}: the results and checkpoints to the bucket")
        self.tell_preempted(cfg, detail, running)

    def tell_preempted(self, cfg: dict, detail: str, running: list) -> None:
        """run.preempted to the targets that want it, after the jobs were TERMed (their checkpoint
        comes first) and in a thread (the loop goes on watching): the machine may have seconds
        left, and with the laptop closed this is the only one who knows."""
        incarnation = cfg.get("incarnation")
        event_id = preemption_event_id(str(cfg.get("cluster")), str(incarnation)) if incarnation else None
        self.tell_in_background(cfg, "run.preempted", detail, event_id, {"jobs": list(running)})

    def tell_in_background(self, cfg: dict, kind: str, reason: str, event_id: str | None, extra: dict) -> None:
        """`tell` in a thread of its own: the loop goes on (a notification never holds it)."""

        def send() -> None:
            try:
                tell(cfg, self.paths, self.log, kind, reason, event_id, extra)
            except Exception as exc:  # noqa: BLE001 - a notification never holds the loop
                self.log("error", f"notify: {type(exc).__name__}: {exc}")

        threading.Thread(target=send, daemon=True).start()

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


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def try_lock(paths: Paths):
    """The loop's lock file, held; None if another process holds it."""
    import fcntl

    try:
        handle = open(paths.lock, "a+")  # noqa: SIM115 - held for as long as the loop runs
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return handle


def running_pid(paths: Paths) -> int | None:
    """The pid of the loop holding the lock, or None when none runs."""
    if not os.path.exists(paths.lock):
        return None
    lock = try_lock(paths)
    if lock is not None:
        lock.close()
        return None
    try:
        return int(read_text(paths.pid))
    except ValueError:
        return -1  # held, pid file not written yet


# ------------------------------------------------------------------------------------ ensure / reboots


def unit_name(cfg: dict) -> str:
    return "cloudtrain-watchdog-{}.service".format(cfg.get("cluster", "cluster"))


def quiet(argv, timeout: float = 30) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def output(argv, timeout: float = 30) -> str:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def systemd_user_ready() -> tuple[bool, str]:
    """A systemd user manager that keeps running without a login (linger), so a unit survives reboots."""
    if not shutil.which("systemctl") or not quiet(["systemctl", "--user", "show-environment"]):
        return False, "no systemd user manager"
    user = user_name()
    if output(["loginctl", "show-user", user, "--property=Linger", "--value"]).strip() == "yes":
        return True, ""
    if quiet(["loginctl", "enable-linger"]) or quiet(["sudo", "-n", "loginctl", "enable-linger", user]):
        return True, ""
    # Without linger the user manager, and the unit with it, ends at logout.
    return False, "systemd user manager without linger (loginctl enable-linger refused)"


def install_systemd(paths: Paths, cfg: dict, python: str, program: str) -> bool:
    unit_dir = os.path.join(os.path.expanduser("~"), ".config", "systemd", "user")
    os.makedirs(unit_dir, exist_ok=True)
    unit = unit_name(cfg)
    text = (
        "[Unit]\nDescription=cloudtrain watchdog for cluster {} (autostop, budget)\n\n"
        "[Service]\nExecStart={} {} run {}\nRestart=on-failure\nRestartSec=10\n\n"
        "[Install]\nWantedBy=default.target\n"
    ).format(cfg.get("cluster", ""), shlex.quote(python), shlex.quote(program), shlex.quote(paths.config))
    with open(os.path.join(unit_dir, unit), "w", encoding="utf-8") as handle:
        handle.write(text)
    return quiet(["systemctl", "--user", "daemon-reload"]) and quiet(["systemctl", "--user", "enable", "--now", unit])


def cron_marker(paths: Paths) -> str:
    return f"# cloudtrain-watchdog {paths.config}"


def install_cron(paths: Paths, python: str, program: str) -> bool:
    if not shutil.which("crontab"):
        return False
    current = output(["crontab", "-l"])
    marker = cron_marker(paths)
    if marker in current:
        return True
    line = f"@reboot {shlex.quote(python)} {shlex.quote(program)} run {shlex.quote(paths.config)} >/dev/null 2>&1 {marker}\n"
    text = (current if current.endswith("\n") or not current else current + "\n") + line
    try:
        proc = subprocess.run(["crontab", "-"], input=text.encode(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def remove_hook(paths: Paths, hook=None, cfg=None) -> None:
    """Undo install_systemd / install_cron (the loop is ending for good). `hook` and `cfg`: what the
    loop read before its files were removed (`down` of a machine we do not own removes them)."""
    hook = read_text(paths.hook) if hook is None else hook
    cfg = (read_json(paths.config) or {}) if cfg is None else cfg
    if hook.startswith("systemd"):
        unit = unit_name(cfg)
        quiet(["systemctl", "--user", "disable", unit])
        try:
            os.unlink(os.path.join(os.path.expanduser("~"), ".config", "systemd", "user", unit))
        except OSError:
            pass
    elif hook.startswith("cron") and shutil.which("crontab"):
        current = output(["crontab", "-l"])
        marker = cron_marker(paths)
        if marker in current:
            kept = "".join(line for line in current.splitlines(True) if marker not in line)
            try:
                subprocess.run(["crontab", "-"], input=kept.encode(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30, check=False)
            except (OSError, subprocess.SubprocessError):
                pass
    try:
        os.unlink(paths.hook)
    except OSError:
        pass


def start_detached(paths: Paths, python: str, program: str) -> None:
    """setsid + no terminal, stdio to the log: it outlives the SSH session that started it."""
    with open(paths.log, "ab") as log:
        subprocess.Popen([python, program, "run", paths.config], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         cwd=paths.root, start_new_session=True, close_fds=True)


def wait_running(paths: Paths, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = running_pid(paths)
        if pid is not None and pid > 0:
            return pid
        time.sleep(0.02)
    return running_pid(paths)


# Fields the CLI sends that change on every write without changing what the loop does.
_VOLATILE = ("written_at",)


def _comparable(cfg) -> dict | None:
    if not isinstance(cfg, dict):
        return None
    out = {k: v for k, v in cfg.items() if k not in _VOLATILE}
    if isinstance(out.get("budget"), dict):
        out["budget"] = {k: v for k, v in out["budget"].items() if k != "used_s"}
    if isinstance(out.get("lease"), dict):
        # The same lease sent again: the node keeps its first reading (they agree on the deadline).
        out["lease"] = {k: v for k, v in out["lease"].items() if k not in _LEASE_STAMPS}
    return out


# What ensure adds to a lease on the node, and when it was sent: not part of what the lease says.
_LEASE_STAMPS = ("sent_at", "mono_until", "boot_id")


def stamp_lease(lease: dict) -> dict:
    """The lease with this node's monotonic reading of its deadline (see the module's docstring)."""
    out = dict(lease)
    try:
        remaining = float(lease["until"]) - float(lease.get("sent_at", lease["until"]))
    except (KeyError, TypeError, ValueError):
        return out  # unreadable: the loop says so in its log
    out["mono_until"] = time.monotonic() + remaining
    out["boot_id"] = boot_id()
    return out


def power_off_refusal(cfg: dict) -> str:
    """Why this node could not power itself off when the watchdog acts, or "" when it can (or the
    action is no OS shutdown, or a stand-in replaces it). Not root: `shutdown` needs passwordless
    sudo, which images without it (or an admin's sudoers) do not give."""
    action = cfg.get("action") or {}
    enforces = cfg.get("autostop") or cfg.get("budget") or cfg.get("lease")
    if not enforces or action.get("kind") != "shutdown" or cfg.get("shutdown_command") or os.geteuid() == 0:
        return ""
    for probe in (["sudo", "-n", "true"], ["sudo", "-n", "-l", "shutdown"]):
        try:
            done = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            last = f"{probe[0]}: {type(exc).__name__}: {exc}"
            continue
        if done.returncode == 0:
            return ""
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        last = last[0][:200]
    return (f"powering this node off needs passwordless sudo for {user_name()} (`sudo -n shutdown`), and "
            f"`sudo -n` says: {last}")


def ensure(config_path: str, new: dict, python: str, program: str, secrets=None) -> dict:
    """Write `new` if it changed and make sure a loop runs. `new` may lack its action (the CLI
    avoids a cloud call when the node already has the action for the same instance and effect):
    then the old one is kept, or {"status": "need-action"} comes back and nothing is written."""
    paths = Paths(config_path)
    os.makedirs(paths.root, exist_ok=True)
    old = read_json(paths.config)
    old = old if isinstance(old, dict) else {}
    for key in new.pop("keep", None) or ():
        # Settings this write does not own (e.g. `autostop` keeps the recipe's budget).
        if key in old:
            new[key] = old[key]
        else:
            new.setdefault(key, None)
    if new.get("lease"):
        # A machine under a lease is only ever deleted (on AWS one instance cannot both stop on one
        # shutdown and terminate on another): a write that keeps the lease (`cloudtrain autostop`)
        # must not turn its action into a stop.
        key = str(new.get("action_key") or "")
        if key.endswith(":stop"):
            new["action_key"] = key[: -len(":stop")] + ":delete"
            if (new.get("action") or {}).get("effect") != "delete":
                new["action"] = None
    if new.get("action") is None:
        if old.get("action") and old.get("action_key") == new.get("action_key"):
            new["action"] = old["action"]
        else:
            return {"status": "need-action", "down": str(new.get("action_key") or "").endswith(":delete")}
    if new.get("mark_key") and not new.get("mark"):
        # The liveness mark's call (or the provider's word that this machine cannot mark itself),
        # kept per instance like the action.
        if old.get("mark") and old.get("mark_key") == new["mark_key"]:
            new["mark"] = old["mark"]
        else:
            return {"status": "need-action", "down": str(new.get("action_key") or "").endswith(":delete")}
    refused = power_off_refusal(new)
    if refused:
        # Checked here, at `up`: otherwise autostop and budgets would silently never fire.
        return {"status": "refused", "why": refused}
    if new.get("count_ssh") and not new.get("ssh_port"):
        # This very command came in over SSH: $SSH_CONNECTION names the port sshd listens on here.
        fields = os.environ.get("SSH_CONNECTION", "").split()
        new["ssh_port"] = int(fields[3]) if len(fields) == 4 and fields[3].isdigit() else old.get("ssh_port")
    changed = _comparable(old) != _comparable(new)
    if changed:
        lease, before = new.get("lease"), old.get("lease")
        if isinstance(lease, dict):
            same = isinstance(before, dict) and _comparable({"lease": before}) == _comparable({"lease": lease})
            # The same lease (kept, or sent again with other changes) keeps the node's first reading.
            new["lease"] = dict(before) if same and "mono_until" in before else stamp_lease(lease)
        write_json(paths.config, new)
    write_secrets(paths, new, secrets or {})
    result = {"status": "written" if changed else "unchanged", "started": False, "hook": read_text(paths.hook) or "none",
              "ssh_port": new.get("ssh_port")}
    sent = sent_log(paths)
    if sent:
        result["sent"] = sent  # what this node told its targets: the CLI records it
    if not new.get("autostop") and not new.get("budget") and not new.get("lease"):
        pid = running_pid(paths)
        result.update(running=pid is not None, pid=pid)
        return result  # nothing to enforce: a running loop ends on its next tick
    pid = running_pid(paths)
    if pid is None:
        hook, why = "none", ""
        if new.get("persist", "auto") == "auto":
            ready, why = systemd_user_ready()
            if ready and install_systemd(paths, new, python, program):
                hook = f"systemd (user unit {unit_name(new)}, linger)"
            elif install_cron(paths, python, program):
                hook = "cron @reboot"
                why = ""
            else:
                why = (why + "; " if why else "") + "no crontab"
        else:
            why = "persist: none"
        with open(paths.hook, "w", encoding="utf-8") as handle:
            handle.write(hook + ("" if hook != "none" else f" ({why})") + "\n")
        if not hook.startswith("systemd") or wait_running(paths, 5.0) is None:
            start_detached(paths, python, program)
        pid = wait_running(paths)
        result.update(started=True, hook=read_text(paths.hook))
    result.update(running=pid is not None, pid=pid)
    return result


def stop(config_path: str) -> dict:
    paths = Paths(config_path)
    pid = running_pid(paths)
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running_pid(paths) is not None:
            time.sleep(0.05)
    remove_hook(paths)
    return {"stopped": pid is not None, "pid": pid}


def check(config_path: str) -> dict:
    paths = Paths(config_path)
    cfg = read_json(paths.config) or {}
    jobs = observe_jobs(paths, time.time())
    activity = ssh_activity(cfg.get("ssh_port")) if cfg.get("count_ssh") else None
    return {"jobs_running": jobs["running"], "jobs_starting": jobs["starting"], "jobs": jobs["all"],
            "ssh_sessions": activity[0] if activity else None,
            "ssh_kept_idle": activity[1] if activity else None,
            "ssh_port": cfg.get("ssh_port"), "running_pid": running_pid(paths),
            "budget_used_s": (read_json(paths.state) or {}).get("used_s")}


def main(argv) -> int:
    if len(argv) != 3 or argv[1] not in ("run", "check", "ensure", "stop"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    mode, config_path = argv[1], os.path.abspath(argv[2])
    if mode == "run":
        return Watchdog(config_path).run()
    if mode == "check":
        print(json.dumps(check(config_path)))
        return 0
    if mode == "stop":
        print(json.dumps(stop(config_path)))
        return 0
    new = json.load(sys.stdin)
    print(json.dumps(ensure(config_path, new, sys.executable, os.path.abspath(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
