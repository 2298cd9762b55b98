"""The watchdog's ssh session rule (cloudtrain/node/signals.py session_rule), over sequences of looks.

The bug this pins: one look that missed a live session (a read of a busy /proc/net/tcp) was taken
as "the last ssh session ended", so the idle clock ran while a user was logged in.
"""

from __future__ import annotations

import pytest

from cloudtrain.node.signals import session_rule

pytestmark = pytest.mark.quick


# Each look: the session count read (None: cannot count). Expected per look: "busy" (a session
# holds the node), "ended" (the idle clock starts now), or "-" (sessions play no part).
@pytest.mark.parametrize(("looks", "expected"), [
    ([0, 0, 0], ["-", "-", "-"]),
    ([1, 1, 1], ["busy", "busy", "busy"]),
    # One look misses the session, the next sees it again: busy throughout, never ended.
    ([1, 0, 1, 1], ["busy", "busy", "busy", "busy"]),
    ([2, 0, 2, 0, 2], ["busy"] * 5),
    # Gone on two looks in a row: ended on the second, idle after.
    ([1, 0, 0, 0], ["busy", "busy", "ended", "-"]),
    ([3, 1, 0, 0], ["busy", "busy", "busy", "ended"]),
    # Unknown (no port, no /proc) counts nothing and forgets what was seen.
    ([1, None, 0], ["busy", "-", "-"]),
    # A new session after an ended one is busy again at once.
    ([1, 0, 0, 1, 0, 0], ["busy", "busy", "ended", "busy", "busy", "ended"]),
])
def test_a_session_ends_only_when_two_looks_in_a_row_miss_it(looks: list, expected: list[str]) -> None:
    seen, absent, got = 0, 0, []
    for now in looks:
        busy, ended, seen, absent = session_rule(seen, now, absent)
        assert not (busy and ended)
        got.append("busy" if busy else "ended" if ended else "-")
        if busy:
            assert "ssh session(s)" in busy
    assert got == expected
