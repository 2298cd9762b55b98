"""Running `cloudtrain sweep` as a user does, as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_as, cli_env, default_sigint


@pytest.fixture(autouse=True)
def _watchdog_stays_in_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every sweep VM runs an on-node watchdog (its lease): never one in the developer's crontab or
    # systemd (on `local` the node is this machine).
    monkeypatch.setenv("CLOUDTRAIN_WATCHDOG_PERSIST", "none")


def sweep_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return cli_as(cli_env(), "sweep", *args, cwd=cwd, timeout=timeout, sigint=True)


def start_sweep_cli(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cloudtrain", "sweep", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(),
                            preexec_fn=default_sigint)  # noqa: PLW1509
