"""The CLI refuses a Python older than 3.11.4 with one line, before doing anything else.

Results come home as tar archives unpacked with tarfile's `data` filter (PEP 706), which 3.11.4
added; on an older 3.11 the unpacking would fail half-way through a run instead.
"""

from __future__ import annotations

import sys

import pytest

from cloudtrain.cli.main import main, python_too_old

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ((3, 11, 4, "final", 0), True),
        ((3, 11, 7, "final", 0), True),
        ((3, 12, 0, "final", 0), True),
        ((4, 0, 0, "alpha", 1), True),
        ((3, 11, 3, "final", 0), False),
        ((3, 11, 2, "final", 0), False),  # Debian 12's python3
        ((3, 11, 0, "candidate", 1), False),
        ((3, 10, 14, "final", 0), False),
        ((3, 9, 18, "final", 0), False),
    ],
)
def test_python_floor(version: tuple[int, int, int, str, int], ok: bool) -> None:
    problem = python_too_old(version)
    if ok:
        assert problem is None
        return
    assert problem is not None and "\n" not in problem
    have = ".".join(str(p) for p in version[:3])
    assert problem.startswith(f"error: cloudtrain needs Python 3.11.4 or newer (this is {have}): ")
    assert "data" in problem and "PYTHON=" in problem  # why, and what to do about it


def test_main_exits_2_on_old_python_before_parsing_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "version_info", (3, 11, 2, "final", 0))
    with pytest.raises(SystemExit) as info:
        main(["status"])  # would touch state if the check did not come first
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("error: cloudtrain needs Python 3.11.4 or newer (this is 3.11.2)")


def test_this_python_passes() -> None:
    assert python_too_old(sys.version_info) is None
