"""Work done once per test session, whichever worker asks first.

A module-scoped fixture runs once per pytest-xdist worker that gets one of its tests: with
`--dist load` the tests of one module spread over the workers, so a fixture that trains the
bundled CNN for its tests ran up to four times in one run. `once_per_session` makes it once: the
first worker to ask builds the result in a directory that all workers of this run share, under a
lock; the others wait on the lock and read it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

_DONE = ".done"


def session_dir(factory: pytest.TempPathFactory) -> Path:
    """A directory shared by every worker of this run (one run's workers share their base
    temp's parent, pytest-N); without xdist, the run's own base temp."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "once"
    path.mkdir(exist_ok=True)
    return path


def once_per_session(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory `name`, filled by `build(directory)` exactly once in this run. A build that
    raised leaves nothing: the next worker to ask builds it again (and sees the same failure)."""
    where = session_dir(factory)
    target = where / name
    with open(where / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _DONE).exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        try:
            build(target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / _DONE).touch()
    return target
