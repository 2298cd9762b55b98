"""Stopped, then deleted (issue 39.3), on the node: with `autostop.delete_after_stopped_days`, the
watchdog tags its machine with when it may be deleted just before it stops it, with the machine's
own identity (the liveness mark's call, `mark`); a machine without one, or a tag the cloud refuses,
still stops on time. And the rule `gc --expired` applies to those tags, as a table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cloudtrain import expiry
from cloudtrain.expiry import Expiry, due_at, verdict
from cloudtrain.node.protocol import expiry_tags
from tests.watchdog.conftest import NodeDir, RecordingApi, decisions, marker_command, wait_until

IDLE_S = 1.0
DAY = 86400.0


def stop_config(node_dir: NodeDir, marker: Path, mark: dict | None, days: int | None = 7) -> None:
    autostop = {"idle_s": IDLE_S, "down": False, "wait_for": "jobs"}
    if days is not None:
        autostop["delete_after_stopped_days"] = days
    node_dir.write(autostop=autostop, mark=mark, action={"kind": "shutdown", "effect": "stop"},
                   shutdown_command=marker_command(marker))


def test_the_node_tags_its_machine_before_it_stops_it(node_dir: NodeDir, cloud_api: RecordingApi,
                                                      tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    url = f"{cloud_api.url}/compute/v1/projects/p/zones/z/instances/ct-wd-0"
    # GCE's shape: read the labels and their fingerprint, write them back with it (setLabels).
    stop_config(node_dir, marker, {"kind": "http-mark", "key": "cloudtrain-alive", "get": url, "field": "labels",
                                   "fingerprint": "labelFingerprint", "method": "POST", "url": f"{url}/setLabels"})
    before = time.time()
    node_dir.run()
    wait_until(marker.exists, what="the idle stop")
    get, post = cloud_api.calls
    assert (get.method, post.method, post.path) == ("GET", "POST", "/compute/v1/projects/p/zones/z/instances/ct-wd-0/setLabels")
    labels = json.loads(post.body)["labels"]
    assert labels["cloudtrain-delete-after-stopped-days"] == "7"
    assert before + 7 * DAY - 1 <= int(labels["cloudtrain-delete-after"]) <= time.time() + 7 * DAY
    logged = [d for d, _ in decisions(node_dir.log) if d in ("expiry", "stop")]
    assert logged[:2] == ["expiry", "stop"]  # tagged first, then the stop


@pytest.mark.parametrize("mark,status,said", [
    ({"kind": "none", "why": "its machine runs with no identity that may label it"}, 200, "not tagged"),
    ("http", 403, "expiry tags not written"),
])
def test_no_identity_or_a_refused_tag_never_delays_the_stop(node_dir: NodeDir, cloud_api: RecordingApi,
                                                            tmp_path: Path, mark: object, status: int,
                                                            said: str) -> None:
    marker = tmp_path / "powered-off"
    cloud_api.status = status
    if mark == "http":
        mark = {"kind": "http-mark", "key": "cloudtrain-alive", "get": cloud_api.url, "field": "tags",
                "method": "PUT", "url": cloud_api.url}
    stop_config(node_dir, marker, mark)  # type: ignore[arg-type]
    node_dir.run()
    wait_until(marker.exists, what="the idle stop")
    assert any(said in detail for d, detail in decisions(node_dir.log) if d in ("expiry", "error"))


def test_without_days_nothing_is_tagged(node_dir: NodeDir, cloud_api: RecordingApi, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    stop_config(node_dir, marker, {"kind": "http-mark", "key": "cloudtrain-alive", "get": cloud_api.url,
                                   "field": "tags", "method": "PUT", "url": cloud_api.url}, days=None)
    node_dir.run()
    wait_until(marker.exists, what="the idle stop")
    assert cloud_api.calls == [] and not any(d == "expiry" for d, _ in decisions(node_dir.log))


def test_the_tags_a_stop_leaves_read_back_as_their_expiry() -> None:
    # One rule (cloudtrain/node/protocol.py): the node writes these tags, gc reads them back.
    tags = expiry_tags(7, 1_000_000.0)
    assert expiry.expiry_of(tags) == Expiry(1_000_000.0 + 7 * DAY, 7.0)
    # Digits only: a GCE label value takes lowercase letters, digits, '-' and '_'.
    assert all(v.isdigit() for v in tags.values()) and expiry.launch_tags(7) == {expiry.TAG_STOPPED_DAYS: "7"}


T0 = 1_700_000_000.0
TAGGED = Expiry(T0 + 7 * DAY, 7.0)  # the watchdog's tags for a stop at T0
LAUNCH = Expiry(None, 7.0)  # the launch's tag only (a node that cannot tag itself)


@pytest.mark.parametrize("stopped,tags,since,live,at,delete,due", [
    (True, TAGGED, T0 + 5, False, T0 + 8 * DAY, True, T0 + 5 + 7 * DAY),  # the cloud's stop time, a little later
    (True, TAGGED, T0 + 5, False, T0 + 6 * DAY, False, T0 + 5 + 7 * DAY),  # not yet
    (True, TAGGED, None, False, T0 + 8 * DAY, True, T0 + 7 * DAY),  # no stop time reported: the node's tag
    (True, LAUNCH, T0, False, T0 + 7 * DAY, True, T0 + 7 * DAY),  # the launch's days + the cloud's stop time
    (True, LAUNCH, None, False, T0 + 99 * DAY, False, None),  # when it stopped is unknown: never
    (True, TAGGED, T0 + 30 * DAY, False, T0 + 31 * DAY, False, T0 + 37 * DAY),  # started and stopped again since
    (True, TAGGED, T0, True, T0 + 8 * DAY, False, T0 + 7 * DAY),  # live work holds it
    (False, TAGGED, T0, False, T0 + 8 * DAY, False, T0 + 7 * DAY),  # running again
    (True, Expiry(), T0, False, T0 + 99 * DAY, False, None),  # never armed
])
def test_the_rule_gc_expired_applies(stopped: bool, tags: Expiry, since: float | None, live: bool, at: float,
                                     delete: bool, due: float | None) -> None:
    found = verdict(stopped, tags, since, live, at)
    assert (found.delete, found.due) == (delete, due), found
    assert due_at(tags, since)[0] == due


def test_foreign_tag_values_arm_nothing() -> None:
    assert not expiry.expiry_of({"cloudtrain-delete-after": "2026-01-01", "cloudtrain-delete-after-stopped-days": "7.5"}).armed


def test_the_kit_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_NOW", "1234")
    assert expiry.now() == 1234.0
    monkeypatch.setenv("CLOUDTRAIN_NOW", "soon")
    with pytest.raises(expiry.UsageError):
        expiry.now()
    line = expiry.stopped_disk_cost_line(0.01, T0 + 7 * DAY, T0)
    assert line.startswith("stopped: its disks cost about $0.2400/day") and "7.0 days, about $1.68 more" in line
