"""The node program (cloudtrain/node, shipped as watchdog.pyz) as it runs on a node: real processes, real jobs started by runner.sh,
real TCP connections, and HTTP actions against a fake metadata server and a recording cloud API.

Timing is never asserted: each test waits for what the watchdog logs (a bound only stops a hung
test) and checks what it did or did not do.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from cloudtrain.testing.metadata import GCE_TOKEN_PATH, IMDS_TOKEN_PATH, MetadataServer
from tests.watchdog.conftest import (
    NodeDir,
    RecordingApi,
    decisions,
    marker_command,
    wait_busy_beyond_idle,
    wait_until,
)

IDLE_S = 1.0
TICK_S = 0.2


def acted(node: NodeDir, effect: str = "stop") -> bool:
    return any(d == effect and detail.startswith("done:") for d, detail in decisions(node.log))


def test_idle_node_shuts_down_and_logs_every_decision(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs_and_ssh"},
                   action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_until(lambda: marker.exists(), what="the shutdown command")
    assert marker.read_text() == "i-test stop wd\n"
    log = decisions(node_dir.log)
    assert log[0][0] == "start" and "autostop after 1s idle (stop" in log[0][1]
    assert any(d == "idle" for d, _ in log)
    assert any(d == "stop" and "autostop: idle" in detail for d, detail in log)
    # Acted once, then waits for the machine to go down instead of acting on every tick.
    wait_until(lambda: any(d == "waiting" for d, _ in decisions(node_dir.log)), what="a waiting decision")
    assert marker.read_text().count("\n") == 1


def test_a_running_job_keeps_the_node_up_until_it_ends(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    job = node_dir.start_job("train-1", "sleep 300")
    node_dir.write(autostop={"idle_s": IDLE_S, "down": True, "wait_for": "jobs"},
                   action={"kind": "shutdown", "effect": "delete"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, "job(s) running (train-1)")
    assert not marker.exists()
    node_dir.kill_job(job)  # the job ends: the idle clock starts
    wait_until(lambda: marker.exists(), what="the shutdown after the job ended")
    assert marker.read_text() == "i-test delete wd\n"


def test_a_job_started_and_finished_between_two_ticks_still_counts(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    # Long ticks: the job below is over before the watchdog looks again. Its end restarts the idle clock.
    node_dir.write(tick_s=1.0, autostop={"idle_s": 3.0, "down": False, "wait_for": "jobs"},
                   action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_until(lambda: decisions(node_dir.log)[1:], what="a first decision")
    job = node_dir.start_job("quick", "true")
    wait_until(lambda: (job / "exit_code").exists(), what="the quick job")
    wait_until(lambda: marker.exists(), what="the shutdown")
    assert any(d == "idle" and "since job quick ended" in detail for d, detail in decisions(node_dir.log))


def test_an_ssh_session_keeps_the_node_up_only_under_jobs_and_ssh(node_dir: NodeDir, tmp_path: Path) -> None:
    # Any listener will do as "sshd": the watchdog counts established connections to its port.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    server_side, _ = listener.accept()
    marker = tmp_path / "powered-off"
    try:
        node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs_and_ssh"}, count_ssh=True,
                       ssh_port=port, action={"kind": "shutdown", "effect": "stop"},
                       shutdown_command=marker_command(marker))
        node_dir.run()
        wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, "1 ssh session(s)")
        assert not marker.exists()
        # The same session, but the watchdog now waits for jobs only: it is idle.
        node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs"}, count_ssh=True,
                       ssh_port=port, action={"kind": "shutdown", "effect": "stop"},
                       shutdown_command=marker_command(marker))
        wait_until(lambda: marker.exists(), what="the shutdown with the session still open")
        assert any(d == "config" for d, _ in decisions(node_dir.log))
    finally:
        client.close()
        server_side.close()
        listener.close()


def test_the_budget_fires_while_a_job_runs(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    node_dir.start_job("long", "sleep 300")
    # 60 s already used on the laptop's bill, 61 s allowed: a second of running time is left.
    node_dir.write(autostop={"idle_s": 3600, "down": False, "wait_for": "jobs_and_ssh"},
                   budget={"limit_s": 61.0, "used_s": 60.0, "epoch": "e1", "why": "max_hours 0.017"},
                   action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_until(lambda: marker.exists(), what="the budget stop")
    (line,) = [detail for d, detail in decisions(node_dir.log) if d == "stop" and detail.startswith("budget")]
    assert "1 job(s) still running" in line and "max_hours 0.017" in line
    state = json.loads((node_dir.root / "watchdog.state.json").read_text())
    assert state["epoch"] == "e1" and state["used_s"] >= 61.0


def test_the_budget_count_survives_a_restart_of_the_watchdog(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    (node_dir.root / "watchdog.state.json").write_text(json.dumps({"epoch": "e2", "used_s": 500.0}))
    # The config's baseline (0 s) is older news than the node's own count for the same epoch.
    node_dir.write(budget={"limit_s": 500.5, "used_s": 0.0, "epoch": "e2", "why": "max_hours 0.14"},
                   action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_until(lambda: marker.exists(), what="the budget stop")


def test_gce_style_delete_uses_the_metadata_token(node_dir: NodeDir, metadata_server: MetadataServer,
                                                   cloud_api: RecordingApi) -> None:
    url = f"{cloud_api.url}/compute/v1/projects/p/zones/us-central1-a/instances/ct-wd-0"
    node_dir.write(autostop={"idle_s": IDLE_S, "down": True, "wait_for": "jobs_and_ssh"},
                   metadata_url=metadata_server.url,
                   action={"kind": "http", "effect": "delete", "method": "DELETE", "url": url, "gone_ok": True,
                           "token": {"url": f"http://metadata.google.internal{GCE_TOKEN_PATH}",
                                     "headers": {"Metadata-Flavor": "Google"}}})
    node_dir.run()
    wait_until(lambda: acted(node_dir, "delete"), what="the delete call")
    (call,) = cloud_api.calls
    assert call.method == "DELETE" and call.path == "/compute/v1/projects/p/zones/us-central1-a/instances/ct-wd-0"
    assert call.headers["authorization"] == f"Bearer {metadata_server.token_for('gce')}"
    (token_request,) = metadata_server.seen("gce")
    assert token_request.status == 200 and token_request.headers["metadata-flavor"] == "Google"


def test_azure_style_deallocate_retries_until_imds_answers(node_dir: NodeDir, metadata_server: MetadataServer,
                                                            cloud_api: RecordingApi) -> None:
    cloud_api.status = 202  # ARM accepts a deallocate asynchronously
    metadata_server.fail(503, times=1)  # the identity endpoint is not ready on the first try
    path = "/subscriptions/s/resourceGroups/ct-wd/providers/Microsoft.Compute/virtualMachines/ct-wd-0/deallocate"
    resource = "https://management.azure.com/"
    node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs_and_ssh"},
                   metadata_url=metadata_server.url,
                   action={"kind": "http", "effect": "stop", "method": "POST", "ok": [200, 202],
                           "url": f"{cloud_api.url}{path}?api-version=2024-07-01",
                           "token": {"url": f"http://169.254.169.254{IMDS_TOKEN_PATH}?api-version=2018-02-01"
                                            f"&resource={resource}", "headers": {"Metadata": "true"}}})
    node_dir.run()
    wait_until(lambda: acted(node_dir, "stop"), what="the deallocate call")
    (call,) = cloud_api.calls
    assert call.method == "POST" and call.path == f"{path}?api-version=2024-07-01" and call.body == b""
    assert call.headers["authorization"] == f"Bearer {metadata_server.token_for('imds')}"
    assert call.headers["content-length"] == "0"
    tries = metadata_server.seen("imds")
    assert [r.status for r in tries] == [503, 200] and tries[-1].query["resource"] == resource
    assert any(d == "error" and "HTTP 503" in detail for d, detail in decisions(node_dir.log))


def test_an_api_refusal_is_logged_and_retried(node_dir: NodeDir, metadata_server: MetadataServer,
                                              cloud_api: RecordingApi) -> None:
    cloud_api.status = 403  # e.g. the VM's identity has no role to deallocate itself
    node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs_and_ssh"},
                   metadata_url=metadata_server.url,
                   action={"kind": "http", "effect": "stop", "method": "POST", "url": f"{cloud_api.url}/stop",
                           "token": {"url": f"http://169.254.169.254{IMDS_TOKEN_PATH}?resource=x",
                                     "headers": {"Metadata": "true"}}})
    node_dir.run()
    wait_until(lambda: len(cloud_api.calls) >= 2, what="a second try")
    errors = [detail for d, detail in decisions(node_dir.log) if d == "error"]
    assert errors and "HTTP 403" in errors[0] and "try 1" in errors[0]


def test_ensure_starts_one_watchdog_and_changes_it_live(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    config = node_dir.config(autostop={"idle_s": 3600, "down": False, "wait_for": "jobs_and_ssh"},
                             action=None, shutdown_command=marker_command(marker))
    # No action for this instance and effect yet: the node asks for one and writes nothing.
    assert node_dir.watchdog("ensure", dict(config))["status"] == "need-action"
    assert not node_dir.config_path.exists()
    config["action"] = {"kind": "shutdown", "effect": "stop"}
    first = node_dir.watchdog("ensure", dict(config))
    assert first["status"] == "written" and first["started"] and first["running"]
    assert first["hook"].startswith("none (persist: none)")
    # The same settings again, without the action: one loop, nothing rewritten, the action kept.
    config["action"] = None
    again = node_dir.watchdog("ensure", dict(config))
    assert again == {**again, "status": "unchanged", "started": False, "pid": first["pid"]}
    # A live change (the `autostop` verb keeps the recipe's budget as the node has it).
    node_dir.write(**{**config, "action": {"kind": "shutdown", "effect": "stop"},
                      "budget": {"limit_s": 9e9, "used_s": 0, "epoch": "b", "why": "max_hours 99"}})
    change = {**config, "autostop": {"idle_s": IDLE_S, "down": False, "wait_for": "jobs"}, "keep": ["budget"]}
    assert node_dir.watchdog("ensure", change)["status"] == "written"
    wait_until(lambda: marker.exists(), what="the shutdown after the live change")
    written = json.loads(node_dir.config_path.read_text())
    assert written["budget"]["why"] == "max_hours 99" and "keep" not in written
    assert any(d == "config" and "autostop after 1s idle" in detail for d, detail in decisions(node_dir.log))


def test_nothing_to_enforce_ends_the_watchdog(node_dir: NodeDir) -> None:
    config = node_dir.config(autostop={"idle_s": 3600, "down": False, "wait_for": "jobs_and_ssh"},
                             action={"kind": "shutdown", "effect": "stop"})
    started = node_dir.watchdog("ensure", dict(config))
    assert started["running"]
    cancelled = node_dir.watchdog("ensure", {**config, "autostop": None})
    assert cancelled["status"] == "written"
    wait_until(lambda: node_dir.watchdog("check")["running_pid"] is None, what="the watchdog to end")
    assert decisions(node_dir.log)[-1] == ("exit", "nothing to enforce (autostop, budget and lease are off)")


def test_the_watchdog_ends_when_the_cluster_files_go(node_dir: NodeDir) -> None:
    node_dir.write(autostop={"idle_s": 3600, "down": False, "wait_for": "jobs_and_ssh"},
                   action={"kind": "shutdown", "effect": "stop"})
    proc = node_dir.run()
    wait_until(lambda: decisions(node_dir.log)[1:], what="a first decision")
    node_dir.config_path.unlink()  # what `down` on a machine we do not own does (rm -rf the cluster dir)
    assert proc.wait(timeout=60) == 0


def test_check_reports_what_counts_as_activity(node_dir: NodeDir) -> None:
    job = node_dir.start_job("j1", "sleep 300")
    node_dir.write()
    seen = node_dir.watchdog("check")
    assert seen["jobs_running"] == ["j1"] and seen["jobs"] == ["j1"] and seen["running_pid"] is None
    node_dir.kill_job(job)
    assert node_dir.watchdog("check")["jobs_running"] == []


# ---------------------------------------------------------------------------------------- the lease


def lease(seconds: float, why: str = "sweep abc123") -> dict:
    """A lease as the CLI sends it: due `seconds` from now on this (shared) clock."""
    now = time.time()
    return {"until": now + seconds, "why": why, "sent_at": now}


def test_the_lease_deletes_the_node_while_a_job_runs(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "deleted"
    node_dir.start_job("trial", "sleep 300")
    # Autostop far away and waiting for jobs: only the lease can end this node.
    config = node_dir.config(autostop={"idle_s": 3600, "down": False, "wait_for": "jobs"}, lease=lease(1.5),
                             action={"kind": "shutdown", "effect": "delete"}, action_key="i-test:delete",
                             shutdown_command=marker_command(marker))
    assert node_dir.watchdog("ensure", config)["running"]
    wait_until(lambda: marker.exists(), what="the delete at the lease end")
    assert marker.read_text() == "i-test delete wd\n"
    log = decisions(node_dir.log)
    assert "lease: delete by" in log[0][1] and "(sweep abc123)" in log[0][1]
    (line,) = [detail for d, detail in log if d == "delete" and not detail.startswith("done:")]
    assert line.startswith("lease: ") and "sweep abc123" in line and "1 job(s) still running" in line
    assert any(d == "busy" and "s left" in detail and "lease" in detail for d, detail in log)


def test_the_earliest_of_budget_and_lease_wins(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "deleted"
    # The budget has an hour left; the lease a second: the lease fires, whatever the budget says.
    node_dir.write(budget={"limit_s": 3600.0, "used_s": 0.0, "epoch": "e", "why": "max_hours 1"}, lease=lease(1.0),
                   action={"kind": "shutdown", "effect": "delete"}, shutdown_command=marker_command(marker))
    node_dir.run()
    wait_until(lambda: marker.exists(), what="the lease's delete")
    assert [d for d, detail in decisions(node_dir.log) if d == "delete" and detail.startswith("lease: ")]
    assert not [d for d, detail in decisions(node_dir.log) if detail.startswith("budget")]


def test_a_node_clock_behind_the_laptop_still_deletes_on_time(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "deleted"
    # The laptop's clock is an hour ahead of this node's: by the node's wall clock alone the lease
    # would fire an hour late. ensure notes the lease on the node's monotonic clock too.
    now = time.time()
    skewed = {"until": now + 3600 + 1.0, "why": "sweep skew", "sent_at": now + 3600}
    config = node_dir.config(lease=skewed, action={"kind": "shutdown", "effect": "delete"},
                             action_key="i-test:delete", shutdown_command=marker_command(marker))
    assert node_dir.watchdog("ensure", config)["running"]
    written = json.loads(node_dir.config_path.read_text())["lease"]
    assert written["until"] == skewed["until"] and "mono_until" in written and written["boot_id"]
    wait_until(lambda: marker.exists(), timeout=60, what="the delete on the node's own clock")
    # Sending the same lease again keeps the node's first reading (no later deadline from a resend).
    again = node_dir.watchdog("ensure", {**config, "lease": {**skewed, "sent_at": skewed["sent_at"] + 50}})
    assert again["status"] == "unchanged"
    assert json.loads(node_dir.config_path.read_text())["lease"]["mono_until"] == written["mono_until"]


def test_an_extended_lease_keeps_the_node_and_a_kept_lease_forces_the_delete(node_dir: NodeDir,
                                                                            tmp_path: Path) -> None:
    marker = tmp_path / "deleted"
    # The old lease leaves the second `ensure` (a Python process of its own) time to land before it
    # ends, also on a machine busy enough to take seconds to start one.
    old = lease(8)
    config = node_dir.config(lease=old, action={"kind": "shutdown", "effect": "delete"},
                             action_key="i-test:delete", shutdown_command=marker_command(marker))
    assert node_dir.watchdog("ensure", dict(config))["running"]
    # A new trial on the warm VM: the lease moves an hour on before the old one ends.
    assert node_dir.watchdog("ensure", {**config, "lease": lease(3600)})["status"] == "written"
    assert time.time() < old["until"], "the second ensure landed after the old lease ended: nothing to show"
    wait_until(lambda: any(d == "config" and "lease: delete by" in detail for d, detail in decisions(node_dir.log)),
               what="the new lease taken")
    wait_until(lambda: time.time() > old["until"], what="the old lease's end")
    past = sum(1 for d, _ in decisions(node_dir.log) if d == "idle")
    wait_until(lambda: sum(1 for d, _ in decisions(node_dir.log) if d == "idle") >= past + 5,
               what="ticks past the old lease")
    assert not marker.exists()
    # `cloudtrain autostop NAME -i ...` (no --down) keeps the lease, and with it the delete action:
    # the stop it sends is not taken.
    change = {**config, "lease": None, "keep": ["budget", "lease"], "action": {"kind": "shutdown", "effect": "stop"},
              "action_key": "i-test:stop", "autostop": {"idle_s": 3600, "down": False, "wait_for": "jobs"}}
    assert node_dir.watchdog("ensure", dict(change))["status"] == "written"
    written = json.loads(node_dir.config_path.read_text())
    assert written["action"]["effect"] == "delete" and written["action_key"] == "i-test:delete"
    assert written["lease"]["why"] == "sweep abc123" and written["autostop"]["idle_s"] == 3600
    # A node holding no delete action yet asks for one (the CLI then asks the provider with down=True).
    node_dir.write(**{**written, "action": {"kind": "shutdown", "effect": "stop"}, "action_key": "i-test:stop"})
    assert node_dir.watchdog("ensure", dict(change)) == {"status": "need-action", "down": True}


class _Metadata:
    """An instance metadata server that says this machine is `name` (EC2's IMDSv2 token too)."""

    def __init__(self, name: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:  # IMDSv2's session token
                self._send(b"session-token")

            def do_GET(self) -> None:
                if "token" in self.path.lower() or (self.headers.get("X-aws-ec2-metadata-token") is None
                                                    and "/latest/" in self.path):
                    self.send_error(401)
                    return
                self._send(name.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


GCE_IDENTITY = {"url": "http://metadata.google.internal/computeMetadata/v1/instance/name",
                "headers": {"Metadata-Flavor": "Google"}, "expect": "box-0-ab12"}
EC2_IDENTITY = {"token": {"url": "http://169.254.169.254/latest/api/token", "method": "PUT",
                          "headers": {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                          "header": "X-aws-ec2-metadata-token"},
                "url": "http://169.254.169.254/latest/meta-data/instance-id", "expect": "i-0abc"}
POWER_OFF = [  # (identity in the action, what the metadata server says, None: no server) -> powered off
    (GCE_IDENTITY, "box-0-ab12", True),
    (EC2_IDENTITY, "i-0abc", True),
    (GCE_IDENTITY, "someone-else", False),
    (EC2_IDENTITY, "i-0other", False),
    (GCE_IDENTITY, None, False),  # a laptop or CI runner: no metadata server at all
    (None, "box-0-ab12", False),  # an action that names no identity
]


@pytest.mark.parametrize("identity,answer,powered_off", POWER_OFF)
def test_the_watchdog_powers_off_only_the_machine_the_metadata_server_says_it_is(
    node_dir: NodeDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, identity: dict | None, answer: str | None,
    powered_off: bool
) -> None:
    # The real power-off commands, stood in for by scripts that leave a trace.
    bin_dir, marker = tmp_path / "bin", tmp_path / "powered-off"
    bin_dir.mkdir()
    for name in ("sudo", "shutdown", "systemctl", "poweroff"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {marker}\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    server = _Metadata(answer) if answer is not None else None
    # No server: a closed loopback port stands for the missing link-local address (nothing leaves).
    url = server.url if server is not None else "http://127.0.0.1:9"
    try:
        action = {"kind": "shutdown", "effect": "stop", **({"identity": identity} if identity else {})}
        node_dir.write(autostop={"idle_s": IDLE_S, "down": False, "wait_for": "none"}, action=action,
                       metadata_url=url)
        node_dir.run()
        if powered_off:
            wait_until(lambda: marker.exists(), what="the power-off")
            assert "shutdown -h now" in marker.read_text()
        else:
            wait_until(lambda: [d for d in decisions(node_dir.log) if d[0] == "error"], what="a refusal")
            refusal = next(detail for d, detail in decisions(node_dir.log) if d == "error")
            assert "refusing to power off: this machine is not the node" in refusal, refusal
            assert not marker.exists()
    finally:
        if server is not None:
            server.close()


SUDO = [  # (what `sudo -n` does on the node, refused at up)
    ("echo 'sudo: a password is required' >&2; exit 1", True),
    ("echo 'sudo: command not found' >&2; exit 127", True),
    ("exit 0", False),  # NOPASSWD, as cloud images give their login user
]


@pytest.mark.parametrize("sudo,refused", SUDO)
def test_ensure_refuses_an_os_shutdown_the_node_could_not_perform(sudo: str, refused: bool) -> None:
    """Without passwordless sudo a non-root watchdog's `sudo -n shutdown` fails: said at `up`
    (ensure), not found out when autostop or the budget silently never fires."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.watchdog.conftest import install_program

    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
    if os.geteuid() == 0 and not Path(python).exists():
        pytest.skip("needs /usr/bin/python3 to run the watchdog as an unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="ct-wd-sudo-"))
    try:
        root.chmod(0o777)
        (root / "bin").mkdir()
        fake = root / "bin" / "sudo"
        fake.write_text(f"#!/bin/sh\n{sudo}\n")
        fake.chmod(0o755)
        program = install_program(root)
        node = root / "node"
        node.mkdir()
        node.chmod(0o777)
        config = {"version": 1, "cluster": "wd", "instance_id": "i-test", "rank": 0, "tick_s": 60,
                  "autostop": {"idle_s": 3600, "down": False, "wait_for": "none"}, "budget": None,
                  "action": {"kind": "shutdown", "effect": "stop"}, "action_key": "i-test:stop",
                  "count_ssh": False, "ssh_port": None, "persist": "none"}
        argv = [python, str(program), "ensure", str(node / "watchdog.json")]
        if os.geteuid() == 0:  # the check is for a login user that is not root
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *argv]
        env = {"PATH": f"{root / 'bin'}:/usr/bin:/bin", "HOME": str(root)}
        done = subprocess.run(argv, input=json.dumps(config), capture_output=True, text=True, timeout=60, env=env)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if refused:
            assert answer["status"] == "refused" and "passwordless sudo" in answer["why"], answer
            assert not (node / "watchdog.json").exists()  # nothing written, nothing started
        else:
            assert answer["status"] == "written" and answer["running"], answer
            stop = [*argv[:-2], "stop", argv[-1]]
            subprocess.run(stop, capture_output=True, text=True, timeout=60, env=env, check=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
