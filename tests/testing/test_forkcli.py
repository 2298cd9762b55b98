"""The test kit's CLI fork server runs `cloudtrain` as a fresh `python -m cloudtrain` would:
its own process, the caller's argv, environment, working directory and stdin, its exit status
(a signal's too), its output to the end, a timeout that kills it, concurrent calls apart."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from cloudtrain.testing import forkcli


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "HOME": str(home), "CLOUDTRAIN_HOME": str(tmp_path / "ct")}


def test_a_forked_cli_answers_as_a_fresh_one(env: dict[str, str], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nrun: echo hi\nresources: {cloud: local}\n")
    for argv in (["--help"], ["status"], ["validate", "r.yaml"], ["validate", "missing.yaml"], ["nosuch"]):
        fresh = subprocess.run([os.sys.executable, "-m", "cloudtrain", *argv], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        forked = forkcli.run(argv, env=env, cwd=tmp_path, timeout=120)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), argv
    # The working directory and the environment are the caller's: the relative recipe was found,
    # and the state went where CLOUDTRAIN_HOME says.
    assert forkcli.run(["validate", "r.yaml"], env=env, cwd=tmp_path, timeout=120).returncode == 0
    assert forkcli.run(["validate", "r.yaml"], env=env, cwd=tmp_path.parent, timeout=120).returncode == 2


def test_a_timeout_kills_it_and_concurrent_calls_stay_apart(env: dict[str, str], tmp_path: Path) -> None:
    # `exec` on the local cloud is a real process tree: a sleep under it that we end from outside.
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nrun: 'true'\nresources: {cloud: local}\n")
    up = forkcli.run(["up", "r.yaml", "--cluster", "fk"], env=env, cwd=tmp_path, timeout=120)
    assert up.returncode == 0, up.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        forkcli.run(["exec", "fk", "--", "sleep", "60"], env=env, cwd=tmp_path, timeout=3)

    results: list[subprocess.CompletedProcess] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        forkcli.run(["exec", "fk", "--", "echo", f"call-{i}"], env=env, cwd=tmp_path, timeout=120))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.stdout.strip() for r in results) == [f"call-{i}" for i in range(4)]
    assert all(r.returncode == 0 for r in results)

    down = forkcli.run(["down", "fk"], env=env, cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr


def test_a_signal_ends_it_as_it_would_end_a_subprocess(env: dict[str, str], tmp_path: Path) -> None:
    # The CLI's pid is its own: SIGKILL from outside reads as -9, as subprocess.run says it.
    done: list[subprocess.CompletedProcess] = []
    # A child that never ends by itself: `python -m cloudtrain` reading a recipe from a fifo.
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    thread = threading.Thread(target=lambda: done.append(
        forkcli.run(["validate", str(fifo)], env=env, cwd=tmp_path, timeout=60)))
    thread.start()
    pids = _children_of(forkcli._server_now().proc.pid)
    while not pids:
        pids = _children_of(forkcli._server_now().proc.pid)
    os.kill(pids[0], signal.SIGKILL)
    thread.join(60)
    assert done[-1].returncode == -signal.SIGKILL


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_the_server_ends_when_stopped_and_starts_again_when_needed(env: dict[str, str], tmp_path: Path) -> None:
    first = forkcli._server_now()
    forkcli.stop_server()
    assert first.proc.poll() is not None
    assert forkcli.run(["--help"], env=env, cwd=tmp_path, timeout=60).returncode == 0
    assert forkcli._server_now().proc.pid != first.proc.pid


def test_an_environment_a_fresh_interpreter_reads_at_its_start_gets_a_fresh_interpreter(
        env: dict[str, str], tmp_path: Path) -> None:
    # PYTHONPATH is read before any of our code runs: a forked child could not honour it, so that
    # call is a subprocess of its own (which imports the module named on it at start).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys; sys.stderr.write('fresh interpreter\\n')\n")
    plain = forkcli.run(["--help"], env=env, cwd=tmp_path, timeout=60)
    fresh = forkcli.run(["--help"], env={**env, "PYTHONPATH": str(site)}, cwd=tmp_path, timeout=60)
    assert plain.returncode == fresh.returncode == 0
    assert "fresh interpreter" not in plain.stderr and "fresh interpreter" in fresh.stderr
