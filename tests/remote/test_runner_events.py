"""A job's progress events come beside its log (templates/runner.sh `follow` with an events offset):
the job appends them to CLOUDTRAIN_PROGRESS_FILE, its log stays its words for people."""

from __future__ import annotations

import pytest

from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import NodeLayout
from cloudtrain.remote.local import LocalTransport

pytestmark = pytest.mark.quick

JOB = r"""
echo "epoch 1/2  loss 0.5"
printf '{"cloudtrain":"progress","type":"epoch","epoch":1,"epochs":2}\n' >> "$CLOUDTRAIN_PROGRESS_FILE"
echo "epoch 2/2  loss 0.4"
printf '{"cloudtrain":"progress","type":"epoch","epoch":2,"epochs":2}\n' >> "$CLOUDTRAIN_PROGRESS_FILE"
"""


def _follow(transport: LocalTransport, layout: NodeLayout, job_id: str, offset: int,
            events: int | None) -> dict[bytes, bytes]:
    following = jobs.follow_log(transport, layout, job_id, offset, events)
    got = {jobs.LOG: b"", jobs.EVENTS: b""}
    for kind, data in following.pieces:
        got[kind] += data
    assert following.final().state == "succeeded"
    return got


def test_the_follow_brings_the_events_beside_the_log_and_resumes_each_from_its_offset(tmp_path) -> None:  # noqa: ANN001
    home = tmp_path / "node"
    home.mkdir()
    transport = LocalTransport(home)
    layout = NodeLayout(str(home / ".cloudtrain" / "c"))
    jobs.install_runtime(transport, layout)
    (home / ".cloudtrain" / "c" / "workdir").mkdir()
    jobs.submit(transport, layout, "j1", JOB, {})
    got = _follow(transport, layout, "j1", 0, 0)
    assert got[jobs.LOG] == b"epoch 1/2  loss 0.5\nepoch 2/2  loss 0.4\n"  # no protocol in the log
    assert got[jobs.EVENTS].count(b'"type":"epoch"') == 2
    first = got[jobs.EVENTS].index(b"\n") + 1
    again = _follow(transport, layout, "j1", len(got[jobs.LOG]), first)  # a resume after a dropped link
    assert again == {jobs.LOG: b"", jobs.EVENTS: got[jobs.EVENTS][first:]}
    plain = _follow(transport, layout, "j1", 0, None)  # nobody asked for events: the log as it is
    assert plain == {jobs.LOG: got[jobs.LOG], jobs.EVENTS: b""}
    state, log, events = jobs.poll(transport, layout, "j1", 0, events=first)
    assert (state.state, log, events) == ("succeeded", got[jobs.LOG], got[jobs.EVENTS][first:])
