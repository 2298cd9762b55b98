"""A real Slurm cluster on this machine, as a pytest fixture (`slurm_cluster`).

Debian's slurm-wlm (22.05) runs several `slurmd` on one host: each node gets its own port, spool
directory and pid file (`NodeAddr=127.0.0.1`, distinct `Port`s, `SlurmdSpoolDir=.../spool-%n`).
The fixture starts, under the test's temp dir and nowhere else:

- `munged` with its own key, socket and pid file (slurm.conf's `AuthInfo=socket=` names the socket);
- `slurmctld` and two `slurmd` nodes (n1, n2; one CPU each) in partition `debug`, with a cluster
  name and ports of their own, so two fixtures (xdist workers) coexist on one machine;
- a login node: a test-kit sshd VM (cloudtrain/testing/sshd.py) whose home directory is the
  cluster's shared filesystem (the compute nodes run on this host, so they see it too), with the
  Slurm client commands on its PATH already pointed at this cluster's slurm.conf.

It waits for both nodes to be idle (a condition, never a sleep). At teardown every job is
cancelled and every daemon stopped, with the job step daemons (`slurmstepd`) the nodes started:
no process is left. No slurmdbd (it needs a database): finished jobs are read with
`scontrol show job` (kept for MinJobAge, 300 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.testing.sshd import SshdFactory, SshdVM, free_port
from cloudtrain.testing.wait import wait_until

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
# The client commands a login node offers; each runs against this cluster's slurm.conf.
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo", "salloc", "sacct")
NODES = ("n1", "n2")
PARTITION = "debug"
# Marks the daemons' environment; slurmstepd (forked by slurmd) inherits it, so teardown finds them.
_MARK = "CLOUDTRAIN_SLURM_FIXTURE"


@dataclass(frozen=True)
class QueuedJob:
    """One line of `squeue`: what a test asserts on."""

    id: str
    name: str
    state: str
    reason: str
    comment: str


class SlurmCluster:
    """A controller, two nodes and a login node; `stop()` ends all of it."""

    def __init__(self, root: Path, login: SshdVM, name: str) -> None:
        self.root = root
        self.name = name
        self.login = login
        self.partition = PARTITION
        self.nodes = NODES
        self.conf = root / "slurm.conf"
        self.shared = login.home_dir  # the cluster's filesystem: the login home, seen by every node
        self._procs: list[subprocess.Popen[bytes]] = []
        self._munge_socket = root / "munge" / "munge.socket"

    # ------------------------------------------------------------------------------ control

    def start(self) -> SlurmCluster:
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [SLURMCTLD, "-D", "-f", str(self.conf)])
            for node in NODES:
                self._spawn(f"slurmd-{node}", [SLURMD, "-D", "-N", node, "-f", str(self.conf)])
            self._install_clients()
            wait_until(self._all_idle, timeout=60, what=f"slurm nodes {', '.join(NODES)} idle\n{self._logs()}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel every job, wait for the queue to empty, then end the daemons and their steps."""
        if any(p.poll() is None for p in self._procs if "slurmctld" in str(p.args)):
            self.command("scancel", "--full", f"--partition={PARTITION}", check=False)
            for job in self.queue():
                self.command("scancel", "--full", job.id, check=False)
            # Bounded: whatever the controller says then, the nodes' steps are killed below.
            deadline = time.monotonic() + 30
            while self.queue() and time.monotonic() < deadline:
                time.sleep(0.1)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        # slurmstepd double-forks out of slurmd's session: find it (and what it ran) by our mark.
        for pid in _pids_with_env(f"{_MARK}={self.root}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue

    # ------------------------------------------------------------------------------ queries

    def env(self) -> dict[str, str]:
        # Jobs submitted from the test side carry the mark too (sbatch exports the environment).
        return {**os.environ, "SLURM_CONF": str(self.conf), _MARK: str(self.root)}

    def command(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (on the test's side, not the login node)."""
        # In the cluster's directory: a job submitted without --output writes slurm-ID.out there.
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, check=check,
                              timeout=timeout, cwd=self.root)

    def queue(self) -> list[QueuedJob]:
        """Every job still in the queue (pending, running or completing)."""
        out = self.command("squeue", "-h", "-o", "%i|%j|%T|%r|%k", check=False)
        if out.returncode != 0:
            return []
        jobs = []
        for line in out.stdout.splitlines():
            parts = line.split("|", 4)
            if len(parts) == 5:
                jobs.append(QueuedJob(*parts))
        return jobs

    def job_state(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Reason, ExitCode, ...); {} once purged."""
        out = self.command("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}

    def fill(self) -> str:
        """Occupy every node with a held-open job (so the next job pends on Resources); its id."""
        out = self.command("sbatch", "--parsable", f"--nodes={len(NODES)}", "--job-name=fixture-filler",
                           f"--output={self.root}/filler.out", "--wrap", "sleep 3600")
        job_id = out.stdout.strip().split(";")[0]
        wait_until(lambda: self.job_state(job_id).get("JobState") == "RUNNING", timeout=60, what="the filler job")
        return job_id

    def host_entry(self, key: str | Path) -> dict[str, object]:
        """The login node as a recipe `hosts` entry."""
        return {"address": self.login.host, "port": self.login.port, "user": self.login.user, "key": str(key)}

    # ------------------------------------------------------------------------------ internals

    def _start_munge(self) -> None:
        directory = self._munge_socket.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = directory / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # --force: our socket directory is not the system's, and root runs it here.
        self._spawn("munged", [MUNGED, "--foreground", "--force", f"--socket={self._munge_socket}",
                               f"--key-file={key}", f"--pid-file={directory / 'munged.pid'}",
                               f"--seed-file={directory / 'munged.seed'}", f"--log-file={directory / 'munged.log'}"])
        wait_until(self._munge_socket.exists, timeout=30, what=f"munged's socket\n{self._logs()}")

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        r = self.root
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self._munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool-%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/slurmctld.log",
            f"SlurmdLogFile={r}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "KillWait=2",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "Waittime=0",
            *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 State=UNKNOWN"
              for n in NODES),
            f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ]
        (r / "state").mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def _install_clients(self) -> None:
        """The login node's Slurm commands: the system's, pointed at this cluster."""
        for name in CLIENTS:
            real = shutil.which(name, path="/usr/bin:/usr/local/bin")
            if real is None:
                continue
            wrapper = self.login.bin_dir / name
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf}\nexport SLURM_CONF\nexec {real} "$@"\n')
            wrapper.chmod(0o755)

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = (self.root / f"{name}.out").open("ab")
        env = {**os.environ, "SLURM_CONF": str(self.conf), _MARK: str(self.root)}
        self._procs.append(subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, env=env))
        log.close()

    def _all_idle(self) -> bool:
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        return out.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

    def _logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)


def _pids_with_env(entry: str) -> list[int]:
    wanted = entry.encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def slurm_available() -> str | None:
    """Why a Slurm cluster cannot start here, or None."""
    for path in (SLURMCTLD, SLURMD, MUNGED):
        if not Path(path).exists():
            return f"{path} is not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the slurm fixture runs slurmd as root (SlurmUser=root)"
    return None


@pytest.fixture
def slurm_cluster(sshd_vm_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm cluster (`SlurmCluster`): slurmctld, slurmd nodes n1 and n2 in partition
    `debug`, and `login`, an sshd VM accepting `sshd_vm_factory.client_key` whose home is the
    cluster's shared filesystem. Skipped without slurm-wlm/munge (failed when $CI is set)."""
    why = slurm_available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    login = sshd_vm_factory.start(name=f"login-{root.name}")
    # Unique per fixture: two workers' clusters never share a name (ports are free ports).
    name = f"ct{os.getpid() % 100000}{int(time.monotonic() * 1000) % 1000}"
    cluster = SlurmCluster(root, login, name)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
