"""`cloudtrain` on a real Slurm cluster (cloudtrain/testing/slurm.py): the CLI as a subprocess, jobs
queued with sbatch through the login node, nothing left in the queue afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from cloudtrain.testing.slurm import SlurmCluster
from cloudtrain.testing.sshd import SshdFactory
from cloudtrain.testing.wait import wait_until
from tests.conftest import REPO, cli_env, start_cli


def ct(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
       timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**(env or {})))


def login_env(cluster: SlurmCluster, factory: SshdFactory) -> dict[str, str]:
    """What recipes/mnist-slurm.yaml reads: the fixture's login node."""
    return {"CT_SLURM_LOGIN": cluster.login.host, "CT_SLURM_PORT": str(cluster.login.port),
            "CT_SLURM_USER": cluster.login.user, "CT_SLURM_KEY": str(factory.client_key.private_path),
            "CT_SLURM_PARTITION": cluster.partition, "CT_MNIST_DATA": "bundled"}


def write_recipe(path: Path, cluster: SlurmCluster, factory: SshdFactory, run: str, *, name: str = "slurm-job",
                 num_nodes: int = 1, slurm: dict | None = None, **extra: object) -> Path:
    recipe = {
        "name": name, "num_nodes": num_nodes,
        "resources": {"cloud": "slurm", "hosts": [cluster.host_entry(factory.client_key.private_path)],
                      "slurm": {"partition": cluster.partition, **(slurm or {})}},
        "run": run, **extra,
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def last_line(proc: subprocess.CompletedProcess[str]) -> Path:
    return Path(proc.stdout.strip().splitlines()[-1])


def test_a_run_job_on_one_node(slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory,
                          "echo node=$SLURMD_NODENAME rank=$NODE_RANK world=$WORLD_SIZE; mkdir -p out; "
                          "echo done > out/result.txt",
                          setup="echo setting up on $SLURMD_NODENAME", results=["out"])
    proc = ct("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "submitted slurm job" in proc.stdout and "setting up on n" in proc.stdout
    assert "rank=0 world=1" in proc.stdout and "ended COMPLETED (exit code 0)" in proc.stdout
    run_dir = last_line(proc)
    assert (run_dir / "out" / "result.txt").read_text() == "done\n"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["provider"] == "slurm" and record["status"] == "succeeded" and record["cost_usd"] == 0
    assert slurm_cluster.queue() == []
