"""`python -m cloudtrain.testing shell aws|gcp|azure` (issue 13): a fake cloud for a newcomer's shell.

Started as a user starts it: its printed lines are pasted into a shell (bash), which runs the ready
recipe with `cloudtrain run` against the fake; Ctrl-C (SIGINT) then takes everything down: the
cluster, its VMs and their jobs, the SSH connections the CLI kept, the fake, and its directory.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _shell(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cloudtrain.testing", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def _processes_of(root: Path) -> list[str]:
    """Live processes that belong to the fake in `root`: its name on their command line or in their
    environment (sshd VMs and their sessions, the jobs and watchdogs on them, SSH muxes)."""
    needle = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes()
            if needle in cmdline or needle in (entry / "environ").read_bytes():
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
                found.append(f"{entry.name}: {shown}")
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.parametrize("args", [["shell", "gce"], ["shell"], ["shell", "aws", "gcp"], ["serve", "aws"], [],
                                  ["shell", "aws", "--dir"]])
def test_a_bad_argument_is_one_line_and_exit_2(args: list[str]) -> None:
    proc = _shell(*args, env=dict(os.environ))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "aws|gcp|azure" in err


@pytest.mark.parametrize("cloud_name", ["aws", "gcp", "azure"])
def test_the_printed_environment_runs_the_ready_recipe_and_ctrl_c_leaves_nothing(
        cloud_name: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("CLOUDTRAIN_SSH_PERSIST_S", None)  # connections kept, as for a user: the shell must end them
    proc = _shell("shell", cloud_name, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    root: Path | None = None
    try:
        wait_until(lambda: any(line.startswith("# Ctrl-C here") for line in lines) or proc.poll() is not None,
                   180, "the fake to say it is up")
        assert proc.poll() is None, "".join(lines) + proc.stderr.read()  # type: ignore[union-attr]
        printed = "".join(lines)
        # Every line can be pasted into a shell: exports, one unset, comments.
        assert all(line.startswith(("export ", "unset ", "#")) for line in printed.splitlines()), printed
        exported = dict(shlex.split(line[len("export "):])[0].split("=", 1)
                        for line in printed.splitlines() if line.startswith("export "))
        project = Path(exported["CLOUDTRAIN_FAKE_PROJECT"])
        root = project.parent
        assert root.parent == tmp_path and root.name.startswith(f"cloudtrain-fake-{cloud_name}-")
        for name in ("CLOUDTRAIN_HOME", "CLOUDTRAIN_CONFIG", "HOME"):
            assert exported[name].startswith(str(root)), (name, exported[name])
        endpoint = {"aws": "AWS_ENDPOINT_URL_EC2", "gcp": "GOOGLE_APPLICATION_CREDENTIALS",
                    "azure": "REQUESTS_CA_BUNDLE"}[cloud_name]
        assert endpoint in exported
        assert f"source {root / 'env.sh'}" in printed and (root / "env.sh").read_text().splitlines() == [
            line for line in printed.splitlines() if not line.startswith("#")]
        assert "cloudtrain run train.yaml --keep" in printed and (project / "train.yaml").is_file()

        # A user's second terminal: the printed lines, then the commands they suggest.
        script = printed + '\ncd "$CLOUDTRAIN_FAKE_PROJECT" && cloudtrain run train.yaml --keep\n'
        user = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600,
                              preexec_fn=_default_sigint, check=False)
        assert user.returncode == 0, user.stdout[-3000:] + user.stderr[-3000:]
        assert "epoch 5/5" in user.stdout
        run_dir = Path(user.stdout.strip().splitlines()[-1])
        assert run_dir.is_relative_to(root), run_dir
        assert json.loads((run_dir / "outputs" / "metrics.json").read_text())["epochs"] == 5
        assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
        # The cluster is kept: its VM (an sshd, the node's watchdog) runs, and the CLI kept its
        # connection to it open (a mux, ssh.persist_s), as it does for a user.
        running = _processes_of(root)
        assert any("sshd" in p for p in running) and any("cloudtrain.remote.mux" in p for p in running), running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert proc.returncode == 0, err
    assert f"the fake {cloud_name} is stopped" in err, err
    assert root is not None
    try:
        wait_until(lambda: not _processes_of(root), 10, "every process of the fake to be gone")
    except AssertionError:
        raise AssertionError(f"left running: {_processes_of(root)}") from None
    assert not root.exists()  # its temporary directory is removed
