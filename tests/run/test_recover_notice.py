"""The node's reading of its cloud's interruption notice (cloudtrain/node/notices.py interruption_notice)
against the metadata fake's three endpoints (cloudtrain/testing/metadata.py), and what it does on
one: interruption.json beside the config, the running job TERMed (run/recover.py reads the first;
the job's last checkpoint comes of the second)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import paths
from cloudtrain.node.loop import Watchdog
from cloudtrain.node.notices import interruption_notice
from cloudtrain.node.protocol import NOTICE_FILE, NOTICE_SCRIPT
from cloudtrain.testing.metadata import MetadataServer
from cloudtrain.testing.wait import wait_until


AZURE_VM = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/vm-0"


@pytest.mark.parametrize(("cloud", "armed", "seen", "says"), [
    ("aws", None, False, "no notice"),
    ("aws", ("aws", None), True, "spot/instance-action terminate"),
    ("gcp", None, False, "instance/preempted FALSE"),
    ("gcp", ("gcp", None), True, "instance/preempted TRUE"),
    ("azure", None, False, "no Preempt event"),
    ("azure", ("azure", ["vm-0"]), True, "scheduled event Preempt"),
    ("azure", ("azure", ["vm-1"]), False, "no Preempt event"),  # another VM's eviction
    ("azure", ("azure", []), True, "scheduled event Preempt"),  # no resources listed: every VM's
    ("gcp", ("aws", None), False, "instance/preempted FALSE"),  # another cloud's notice is not this one's
])
def test_each_clouds_notice_is_read_as_its_docs_describe(metadata_server: MetadataServer, cloud: str,
                                                          armed: tuple[str, Any] | None, seen: bool, says: str) -> None:
    if armed is not None:
        metadata_server.interrupt(armed[0], armed[1])
    got, detail = interruption_notice(cloud, {"metadata_url": metadata_server.url, "instance_id": AZURE_VM})
    assert (got, says in detail) == (seen, True), detail


def test_no_metadata_server_is_no_notice() -> None:
    got, detail = interruption_notice("aws", {"metadata_url": "http://127.0.0.1:9"})
    assert not got and "metadata server" in detail


def test_a_notice_records_itself_and_terms_the_running_job(metadata_server: MetadataServer, tmp_path: Path) -> None:
    """A job that traps TERM writes its mark; the notice file names the job; once per machine."""
    root = tmp_path / "cluster"
    job = root / "jobs" / "j1"
    (root / "runtime").mkdir(parents=True)
    (root / "runtime" / "runner.sh").write_bytes((paths.templates_dir() / "runner.sh").read_bytes())
    job.mkdir(parents=True)
    mark = tmp_path / "termed"
    ready = tmp_path / "trapping"
    (job / "cmd.sh").write_text(f"trap 'echo yes > {mark}; exit 143' TERM\ntouch {ready}\n"
                                "while true; do sleep 0.1; done\n")
    (job / "env.sh").write_text("")
    subprocess.run(["sh", str(root / "runtime" / "runner.sh"), "start", str(job)], check=True, capture_output=True)
    # A TERM before the job's shell has set its trap would end it without the mark (a loaded machine).
    wait_until(ready.exists, 30, "the job to set its TERM trap")
    config = root / "watchdog.json"
    config.write_text(json.dumps({"interruption": "gcp", "metadata_url": metadata_server.url, "tick_s": 1}))
    loop = Watchdog(str(config))
    try:
        loop.wake_in = 1.0
        loop.watch_for_notice(json.loads(config.read_text()))
        assert not (root / NOTICE_FILE).exists()  # nothing announced yet
        metadata_server.interrupt("gcp")
        loop.watch_for_notice(json.loads(config.read_text()))
        notice = json.loads((root / NOTICE_FILE).read_text())
        assert notice["kind"] == "gcp" and notice["jobs"] == ["j1"] and "TRUE" in notice["detail"]
        wait_until(lambda: mark.exists() and (job / "exit_code").exists(), 30, "the job TERMed, ended")
        assert (job / "exit_code").read_text().strip() == "143"
    finally:
        subprocess.run(["sh", str(root / "runtime" / "runner.sh"), "kill", str(job), "1"], capture_output=True)


@pytest.mark.parametrize("left", [True, False])
def test_a_notice_starts_the_upload_the_cli_left_on_the_node(metadata_server: MetadataServer, tmp_path: Path,
                                                             left: bool) -> None:
    """With on_notice.sh beside the config (a run with `upload:`, run/recover_upload.py) the notice
    starts it and interruption.json says so; without it, it says no upload was started."""
    root = tmp_path / "cluster"
    (root / "jobs").mkdir(parents=True)
    ran = tmp_path / "uploaded"
    if left:
        (root / NOTICE_SCRIPT).write_text(f"echo up > {ran}\n")
    config = root / "watchdog.json"
    config.write_text(json.dumps({"interruption": "aws", "metadata_url": metadata_server.url, "tick_s": 1}))
    loop = Watchdog(str(config))
    loop.wake_in = 1.0
    metadata_server.interrupt("aws")
    loop.watch_for_notice(json.loads(config.read_text()))
    notice = json.loads((root / NOTICE_FILE).read_text())
    assert notice["upload"] is left and notice["jobs"] == []
    if left:
        wait_until(lambda: ran.exists() and ran.read_text() == "up\n", 30, "the upload script to run")
        assert "started on_notice.sh" in (root / "watchdog.log").read_text()
    else:
        assert not ran.exists() and "on_notice.sh" not in (root / "watchdog.log").read_text()
