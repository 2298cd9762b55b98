"""A long workdir sync says how far it got (issue 35.12: 60 MB was 15 s of silence)."""

from __future__ import annotations

import io
import logging

import pytest

from cloudtrain.remote.sync import PROGRESS_AFTER_S, PROGRESS_EVERY_S, _Progress

pytestmark = pytest.mark.quick


def test_a_transfer_past_a_few_seconds_reports_progress_then_every_few_seconds(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    data = io.BytesIO(b"x" * 60_000_000)
    stream = _Progress(data, 60_000_000, 12, "root@10.0.0.5", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="cloudtrain.remote.sync"):
        stream.read(10_000_000)  # at once: nothing said
        now[0] = PROGRESS_AFTER_S
        stream.read(10_000_000)
        now[0] += PROGRESS_EVERY_S / 2
        stream.read(10_000_000)  # too soon after the last line
        now[0] += PROGRESS_EVERY_S
        stream.read(30_000_000)
        assert stream.read(1) == b""
    # Only the sync's own lines: caplog also holds what another test's SSH thread, ending in this
    # worker now, logs (paramiko's "Error reading SSH protocol banner" once made this test fail).
    said = [r.getMessage() for r in caplog.records if r.name == "cloudtrain.remote.sync"]
    assert said == [
        "syncing 12 file(s) to root@10.0.0.5: 20.0 of 60.0 MB sent (6.7 MB/s)",
        f"syncing 12 file(s) to root@10.0.0.5: 60.0 of 60.0 MB sent ({60 / (PROGRESS_AFTER_S + 1.5 * PROGRESS_EVERY_S):.1f} MB/s)",
    ], said
    assert stream.sent == 60_000_000
