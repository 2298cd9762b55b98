"""Following a job's log: whole lines, bounded whatever the job prints (issue 29, case 4)."""

from __future__ import annotations

from typing import Any

import pytest

from cloudtrain.run import follow
from cloudtrain.run.follow import split_lines
from tests.bounded import run_bounded

pytestmark = pytest.mark.quick

BIG = follow.MAX_LINE_BYTES

# (data, whole lines with the bytes each used, rest)
SPLITS = [
    (b"", [], b""),
    (b"a", [], b"a"),
    (b"a\n", [(b"a", 2)], b""),
    (b"a\nb\n\nc", [(b"a", 2), (b"b", 2), (b"", 1)], b"c"),
    (b"x" * BIG, [], b"x" * BIG),  # exactly the bound: still waiting for its newline
    (b"x" * BIG + b"\n", [(b"x" * BIG, BIG + 1)], b""),
    (b"x" * (BIG + 1), [(b"x" * BIG, BIG)], b"x"),  # past the bound: a piece comes out
    (b"x" * (2 * BIG + 5) + b"\nz", [(b"x" * BIG, BIG), (b"x" * BIG, BIG), (b"xxxxx", 6)], b"z"),
]


@pytest.mark.parametrize(("data", "lines", "rest"), SPLITS, ids=range(len(SPLITS)))
def test_split_lines(data: bytes, lines: list[tuple[bytes, int]], rest: bytes) -> None:
    got_lines, got_rest = split_lines(data)
    assert (got_lines, got_rest) == (lines, rest)
    assert sum(used for _, used in got_lines) + len(got_rest) == len(data)  # no byte lost or repeated


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []

    def log_line(self, line: str, node: int = 0) -> None:
        self.lines.append(line)

    def progress(self, event: dict[str, Any]) -> None:
        self.events.append(event)


NESTED = '{"cloudtrain": "progress", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
# (line, shown as progress?)
EMITS = [
    ('{"cloudtrain":"progress","type":"step","epoch":1,"step":5,"loss":0.5}', True),
    ('{"cloudtrain":"progress","type":"step","epoch":1,"step":5,"loss":NaN}', True),  # a diverged job's real line
    (NESTED, False),  # issue 29: RecursionError ended `cloudtrain run` with an internal error
    ('{"cloudtrain": "progress", "x": ' + "[" * 5000 + "]" * 5000 + "}", False),
    ('{"cloudtrain":"progress","type":"step","epoch":"one","step":5}', False),  # int() would raise
    ('{"cloudtrain":"progress","type":"step","step":5}', False),  # epoch missing: KeyError
    ('{"cloudtrain":"progress","type":"start","epochs":1e400}', False),  # inf: int() overflows
    ('{"cloudtrain":"progress","type":"start","epochs":true}', False),
    ('{"cloudtrain":"progress","type":"start","epochs":-1}', False),
    ('{"cloudtrain":"progress","type":"step","epoch":1,"step":5,"loss":"low"}', False),  # :.4f would raise
    ('{"cloudtrain":"progress","type":"epoch","note":"' + "x" * 70_000 + '"}', False),  # past the length bound
    ('{"cloudtrain":"progress","type":"whatever"}', True),  # unknown types move nothing
    ("plain text", False),
]


@pytest.mark.parametrize(("line", "as_progress"), EMITS, ids=range(len(EMITS)))
def test_progress_lines_are_events_or_text(line: str, as_progress: bool) -> None:
    rec = Recorder()
    follow._emit(line, 0, rec, None)  # type: ignore[arg-type]
    assert (rec.events != [], rec.lines == [line]) == (as_progress, not as_progress)


def test_deeply_nested_progress_line_is_text_within_limits() -> None:
    # issue 29, case 4: the 200,000-level line, through `run`'s display and `logs`' rendering.
    out = run_bounded(
        f"""
        from cloudtrain.cli.output import RunDisplay, render_log_line
        from cloudtrain.run import follow
        line = {NESTED[:32]!r} + "[" * 200_000 + "]" * 200_000 + "}}"
        display = RunDisplay()
        """,
        """
        follow._emit(line, 0, display, None)
        assert render_log_line(line) == line
        print("SHOWN AS TEXT")
        """,
    )
    assert "SHOWN AS TEXT" in out
