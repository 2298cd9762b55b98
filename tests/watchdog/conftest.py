"""Helpers for the watchdog tests: real watchdog processes, a node directory laid out like
~/.cloudtrain/<cluster>, a recording stand-in for a cloud API, and reading the decision log."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import paths
from cloudtrain.node import bundle
from cloudtrain.node.protocol import ENV_CLUSTER, ENV_EFFECT, ENV_INSTANCE_ID, PROGRAM_NAME
from cloudtrain.testing.metadata import metadata_server  # noqa: F401 - a fixture for these tests
from cloudtrain.testing.wait import wait_until  # noqa: F401 - these tests' waits
from tests.conftest import cli_as

RUNNER = paths.templates_dir() / "runner.sh"


def install_program(directory: Path) -> Path:
    """The node program as the CLI ships it (cloudtrain/node as a zipapp), written into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / PROGRAM_NAME
    program.write_bytes(bundle.program())
    return program


def decisions(log: Path) -> list[tuple[str, str]]:
    """(decision, detail) per line of a watchdog.log."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].endswith("Z"):
            out.append((parts[1], parts[2]))
    return out


def ticks_covering(seconds: float, tick: float) -> int:
    """How many consecutive decisions span more than `seconds` (plus two ticks of slack)."""
    return math.ceil(seconds / tick) + 3


def wait_busy_beyond_idle(log: Path, idle_s: float, tick_s: float, reason: str, timeout: float = 120,
                          after_config: bool = False) -> None:
    """Wait until the watchdog logged `busy` (for `reason`) on enough ticks in a row to span more
    than the idle period: the activity demonstrably held it up. after_config: only decisions after
    a settings change count (one made live once the activity had begun)."""
    need = ticks_covering(idle_s, tick_s)

    def enough() -> bool:
        run = 0
        logged = decisions(log)
        if after_config:
            changes = [i for i, (decision, _) in enumerate(logged) if decision == "config"]
            if not changes:
                return False
            logged = logged[changes[-1] + 1:]
        for decision, detail in logged:
            if decision in ("stop", "delete"):
                raise AssertionError(f"the watchdog acted while {reason} should have kept the node up:\n"
                                     + log.read_text())
            run = run + 1 if decision == "busy" and reason in detail else 0
            if run >= need:
                return True
        return False

    wait_until(enough, timeout, f"{need} busy decisions ({reason}) in {log}")


@dataclass
class NodeDir:
    """A node's ~/.cloudtrain/<cluster> with the runner installed, for running the watchdog here."""

    root: Path
    cluster: str = "wd"
    started: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "runtime").mkdir(parents=True, exist_ok=True)
        (self.root / "jobs").mkdir(exist_ok=True)
        shutil.copy(RUNNER, self.root / "runtime" / "runner.sh")
        install_program(self.root / "runtime")

    @property
    def program(self) -> Path:
        return self.root / "runtime" / PROGRAM_NAME

    @property
    def config_path(self) -> Path:
        return self.root / "watchdog.json"

    @property
    def log(self) -> Path:
        return self.root / "watchdog.log"

    def config(self, **overrides: Any) -> dict[str, Any]:
        config = {"version": 1, "cluster": self.cluster, "instance_id": "i-test", "rank": 0, "tick_s": 0.2,
                  "autostop": None, "budget": None, "action": None, "action_key": "i-test:stop",
                  "count_ssh": False, "ssh_port": None, "persist": "none"}
        config.update(overrides)
        return config

    def write(self, **overrides: Any) -> dict[str, Any]:
        config = self.config(**overrides)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, self.config_path)
        return config

    def watchdog(self, mode: str, stdin: dict | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(self.program), mode, str(self.config_path)],
            input=json.dumps(stdin) if stdin is not None else "", capture_output=True, text=True, timeout=60,
            env={**os.environ, **(env or {})}, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        if answer.get("pid"):
            self.started.append(int(answer["pid"]))
        return answer

    def run(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`watchdog.pyz run CONFIG` in the foreground of a process of our own (ended at teardown)."""
        proc = subprocess.Popen([sys.executable, str(self.program), "run", str(self.config_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})
        self.started.append(proc.pid)
        return proc

    def start_job(self, job_id: str, script: str) -> Path:
        job_dir = self.root / "jobs" / job_id
        job_dir.mkdir()
        (job_dir / "cmd.sh").write_text(script + "\n")
        subprocess.run(["sh", str(self.root / "runtime" / "runner.sh"), "start", str(job_dir)], check=True,
                       capture_output=True, timeout=30)
        return job_dir

    def kill_job(self, job_dir: Path) -> None:
        subprocess.run(["sh", str(self.root / "runtime" / "runner.sh"), "kill", str(job_dir), "1"], check=True,
                       capture_output=True, timeout=60)

    def close(self) -> None:
        subprocess.run([sys.executable, str(self.program), "stop", str(self.config_path)], capture_output=True,
                       timeout=60, check=False)
        for pid in self.started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        subprocess.run(["sh", str(RUNNER), "kill-all", str(self.root / "jobs"), "1"], capture_output=True, timeout=60,
                       check=False)


@pytest.fixture
def node_dir(tmp_path: Path) -> Iterator[NodeDir]:
    node = NodeDir(tmp_path / "home" / ".cloudtrain" / "wd")
    try:
        yield node
    finally:
        node.close()


def marker_command(path: Path) -> list[str]:
    """A stand-in shutdown command: appends what it was told to `path`, like a power-off would leave a
    trace. Atomically (a new file renamed over it): tests wait for the file to exist and then read it,
    and a file created before its line is written read empty once under load."""
    code = ("import os, sys; p = sys.argv[1]; old = open(p).read() if os.path.exists(p) else ''; "
            f"open(p + '.part', 'w').write(old + '%s %s %s\\n' % (os.environ['{ENV_INSTANCE_ID}'], "
            f"os.environ['{ENV_EFFECT}'], os.environ['{ENV_CLUSTER}'])); os.replace(p + '.part', p)")
    return [sys.executable, "-c", code, str(path)]


# ---------------------------------------------------------------------------------------- a cloud API


@dataclass(frozen=True)
class ApiCall:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class RecordingApi:
    """A stand-in for a cloud's REST API (Compute API, ARM): records every call, answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.calls: list[ApiCall] = []
        self.status = status
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None

            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                api.calls.append(ApiCall(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                payload = b"{}"
                self.send_response(api.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_POST = do_DELETE = do_GET = do_PUT = _record

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def cloud_api() -> Iterator[RecordingApi]:
    api = RecordingApi()
    try:
        yield api
    finally:
        api.close()


@contextmanager
def logged_in(machine: Any, key: Path) -> Iterator[None]:
    """A user's interactive SSH session on an sshd VM (a shell, no job) while the block runs."""
    import paramiko

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=machine.port, username=machine.user, allow_agent=False, look_for_keys=False,
                   key_filename=str(key))
    shell = client.invoke_shell()
    try:
        yield
    finally:
        shell.close()
        client.close()


def idle_period_now(cloud: Any, monkeypatch: pytest.MonkeyPatch, idle_s: float, *flags: str) -> None:
    """Make the short idle period live (`cloudtrain autostop`), once the activity it must respect is
    under way: set at `up`, it could run out before a test's session opened on a slow machine."""
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_IDLE_S", str(idle_s))
    live = autostop_cli(cloud, cloud.cluster, "-i", "1", *flags)
    assert live.returncode == 0, live.stdout + live.stderr


def autostop_cli(cloud: Any, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`cloudtrain autostop ARGS...` in a fake cloud's environment, as a user runs it."""
    env = {**os.environ, **cloud.env}
    return cli_as(env, "autostop", *args, cwd=cloud.root, timeout=timeout)


# ---------------------------------------------------------------------------------------- GPUs

# A stand-in for nvidia-smi's `--query-gpu=utilization.gpu --format=csv,noheader,nounits`, scripted
# by a file the test rewrites: "0 0" (two GPUs at 0%), "50", "hang" (never answers), "fail" (exit 1,
# as with no driver). Every call is counted, so a test can wait for samples of a new mode.
FAKE_NVIDIA_SMI = """#!/bin/sh
echo x >> "{calls}"
case "$(cat "{mode}" 2>/dev/null)" in
  hang) exec sleep 600 ;;
  fail) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 1 ;;
  *) for value in $(cat "{mode}"); do echo "$value"; done ;;
esac
"""


@dataclass
class FakeGpus:
    """nvidia-smi at `bin_dir/nvidia-smi`, answering what `set(mode)` last said."""

    bin_dir: Path
    state: Path

    def __post_init__(self) -> None:
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        tool = self.bin_dir / "nvidia-smi"
        tool.write_text(FAKE_NVIDIA_SMI.format(mode=self.state / "mode", calls=self.state / "calls"))
        tool.chmod(0o755)

    def set(self, mode: str) -> None:
        tmp = self.state / "mode.part"
        tmp.write_text(mode + "\n")
        os.replace(tmp, self.state / "mode")

    @property
    def calls(self) -> int:
        path = self.state / "calls"
        return len(path.read_text().splitlines()) if path.exists() else 0
