"""The Slurm fixture is a real cluster: jobs run across its nodes from the login node, two fixtures
coexist, and nothing it started outlives it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from cloudtrain.testing.slurm import SlurmCluster, _pids_with_env
from cloudtrain.testing.sshd import SshdFactory
from cloudtrain.testing.wait import wait_until


def login_run(factory: SshdFactory, cluster: SlurmCluster, command: str) -> subprocess.CompletedProcess[str]:
    """A command on the login node over real SSH, as a user would type it there."""
    login = cluster.login
    return subprocess.run(
        ["ssh", "-p", str(login.port), "-i", str(factory.client_key.private_path), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{login.user}@{login.host}", command],
        capture_output=True, text=True, timeout=120)


def test_a_two_node_job_from_the_login_node_runs_one_rank_per_node(
        slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory) -> None:
    script = "srun sh -c 'echo rank=$SLURM_NODEID node=$SLURMD_NODENAME' > ranks.txt"
    submitted = login_run(sshd_vm_factory, slurm_cluster, f"sbatch --parsable --nodes=2 --wrap {shlex.quote(script)}")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    wait_until(lambda: slurm_cluster.job_state(job_id).get("JobState") == "COMPLETED", timeout=60, what="the job")
    # The job ran in the login home, which is the shared filesystem.
    lines = sorted((slurm_cluster.shared / "ranks.txt").read_text().split())
    assert lines == ["node=n1", "node=n2", "rank=0", "rank=1"]


def test_a_job_waits_with_its_reason_while_the_partition_is_full(slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.fill()
    out = slurm_cluster.command("sbatch", "--parsable", "--wrap", "true")
    job_id = out.stdout.strip()
    wait_until(lambda: slurm_cluster.job_state(job_id).get("Reason") == "Resources", timeout=30, what="Resources")
    assert [j.state for j in slurm_cluster.queue() if j.id == job_id] == ["PENDING"]


def test_two_clusters_coexist_and_stop_leaves_no_process(
        slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    other = SlurmCluster(tmp_path / "other", sshd_vm_factory.start(name="login-other"), f"{slurm_cluster.name}b")
    (tmp_path / "other").mkdir()
    other.start()
    try:
        assert other.name != slurm_cluster.name and other.conf.read_text() != slurm_cluster.conf.read_text()
        other.command("sbatch", "--wrap", "sleep 600")
        wait_until(lambda: any(j.state == "RUNNING" for j in other.queue()), timeout=180, what="a running job")
        # The first cluster does not see the second one's job.
        assert slurm_cluster.queue() == []
    finally:
        other.stop()
    assert _pids_with_env(f"CLOUDTRAIN_SLURM_FIXTURE={other.root}") == []
    assert all(p.poll() is not None for p in other._procs)  # noqa: SLF001
    # The first cluster still works.
    assert slurm_cluster._all_idle()  # noqa: SLF001


def test_the_login_node_offers_the_slurm_commands(slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory) -> None:
    # One cluster for the whole table: starting one costs seconds.
    for client in ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo"):
        found = login_run(sshd_vm_factory, slurm_cluster, f"command -v {client}")
        assert found.returncode == 0 and found.stdout.strip() == str(slurm_cluster.login.bin_dir / client), client
        assert os.access(found.stdout.strip(), os.X_OK)
