"""Every test gets its own CLOUDTRAIN_HOME so state, keys and local nodes never leak between tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cloudtrain_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ct-home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    # `up` adds an Include to ~/.ssh/config: tests get a HOME of their own, never the real one.
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.delenv("CLOUDTRAIN_CONFIG", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_DEBUG", raising=False)
    return home


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def cloudtrain(*args: str, cwd: Path | None = None, timeout: float = 600, **popen) -> subprocess.CompletedProcess:
    """Run the real CLI as a subprocess, the way a user does."""
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=cli_env(), **popen,
    )
