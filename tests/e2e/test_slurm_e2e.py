"""`cloudtrain` on a real Slurm cluster (cloudtrain/testing/slurm.py): the CLI as a subprocess, jobs
queued with sbatch through the login node, nothing left in the queue afterwards."""

from __future__ import annotations

import json
import os
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


def test_every_rank_of_a_two_node_job_sees_the_same_cluster(slurm_cluster: SlurmCluster,
                                                             sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    script = ('mkdir -p out && echo "$MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NNODES $NPROC_PER_NODE '
              '$CLOUDTRAIN_NUM_NODES $SLURMD_NODENAME" > out/rank-$NODE_RANK.txt && '
              'cp "$CLOUDTRAIN_HOSTFILE" out/hostfile-$NODE_RANK')
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, script, num_nodes=2, results=["out"])
    proc = ct("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = last_line(proc) / "out"
    ranks = {int(p.stem.split("-")[1]): p.read_text().split() for p in out.glob("rank-*.txt")}
    assert sorted(ranks) == [0, 1]
    # Same master, port and sizes on every rank; one rank per node.
    assert ranks[0][:6] == ranks[1][:6] == ["127.0.0.1", ranks[0][1], "2", "2", "1", "2"]
    assert {ranks[0][6], ranks[1][6]} == {"n1", "n2"}
    assert (out / "hostfile-0").read_text() == (out / "hostfile-1").read_text() == "127.0.0.1 slots=1\n" * 2


def _start_run(recipe: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`cloudtrain run` in the background, its output in a file the test watches."""
    log = tmp_path / "cli.out"
    handle = log.open("w")
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, stdout=handle,
                     stderr=subprocess.STDOUT)
    handle.close()
    return proc, log


def _interrupt(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=180)


def test_a_pending_job_says_why_and_ctrl_c_leaves_nothing_queued(slurm_cluster: SlurmCluster,
                                                                  sshd_vm_factory: SshdFactory,
                                                                  tmp_path: Path) -> None:
    filler = slurm_cluster.fill()
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, "echo never")
    proc, log = _start_run(recipe, tmp_path)
    wait_until(lambda: "pending: Resources (the nodes it needs are busy)" in log.read_text(), timeout=120,
               what=f"the pending reason in the run's output:\n{log.read_text()}")
    assert [j.state for j in slurm_cluster.queue() if j.id != filler] == ["PENDING"]
    assert _interrupt(proc) == 130, log.read_text()
    assert [j.id for j in slurm_cluster.queue()] == [filler]
    assert "never" not in log.read_text().replace("echo never", "")


def test_ctrl_c_while_the_job_runs_cancels_it(slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory,
                                              tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, "echo started; sleep 600",
                          num_nodes=2)
    proc, log = _start_run(recipe, tmp_path)
    wait_until(lambda: "started" in log.read_text(), timeout=120, what=f"the job to start:\n{log.read_text()}")
    assert [j.state for j in slurm_cluster.queue()] == ["RUNNING"]
    assert _interrupt(proc) == 130, log.read_text()
    assert slurm_cluster.queue() == []
    # The login node's script said so in the job's log, which came home.
    run_dir = Path(log.read_text().strip().splitlines()[-1])
    assert "cancelled" in (run_dir / "job.log").read_text()


def test_a_job_past_its_time_limit_ends_timeout_with_its_log_home(slurm_cluster: SlurmCluster,
                                                                    sshd_vm_factory: SshdFactory,
                                                                    tmp_path: Path) -> None:
    # Slurm's time limits are whole minutes and checked every 30 s: this test takes about 90 s.
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, "echo begin; sleep 600",
                          slurm={"time_minutes": 1})
    proc = ct("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 124, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = last_line(proc)
    log = (run_dir / "job.log").read_text()
    assert "begin" in log and "DUE TO TIME LIMIT" in log and "ended TIMEOUT (exit code 124)" in log
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_code"] == 124
    assert slurm_cluster.queue() == []


def test_a_job_outlives_its_cli_and_cancel_or_down_ends_it(slurm_cluster: SlurmCluster,
                                                            sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    # The submit script runs detached on the login node: a killed CLI leaves the job running, and
    # `logs`, `status`, `cancel` and `down` reach it later.
    for verb in ("cancel", "down"):
        recipe = write_recipe(tmp_path / f"{verb}.yaml", slurm_cluster, sshd_vm_factory, "echo started; sleep 600",
                              name=f"slurm-{verb}")
        proc, log = _start_run(recipe, tmp_path)
        wait_until(lambda: "started" in log.read_text(), timeout=120, what=f"the job to start:\n{log.read_text()}")
        proc.kill()
        proc.wait(timeout=30)
        assert [j.state for j in slurm_cluster.queue()] == ["RUNNING"]
        logs = ct("logs", f"slurm-{verb}")
        assert logs.returncode == 0 and "started" in logs.stdout, logs.stdout + logs.stderr
        status = ct("status", f"slurm-{verb}")
        assert status.returncode == 0 and "slurm" in status.stdout, status.stdout + status.stderr
        ended = ct(verb, f"slurm-{verb}")
        assert ended.returncode == 0, ended.stdout + ended.stderr
        assert slurm_cluster.queue() == [], verb
        if verb == "cancel":
            assert ct("down", "slurm-cancel").returncode == 0


def test_gc_finds_a_job_whose_submit_script_died_and_cancels_it(slurm_cluster: SlurmCluster,
                                                                  sshd_vm_factory: SshdFactory,
                                                                  tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, "echo started; sleep 600",
                          name="slurm-gc")
    proc, log = _start_run(recipe, tmp_path)
    wait_until(lambda: "started" in log.read_text(), timeout=120, what=f"the job to start:\n{log.read_text()}")
    proc.kill()
    proc.wait(timeout=30)
    # The login node loses the submit script (as in a reboot of the login node alone): the job
    # keeps its allocation with nothing following it.
    pid_file = next(slurm_cluster.shared.glob(".cloudtrain/slurm-gc/jobs/*-run/pid"))
    os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    [job] = slurm_cluster.queue()
    listed = ct("gc", "--cloud", "slurm")
    assert listed.returncode == 1 and job.id in listed.stdout and "queued-job" in listed.stdout, listed.stdout
    assert [j.id for j in slurm_cluster.queue()] == [job.id]  # listing removes nothing
    removed = ct("gc", "--cloud", "slurm", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="the leaked job to leave the queue")
    assert ct("down", "slurm-gc").returncode == 0


def test_the_bundled_cnn_across_two_slurm_nodes(slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory,
                                                tmp_path: Path) -> None:
    # TF_CONFIG from the allocation: MultiWorkerMirroredStrategy with one worker per Slurm node.
    proc = ct("run", str(REPO / "recipes" / "mnist-slurm.yaml"), "--runs-dir", str(tmp_path / "runs"),
              env={**login_env(slurm_cluster, sshd_vm_factory), "CT_SLURM_NODES": "2"}, timeout=900)
    # The recipe as shipped, the real CNN: one proof for one node and two (the one-node path is
    # test_a_run_job_on_one_node's, without TensorFlow).
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = last_line(proc)
    metrics = json.loads((run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["data_source"] == "bundled" and metrics["test_accuracy"] > 0.5, metrics
    assert (metrics["strategy"], metrics["num_workers"], metrics["replicas"]) == ("multiworker", 2, 2), metrics
    record = json.loads((run_dir / "run.json").read_text())
    assert record["provider"] == "slurm" and record["status"] == "succeeded" and record["teardown"] == "down"
    assert "ended COMPLETED" in (run_dir / "job.log").read_text()
    assert slurm_cluster.queue() == []


def test_a_job_slurm_refuses_fails_with_sbatch_s_reason(slurm_cluster: SlurmCluster, sshd_vm_factory: SshdFactory,
                                                         tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", slurm_cluster, sshd_vm_factory, "echo never",
                          slurm={"partition": "nosuchpartition"})
    proc = ct("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The job's last log lines are shown on failure: sbatch's own reason among them.
    assert "invalid partition" in proc.stdout + proc.stderr and "sbatch refused the job" in proc.stdout + proc.stderr
    assert slurm_cluster.queue() == []
