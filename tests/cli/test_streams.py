"""cli/streams.py: a stream whose reader went away stops writing instead of raising."""

from __future__ import annotations

import os

import pytest

from cloudtrain.cli.streams import GuardedStream

pytestmark = pytest.mark.quick


def test_a_write_after_the_reader_closed_the_pipe_is_kept_not_raised() -> None:
    read_end, write_end = os.pipe()
    raw = os.fdopen(write_end, "w", buffering=1)
    stream = GuardedStream(raw, "stdout")
    stream.write("seen\n")
    assert os.read(read_end, 100) == b"seen\n"
    os.close(read_end)
    stream.write("not seen\n")
    stream.flush()
    assert stream.dead and stream.reason
    assert "".join(stream.kept) == "not seen\n"
    # The descriptor now writes to /dev/null: the interpreter's flush at exit (or a child) succeeds.
    os.write(raw.fileno(), b"after\n")
    assert not stream.isatty()
    raw.close()


def test_other_errors_are_not_taken_for_a_gone_reader(tmp_path) -> None:  # noqa: ANN001
    raw = open(tmp_path / "f", "w")
    stream = GuardedStream(raw, "stdout")
    raw.close()
    with pytest.raises(ValueError):  # a closed file is a bug of ours, reported as one
        stream.write("x")
    assert not stream.dead
