"""Results are never lost: collection across dropped links, teardown that waits for it, `collect`.

A real sshd VM is reached through the test kit's TCP proxy, which cuts every connection at a
random moment of the collect phase (or takes the link down for good). The CLI runs as a
subprocess, like a user's.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.tcpproxy import TcpProxy
from tests.conftest import cli_env

FILES = 400
# Each result file is 40 KB of random bytes: ~16 MB, a few hundred ms on loopback.
JOB = f"""\
rm -rf outputs && mkdir -p outputs/deep
python3 - <<'EOF'
import os
for i in range({FILES}):
    sub = "deep/" if i % 3 == 0 else ""
    with open(f"outputs/{{sub}}r{{i}}.bin", "wb") as f:
        f.write(os.urandom(40_000))
EOF
echo made results
"""


def _setup(tmp_path: Path, factory: SshdFactory, proxy_port: int, name: str, retries_s: float) -> tuple[Path, dict]:
    home = tmp_path / "ct-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(f"ssh: {{connect_retries_s: {retries_s}, connect_timeout_s: 3, add_include: false}}\n")
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: {name}
        resources:
          cloud: ssh
          hosts: [{{address: 127.0.0.1, port: {proxy_port}, user: "${{CT_USER}}", key: "${{CT_KEY}}"}}]
        results: [outputs]
        run: |
    """) + textwrap.indent(JOB, "          "))
    env = {"CT_USER": _user(), "CT_KEY": str(factory.client_key.private_path),
           "CLOUDTRAIN_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return recipe, env


def _user() -> str:
    import getpass

    return getpass.getuser()


def _run_cutting(args: list[str], env: dict, proxy: TcpProxy, delay: float, down_for_good: bool = False):  # noqa: ANN202
    """Run the CLI; when the collect phase starts, wait `delay` s and cut the link."""
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(**env))
    out: list[str] = []
    cut = threading.Event()

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if line.startswith("==> collect") and not cut.is_set():
                time.sleep(delay)
                (proxy.link_down if down_for_good else proxy.cut_all)()
                cut.set()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    err = proc.stderr.read()  # type: ignore[union-attr]
    proc.wait(timeout=300)
    reader.join(timeout=10)
    return proc.returncode, "".join(out), err, cut.is_set()


def _node_outputs(vm: SshdVM, name: str) -> dict[str, bytes]:
    root = vm.home_dir / ".cloudtrain" / name / "workdir" / "outputs"
    return {str(p.relative_to(root.parent)): p.read_bytes() for p in root.rglob("*.bin")}


def _home_outputs(run_dir: Path) -> dict[str, bytes]:
    root = run_dir / "outputs"
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in root.rglob("*.bin")} if root.is_dir() else {}


def _run_dir(stdout: str) -> Path:
    return Path(stdout.strip().splitlines()[-1])


def test_cut_at_random_moments_of_collect_never_loses_results(
    sshd_vm_factory: SshdFactory, tcp_proxy: type[TcpProxy], tmp_path: Path
) -> None:
    vm = sshd_vm_factory.start()
    proxy = tcp_proxy(vm.port)
    recipe, env = _setup(tmp_path, sshd_vm_factory, proxy.port, "cutbox", retries_s=20)
    rng = random.Random(int(os.environ.get("CT_CUT_SEED", "16")))
    outcomes = []
    for trial in range(10):
        code, out, err, cut = _run_cutting(["run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs")],
                                           env, proxy, delay=rng.uniform(0.0, 0.4))
        assert cut, f"trial {trial}: collect never started\n{out}\n{err}"
        run_dir = _run_dir(out)
        record = json.loads((run_dir / "run.json").read_text())
        on_node = _node_outputs(vm, "cutbox")
        assert len(on_node) == FILES
        if code == 0:
            # Exit 0 means every result and the log are home, byte for byte.
            assert _home_outputs(run_dir) == on_node, f"trial {trial}: exit 0 with results missing\n{err}"
            assert "made results" in (run_dir / "job.log").read_text()
            assert record["status"] == "succeeded" and record["collect_error"] is None
        else:
            # Otherwise the results are still on the node and the reason is said.
            assert record["status"] == "failed" and record["collect_error"], err
            assert "collect failed" in out + err
        assert "()" not in err and "EOFError" not in err, err
        outcomes.append((code, record["collect_attempts"]))
    # The cuts really hit transfers: some collects needed another attempt, and all recovered.
    # An uncut collect makes 2 attempts: every log of the node in one, the results in another.
    assert all(code == 0 for code, _ in outcomes), outcomes
    assert any(attempts > 2 for _, attempts in outcomes), outcomes
    down = subprocess.run([sys.executable, "-m", "cloudtrain", "down", "cutbox"], capture_output=True, text=True,
                          env=cli_env(**env), timeout=120)
    assert down.returncode == 0, down.stderr


def test_link_down_for_good_keeps_results_on_the_node_then_collect_and_down(
    sshd_vm_factory: SshdFactory, tcp_proxy: type[TcpProxy], tmp_path: Path
) -> None:
    vm = sshd_vm_factory.start()
    proxy = tcp_proxy(vm.port)
    recipe, env = _setup(tmp_path, sshd_vm_factory, proxy.port, "lostlink", retries_s=3)

    def ct(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], capture_output=True, text=True,
                              env=cli_env(**env), timeout=300)

    # The run created the cluster (teardown would be `down`), and the link dies during collect.
    code, out, err, cut = _run_cutting(["run", str(recipe), "--runs-dir", str(tmp_path / "runs")], env, proxy,
                                       delay=0.0, down_for_good=True)
    assert cut and code != 0, out + err
    run_dir = _run_dir(out)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["collect_error"] and record["teardown"] == "kept"
    assert "status          failed" in out and "collect failed" in out
    assert "teardown        kept" in out and "teardown ok" not in out
    assert f"cloudtrain collect lostlink {record['run_id']}" in err
    assert len(_node_outputs(vm, "lostlink")) == FILES, "teardown must not delete uncollected results"
    for line in err.splitlines():
        assert "()" not in line and not line.rstrip().endswith(":"), line

    # While the link is down: logs says where the log is and how to get it; down keeps state.
    logs = ct("logs", "lostlink")
    assert logs.returncode != 0 and len(logs.stderr.strip().splitlines()) == 1, logs.stderr
    assert "the log is on the node at" in logs.stderr and "cloudtrain collect lostlink" in logs.stderr
    down = ct("down", "lostlink")
    assert down.returncode != 0 and "down lostlink --forget" in down.stderr, down.stderr
    assert "lostlink" in ct("status").stdout

    # Link back: `collect` brings everything home, verified, and fixes the record.
    proxy.link_up()
    again = ct("collect", "lostlink")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _home_outputs(run_dir) == _node_outputs(vm, "lostlink")
    assert "made results" in (run_dir / "job.log").read_text()
    fixed = json.loads((run_dir / "run.json").read_text())
    assert fixed["status"] == "succeeded" and fixed["collect_error"] is None
    assert ct("collect", "lostlink", record["run_id"]).returncode == 0  # idempotent
    assert _home_outputs(run_dir) == _node_outputs(vm, "lostlink")

    # And `down` now finishes: the host is clean and the state row gone.
    down = ct("down", "lostlink")
    assert down.returncode == 0, down.stderr
    assert not (vm.home_dir / ".cloudtrain" / "lostlink").exists()
    assert ct("down", "lostlink").stdout.strip() == "cluster lostlink is already down"  # idempotent
    logs = ct("logs", "lostlink")
    assert logs.returncode == 0 and "made results" in logs.stdout


@pytest.mark.parametrize("verb", ["collect", "cancel"])
def test_collect_and_cancel_on_unknown_cluster_are_one_line(verb: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", verb, "nosuch"], capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no cluster named 'nosuch'" in proc.stderr
