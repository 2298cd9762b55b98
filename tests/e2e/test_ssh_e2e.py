"""`cloudtrain run` on existing machines over SSH: real sshd VMs on loopback, the CLI as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from cloudtrain.testing.sshd import SshdFactory, SshdVM
from tests.conftest import REPO, cli_env


def ct(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**env))


def host_env(factory: SshdFactory, vms: list[SshdVM]) -> dict[str, str]:
    env = {"CT_SSH_USER": vms[0].user, "CT_SSH_KEY": str(factory.client_key.private_path), "CT_MNIST_DATA": "bundled"}
    for i, vm in enumerate(vms):
        suffix = "" if i == 0 else f"_{i + 1}"
        env[f"CT_SSH_HOST{suffix}"] = vm.host
        env[f"CT_SSH_PORT{suffix}"] = str(vm.port)
        env[f"CT_SSH_USER{suffix}"] = vm.user
        env[f"CT_SSH_KEY{suffix}"] = str(factory.client_key.private_path)
    env["CT_SSH_NODES"] = str(len(vms))
    return env


def test_resync_sends_only_the_changed_file(sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    vm = sshd_vm_factory.start()
    env = host_env(sshd_vm_factory, [vm])
    code = tmp_path / "code"
    code.mkdir()
    for i in range(20):
        (code / f"module_{i}.py").write_text(f"VALUE = {i}\n")
    recipe = tmp_path / "sync.yaml"
    recipe.write_text(textwrap.dedent("""\
        name: sync-check
        workdir: code
        resources:
          cloud: ssh
          hosts: [{address: "${CT_SSH_HOST}", port: "${CT_SSH_PORT}", user: "${CT_SSH_USER}", key: "${CT_SSH_KEY}"}]
        run: cat module_7.py
    """))
    first = ct("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "sent 20 of 20 files" in first.stdout
    # `ssh <cluster>` works through the Include cloudtrain added (OpenSSH reads the passwd home,
    # so point it at the test's HOME explicitly).
    user_config = Path(cli_env()["HOME"]) / ".ssh" / "config"
    assert "Include" in user_config.read_text()
    probe = subprocess.run(["ssh", "-F", str(user_config), "-o", "BatchMode=yes", "sync-check", "cat .cloudtrain/sync-check/workdir/module_3.py"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and probe.stdout.strip() == "VALUE = 3", probe.stderr
    (code / "module_7.py").write_text("VALUE = 'changed'\n")
    second = ct("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "sent 1 of 20 files" in second.stdout
    assert "VALUE = 'changed'" in second.stdout
    assert ct("down", "sync-check", env=env).returncode == 0


def test_multi_node_multiworker_over_ssh(sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    vms = sshd_vm_factory.start_many(2)
    env = host_env(sshd_vm_factory, vms)
    proc = ct("run", str(REPO / "recipes" / "mnist-ssh.yaml"), "--runs-dir", str(tmp_path / "runs"), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((run_dir / "outputs" / "metrics.json").read_text())
    # The recipe as shipped, the real CNN, proven once over SSH (one node's path without TensorFlow:
    # test_resync_sends_only_the_changed_file and the local/ssh e2e).
    assert metrics["strategy"].lower().startswith("multiworker") and metrics["replicas"] == 2
    assert metrics["epochs"] == 1 and metrics["data_source"] == "bundled" and metrics["test_accuracy"] > 0.5
    rank1_log = (run_dir / "node-1-job.log").read_text()
    # Each node runs its own copy of the job and data, under its own home.
    assert str(vms[1].home_dir) in rank1_log and str(vms[0].home_dir) not in rank1_log
    record = json.loads((run_dir / "run.json").read_text())
    assert record["num_nodes"] == 2 and record["provider"] == "ssh" and record["status"] == "succeeded"
    assert record["teardown"] == "down"
    # down on existing hosts removes only our files; the machines stay.
    assert not any((vm.home_dir / ".cloudtrain" / "mnist-ssh").exists() for vm in vms)
    assert all(vm.running for vm in vms)
