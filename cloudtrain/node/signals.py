"""What counts as activity besides jobs: SSH sessions (ssh_activity, session_rule) and, under
`autostop.gpu_util_below`, the GPUs (sample_gpus, gpu_rule, GpuWatch). Standard library only.

SSH sessions (`autostop.wait_for: jobs_and_ssh`, with `count_ssh`): an established TCP connection
to this node's sshd port, unless all it runs is cloudtrain's own node helper, idle (the connection a
command or its mux keeps for the next one). One look that misses a session does not end it: two
looks in a row must (session_rule).

GPUs (`autostop.gpu_util_below`: P): a job that runs while every GPU's utilization.gpu (nvidia-smi,
sampled every gpu_sample_s, default 10 s, while jobs run) stays below P is no activity: the idle
clock counts from the first sample of that quiet run (gpu_rule). A sample that fails, hangs or
cannot be read counts as busy; so does any job whose id matches `busy_jobs` (setup, bucket copies).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import socket
import struct
import subprocess

from .protocol import GPU_SAMPLE_S, NODE_HELPER_MARK, seconds

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


class GpuWatch:
    """The GPU samples of the jobs running now (a job's GPUs are judged from its own samples only)."""

    def __init__(self) -> None:
        self.samples = []  # type: list  # (monotonic time, [% per GPU] or None)
        self.why = ""

    def forget(self) -> None:
        self.samples = []

    def verdict(self, cfg: dict, auto: dict, running: list, now_m: float) -> tuple:
        """(verdict, since, text, wake_in): gpu_rule for the jobs running, sampling the GPUs when a
        sample is due, and when the next one is. Not armed (`autostop.gpu_util_below` unset), or a
        setup or bucket copy among them (`busy_jobs`, their ids' patterns from the CLI): busy, as any job."""
        below = auto.get("gpu_util_below")
        if below is None:
            return "busy", None, "", None
        steady = [j for j in running if any(fnmatch.fnmatchcase(j, p) for p in cfg.get("busy_jobs") or ())]
        if steady:
            return "busy", None, "setup or copy ({}): busy whatever the GPUs do".format(", ".join(steady[:3])), None
        every = seconds(cfg, "gpu_sample_s", GPU_SAMPLE_S)
        if not self.samples or now_m - self.samples[-1][0] >= every:
            values, self.why = sample_gpus(min(GPU_SAMPLE_TIMEOUT_S, max(1.0, every)))
            self.samples.append((now_m, values))
            # What gpu_rule can still need: the window and one sample before it.
            keep_from = now_m - float(auto["idle_s"]) - 2 * every
            self.samples = [s for s in self.samples if s[0] >= keep_from]
        verdict, since, text = gpu_rule(self.samples, float(below), float(auto["idle_s"]), now_m)
        if self.samples[-1][1] is None:
            text += f": {self.why}"
        return verdict, since, text, every
