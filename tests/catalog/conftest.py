"""Fixtures for the catalog tests: a fake gpuhunt server, and the CLI with `catalog` registered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.catalog.fake_gpuhunt import FakeGpuhunt, publish_all
from tests.conftest import cli_env

# Runs the real CLI; registers `catalog` in the command table only until the lead adds it to main.py.
_ENTRY = ("import sys; from cloudtrain.cli.main import COMMANDS, main; "
          "COMMANDS.setdefault('catalog', ('cloudtrain.cli.catalog', 'catalog', 'catalog')); main()")


def run_cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _ENTRY, *args], cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=300, env=cli_env(**env))


@pytest.fixture
def gpuhunt_server() -> Iterator[FakeGpuhunt]:
    fake = FakeGpuhunt()
    publish_all(fake)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def no_gpuhunt_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own GPUHUNT_CATALOG_URL/DIR never reach these tests."""
    monkeypatch.delenv("GPUHUNT_CATALOG_URL", raising=False)
    monkeypatch.delenv("GPUHUNT_CATALOG_DIR", raising=False)
