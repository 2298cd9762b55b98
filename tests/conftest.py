"""Every test gets its own CLOUDTRAIN_HOME so state, keys and local nodes never leak between tests.

Two suite-wide rules live here too:
- Processes the tests start get SIGINT at its default disposition. Started in the background
  (`nohup scripts/test.sh &`) the suite inherits SIGINT ignored, Python then installs no
  KeyboardInterrupt handler in its children, and a test's Ctrl-C would be silently lost.
- Nothing the suite started may outlive it: every process carries a marker in its environment
  (sshd sessions and detached jobs don't inherit our environment, so their working directory or
  command line under the suite's temp dir counts too). Survivors are listed, killed, and fail the run.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from cloudtrain.testing import forkcli

REPO = Path(__file__).resolve().parents[1]

# Hypothesis traces every example for its "explain" phase when no deadline is set (as all ours):
# the trace makes each example several times slower, and the fuzz tests' per-input CPU limits
# (tests/bounded.py) then fail on the tracer's time, not the parser's. Failures still shrink.
settings.register_profile("cloudtrain", phases=[phase for phase in Phase if phase is not Phase.explain])
settings.load_profile("cloudtrain")
_MARK = "CLOUDTRAIN_TEST_SESSION"
os.environ.setdefault(_MARK, secrets.token_hex(8))


def default_sigint() -> None:
    """preexec_fn for test subprocesses: Ctrl-C behaves as for a user, however pytest was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(*args: str, cwd: Path | None = None, **popen) -> subprocess.Popen:  # noqa: ANN003
    """Start the real CLI in the background, as a user's shell would (SIGINT at its default)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, env=popen.pop("env", None) or cli_env(),
                            preexec_fn=default_sigint, **popen)


def _survivors(roots: list[str]) -> list[tuple[int, str]]:
    """Processes (not this one or its ancestors) that belong to this test session."""
    mark = f"{_MARK}={os.environ[_MARK]}".encode()
    mine = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        mine.add(pid)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except (OSError, IndexError):
            continue
        if mark in environ.split(b"\0") or any(cwd.startswith(r) or r in cmdline for r in roots):
            found.append((int(entry.name), cmdline))
    return found


# The longest tests (a TensorFlow job, a real minute of a cloud's billing or of Slurm's time limit,
# a sweep) start first and the quick tier comes last: with `--dist load` (scripts/test.sh) each
# worker takes the next test as it finishes one, so the run ends on short tests on every worker,
# not on one worker's two-minute test begun late.
LONGEST_FIRST = ("tests/e2e/", "tests/jobs/", "tests/sweep/", "tests/watchdog/", "tests/testing/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("quick") is not None:
            return 2
        return 0 if item.nodeid.startswith(LONGEST_FIRST) else 1

    items.sort(key=weight)  # stable: a module's tests stay together and in order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not Path("/proc/self/stat").exists() or hasattr(session.config, "workerinput"):
        return
    roots = [str(session.config._tmp_path_factory.getbasetemp())] if hasattr(session.config, "_tmp_path_factory") else []
    deadline = time.monotonic() + 5
    left = _survivors(roots)
    while left and time.monotonic() < deadline:
        # Give fixtures' last kills (sshd, proxies) a moment to be reaped.
        time.sleep(0.2)
        left = _survivors(roots)
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    listing = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in left)
    sys.stderr.write(f"\nerror: {len(left)} process(es) started by the tests outlived them (now killed):\n{listing}\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def cloudtrain_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ct-home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    # `up` adds an Include to ~/.ssh/config: tests get a HOME of their own, never the real one.
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.delenv("CLOUDTRAIN_CONFIG", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_STATE_URL", raising=False)  # a team database: only via state_backend
    monkeypatch.delenv("CLOUDTRAIN_DEBUG", raising=False)
    return home


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def cli_as(env: Mapping[str, str], *args: str, cwd: Path | str | None = None, timeout: float = 600,
           sigint: bool = False) -> subprocess.CompletedProcess:
    """`cloudtrain ARGS` with exactly this environment (another member's laptop, say), as
    `cloudtrain()` runs it: forked from the preloaded CLI where it can be. `sigint`: Ctrl-C works
    in it even if this process ignores it."""
    return forkcli.cli(list(args), env=env, cwd=cwd or os.getcwd(), timeout=timeout, default_sigint=sigint)


def cloudtrain(*args: str, cwd: Path | None = None, timeout: float = 600, **popen) -> subprocess.CompletedProcess:
    """Run the real CLI as a subprocess, the way a user does (forked from one that has imported
    it, cloudtrain/testing/forkcli.py, unless popen asks for more than input)."""
    if set(popen) <= {"input"}:
        return forkcli.cli(list(args), env=cli_env(), cwd=cwd or os.getcwd(), timeout=timeout, **popen)
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=cli_env(), **popen,
    )
