"""The node's own events (issue 38, "From the node"): the watchdog signs and sends watchdog.stopped /
watchdog.deleted / deadline.reached itself, just before it acts, within a few seconds; its sent-log
is reconciled into the laptop's outbox. The signature is checked with the `standardwebhooks`
package, an implementation independent of both signers."""

from __future__ import annotations

import base64
import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from cloudtrain import paths
from cloudtrain.node import tell as node_tell
from cloudtrain.node.bundle import program
from cloudtrain.node.loop import Watchdog
from cloudtrain.node.protocol import SENT_LOG, Paths
from cloudtrain.notify import outbox
from cloudtrain.notify.model import preemption_event_id
from cloudtrain.notify.node import NodeTarget, node_config, node_secrets, node_targets, reconcile
from cloudtrain.notify.signing import headers as laptop_headers
from cloudtrain.notify.signing import new_secret, secret_key
from cloudtrain.notify.targets import NotifyTarget, bind
from cloudtrain.state import StateStore
from tests.notify.receiver import free_port, receiving
from tests.watchdog.conftest import NodeDir, decisions, marker_command, wait_until


def _node_notify(url: str, secret: str, on: tuple[str, ...] = ("watchdog.stopped",)) -> tuple[dict, dict]:
    target = NodeTarget("ci hook", "config:#abcdef0123456789", url, on, secret)
    return node_config("aws", [target]), node_secrets([target])


def test_the_nodes_signature_verifies_with_standardwebhooks_and_matches_the_laptops() -> None:
    secret = new_secret()
    event_id, body = node_tell.node_event({"cluster": "c1", "instance_id": "i-1", "notify": {"cloud": "aws"}},
                                   "watchdog.stopped", "autostop: idle 3s >= 3s")
    signed = node_tell.webhook_headers(secret, event_id, body)
    envelope = Webhook(secret).verify(body, signed)
    assert envelope["type"] == "watchdog.stopped" and envelope["id"] == event_id and envelope["version"] == 1
    assert envelope["source"] == "node"
    assert envelope["data"] == {"cluster": "c1", "cloud": "aws", "instance": "i-1", "reason": "autostop: idle 3s >= 3s"}
    assert envelope["timestamp"].endswith("Z") and len(envelope["timestamp"]) == len("2026-11-28T10:25:14.120Z")
    # Byte for byte what cloudtrain/notify/signing.py makes for the same id, time and body.
    assert signed["webhook-signature"] == laptop_headers(secret_key(secret), event_id,
                                                         int(signed["webhook-timestamp"]), body)["webhook-signature"]
    with pytest.raises(Exception):  # noqa: B017 - any verifier error: another secret must not verify
        Webhook(new_secret()).verify(body, signed)


def test_tell_retries_with_the_same_id_logs_by_name_and_appends_the_sent_log(tmp_path: Path) -> None:
    secret = new_secret()
    with receiving(secret, fail_first=2) as receiver:
        notify, secrets = _node_notify(receiver.url, secret)
        node = Paths(str(tmp_path / "watchdog.json"))
        node_tell.write_secrets(node, {"notify": notify}, secrets)
        lines: list[tuple[str, str]] = []
        cfg = {"cluster": "c1", "instance_id": "i-1", "notify": notify}
        node_tell.tell(cfg, node, lambda d, text: lines.append((d, text)), "watchdog.stopped", "autostop: idle")
        node_tell.tell(cfg, node, lambda d, text: lines.append((d, text)), "watchdog.deleted", "not wanted")
    assert [d.answered for d in receiver.got] == [500, 500, 204]
    assert len({d.headers["webhook-id"] for d in receiver.got}) == 1  # every retry: the same id
    (envelope,) = receiver.accepted()
    assert envelope["type"] == "watchdog.stopped"
    (entry,) = [json.loads(x) for x in (tmp_path / SENT_LOG).read_text().splitlines()]
    assert entry["id"] == envelope["id"] and entry["status"] == "delivered" and entry["attempts"] == 3
    assert entry["target"] == "config:#abcdef0123456789" and json.loads(entry["body"]) == envelope
    ((decision, text),) = lines
    assert decision == "notify" and "to ci hook: delivered (3 attempt(s))" in text
    for written in (text, (tmp_path / SENT_LOG).read_text()):
        assert secret not in written and str(receiver.port) not in written


def test_a_receiver_that_is_down_or_slow_costs_the_stop_at_most_the_budget(tmp_path: Path) -> None:
    import socket
    import threading

    secret = new_secret()
    silent = socket.socket()  # accepts connections, never answers: the slowest receiver
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    down = NodeTarget("down", "config:#0000000000000001", f"http://127.0.0.1:{free_port()}/", ("watchdog.stopped",),
                      secret)
    slow = NodeTarget("slow", "config:#0000000000000002", f"http://127.0.0.1:{silent.getsockname()[1]}/",
                      ("watchdog.stopped",), secret)
    node = Paths(str(tmp_path / "watchdog.json"))
    notify = node_config("aws", [down, slow])
    node_tell.write_secrets(node, {"notify": notify}, node_secrets([down, slow]))
    lines: list[tuple[str, str]] = []
    started = time.monotonic()
    try:
        node_tell.tell({"cluster": "c1", "notify": notify}, node, lambda d, t: lines.append((d, t)), "watchdog.stopped", "x")
    finally:
        silent.close()
    took = time.monotonic() - started
    assert took < node_tell.NOTIFY_BUDGET_S + 0.5, took
    assert threading.active_count() < 10
    said = {text.split(" to ", 1)[1].split(":", 1)[0]: text for _, text in lines}
    assert set(said) == {"down", "slow"} and all("not delivered" in t for t in said.values())
    states = {json.loads(x)["name"]: json.loads(x)["status"] for x in (tmp_path / SENT_LOG).read_text().splitlines()}
    assert states == {"down": "failed", "slow": "failed"}


def test_secrets_land_in_0600_files_never_in_the_config_and_go_with_their_target(tmp_path: Path) -> None:
    """Through the CLI's own installer (_BOOT): the secrets travel on stdin, never in argv or the config."""
    import subprocess
    import sys

    from cloudtrain.run.watchdog import _BOOT

    node = NodeDir(tmp_path / "home" / ".cloudtrain" / "wd")
    secret = new_secret()
    notify, secrets = _node_notify("http://127.0.0.1:9/hook", secret)
    action = {"kind": "exec", "effect": "stop", "argv": ["true"]}

    def install(notify: dict, secrets: dict) -> dict:
        payload = {"program": base64.b64encode(program()).decode(), "secrets": secrets,
                   "config": node.config(notify=notify, action=action)}
        argv = [sys.executable, "-c", _BOOT, str(node.program), str(node.config_path)]
        assert secret not in " ".join(argv)
        done = subprocess.run(argv, input=json.dumps(payload), capture_output=True, text=True, timeout=60, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        assert install(notify, secrets)["status"] == "written"  # nothing to enforce: no loop starts
        (path,) = node.root.glob("notify-*.secret")
        assert path.read_text() == secret and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert secret not in node.config_path.read_text()
        assert json.loads(node.config_path.read_text())["notify"]["targets"][0]["secret_file"] == path.name
        install({"cloud": "aws", "targets": []}, {})
        assert not list(node.root.glob("notify-*.secret"))  # a target no longer configured: its secret gone
    finally:
        node.close()


def test_the_watchdog_tells_before_it_stops_and_only_once(tmp_path: Path) -> None:
    node = NodeDir(tmp_path / "home" / ".cloudtrain" / "wd")
    marker = tmp_path / "powered-off"
    secret = new_secret()
    try:
        with receiving(secret) as receiver:
            notify, secrets = _node_notify(receiver.url, secret)
            config = node.config(autostop={"idle_s": 0.5, "down": False, "wait_for": "jobs"}, retry_s=0.5,
                                 action={"kind": "shutdown", "effect": "stop"}, notify=notify,
                                 shutdown_command=marker_command(marker))
            node_tell.write_secrets(Paths(str(node.config_path)), {"notify": notify}, secrets)
            node.write(**config)
            node.run()
            wait_until(lambda: marker.exists(), what="the shutdown command")
            # Acted again after retry_s (the machine is still up): no second event.
            wait_until(lambda: sum(d == "stop" and "->" in t for d, t in decisions(node.log)) >= 2,
                       what="a second stop")
        (envelope,) = receiver.accepted()
        assert len(receiver.got) == 1 and envelope["type"] == "watchdog.stopped"
        assert envelope["data"]["reason"].startswith("autostop: idle") and envelope["data"]["cloud"] == "aws"
        log = decisions(node.log)
        told = next(i for i, (d, _) in enumerate(log) if d == "notify")
        acted = next(i for i, (d, t) in enumerate(log) if d == "stop" and "->" in t)
        assert told < acted  # sent before the machine goes down
        answer = node.watchdog("ensure", node.config(notify=notify, autostop=None, action=config["action"]))
        assert [e["id"] for e in answer["sent"]] == [envelope["id"]]  # ensure hands the sent-log to the CLI
    finally:
        node.close()


def test_only_webhooks_that_want_a_node_event_go_to_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", new_secret())
    targets = bind([NotifyTarget(webhook="https://a.example/x", secret="${HOOK_SECRET}", name="a"),
                    NotifyTarget(webhook="https://b.example/x", secret="${HOOK_SECRET}", on=["run.*"]),
                    NotifyTarget(webhook="https://c.example/x", secret="${MISSING_SECRET}", on=["watchdog.*"]),
                    NotifyTarget(webhook="https://d.example/x", secret="${HOOK_SECRET}", on=["deadline.reached"])],
                   "config")
    warned: list[str] = []
    found = node_targets(targets, warned.append)
    assert [(t.name, t.on) for t in found] == [
        ("a", ("watchdog.stopped", "watchdog.deleted", "deadline.reached", "run.preempted", "budget.warning")),
        ("webhook https://b.example/…", ("run.preempted",)),  # run.*: the node's preemption notice
        ("webhook https://d.example/…", ("deadline.reached",))]
    assert len(warned) == 1 and "MISSING_SECRET" in warned[0]
    assert all(t.secret not in repr(t) and t.secret not in json.dumps(t.entry()) for t in found)


def test_the_notice_tells_run_preempted_from_the_node_with_the_id_the_laptop_uses(
        metadata_server: Any, tmp_path: Path) -> None:
    """The cloud's interruption notice: the watchdog TERMs the jobs, then tells run.preempted itself
    (a closed laptop still hears), signed, with the id this machine gives the same preemption when it
    sees the node gone (notify/model.preemption_event_id): a receiver that dedupes by id hears it once."""
    secret = new_secret()
    root = tmp_path / "cluster"
    (root / "runtime").mkdir(parents=True)
    (root / "jobs").mkdir()
    (root / "runtime" / "runner.sh").write_bytes((paths.templates_dir() / "runner.sh").read_bytes())
    with receiving(secret) as receiver:
        notify, secrets = _node_notify(receiver.url, secret, on=("run.preempted",))
        cfg = {"cluster": "c1", "incarnation": "u-123", "instance_id": "i-1", "interruption": "aws",
               "metadata_url": metadata_server.url, "tick_s": 1, "notify": notify}
        config = root / "watchdog.json"
        config.write_text(json.dumps(cfg))
        node_tell.write_secrets(Paths(str(config)), {"notify": notify}, secrets)
        loop = Watchdog(str(config))
        loop.wake_in = 1.0
        loop.watch_for_notice(cfg)
        assert receiver.got == []  # no notice, nothing told
        metadata_server.interrupt("aws", None)
        loop.watch_for_notice(cfg)
        wait_until(lambda: receiver.accepted(), what="run.preempted from the node")
    (envelope,) = receiver.accepted()
    assert envelope["type"] == "run.preempted" and envelope["source"] == "node"
    assert envelope["id"] == preemption_event_id("c1", "u-123")
    assert envelope["data"]["cluster"] == "c1" and envelope["data"]["jobs"] == []
    assert envelope["data"]["reason"]  # what the notice said
    wait_until(lambda: (root / SENT_LOG).exists(), what="the sent-log")
    (entry,) = [json.loads(x) for x in (root / SENT_LOG).read_text().splitlines()]
    assert entry["id"] == envelope["id"] and entry["status"] == "delivered"


def test_the_node_warns_once_at_80_percent_of_its_budget_then_stops_at_the_limit(tmp_path: Path) -> None:
    """The budget's running time passes 80% while a job runs: budget.warning from the node, once
    (kept in its state across restarts), with the figures; at the limit the stop is told as usual."""
    node = NodeDir(tmp_path / "home" / ".cloudtrain" / "wd")
    marker = tmp_path / "powered-off"
    secret = new_secret()
    try:
        with receiving(secret) as receiver:
            notify, secrets = _node_notify(receiver.url, secret, on=("budget.warning", "watchdog.stopped"))
            node.start_job("long", "sleep 300")
            # 8.2 s of 10 s used on the laptop's bill: past 80% at once, the limit 1.8 s later.
            config = node.config(budget={"limit_s": 10.0, "used_s": 8.2, "epoch": "e1", "why": "max_usd $1"},
                                 action={"kind": "shutdown", "effect": "stop"}, notify=notify,
                                 shutdown_command=marker_command(marker))
            node_tell.write_secrets(Paths(str(node.config_path)), {"notify": notify}, secrets)
            node.write(**config)
            node.run()
            wait_until(lambda: marker.exists(), what="the budget stop")
            wait_until(lambda: len(receiver.accepted()) >= 2, what="the warning and the stop told")
        warning, stopped = sorted(receiver.accepted(), key=lambda e: e["timestamp"])
        assert (warning["type"], stopped["type"]) == ("budget.warning", "watchdog.stopped"), receiver.accepted()
        assert warning["data"]["limit_s"] == 10 and 8 <= warning["data"]["used_s"] < 10
        assert "of 10s" in warning["data"]["reason"] and "max_usd $1" in warning["data"]["reason"]
        assert json.loads((node.root / "watchdog.state.json").read_text())["warned"] is True
    finally:
        node.close()


def test_a_preemption_has_one_id_per_incarnation() -> None:
    # One rule (cloudtrain/node/protocol.py), imported by the laptop (notify/model.py) and the node.
    first = preemption_event_id("c1", "u-1")
    assert first == preemption_event_id("c1", "u-1") and first.startswith("msg_") and len(first) == 28
    assert first != preemption_event_id("c1", "u-2") and first != preemption_event_id("c2", "u-1")


def _sent(status: str, target: str = "config:#abcdef0123456789") -> dict[str, Any]:
    event_id, body = node_tell.node_event({"cluster": "c1", "instance_id": "i-1", "notify": {"cloud": "aws"}},
                                   "watchdog.stopped", "autostop: idle")
    return {"id": event_id, "type": "watchdog.stopped", "target": target, "name": "ci hook", "status": status,
            "attempts": 1, "at": time.time(), "body": body}


def test_reconciled_events_are_delivered_by_the_node_kept_once_and_never_sent_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    delivered, failed = _sent("delivered"), _sent("failed")
    assert reconcile(store, [delivered, failed, {"body": "torn"}]) == 2
    assert reconcile(store, [delivered, failed]) == 0  # read again: nothing new
    rows = {row.id: row for row in outbox.events(store)}
    assert set(rows) == {delivered["id"], failed["id"]}
    row = rows[delivered["id"]]
    assert row.source == "node" and row.body == delivered["body"] and row.cluster == "c1"
    assert [(d.label, d.state) for d in row.deliveries] == [("ci hook", "delivered")]
    # Not delivered by the node: this machine's outbox sends it (the same id) when the target is here.
    assert [(d.label, d.state) for d in rows[failed["id"]].deliveries] == [("ci hook", "pending")]
    claims = outbox.claim(store)
    assert [c.event_id for c in claims] == [failed["id"]]
