"""The notify package in-process: signatures checked by Standard Webhooks' own verifier, targets'
validation, the outbox's retries with the same id, the time budget, and no secret in state."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from cloudtrain.config import load_config
from cloudtrain.errors import ConfigError
from cloudtrain.notify import outbox, send
from cloudtrain.notify.hooks import EventType, emit
from cloudtrain.notify.model import Event, budget_type, line, run_end_type
from cloudtrain.notify.signing import headers, new_secret, secret_key
from cloudtrain.notify.targets import NotifyTarget, TargetRef, bind, expand
from cloudtrain.state import StateStore
from tests.notify.receiver import free_port, receiving

pytestmark = pytest.mark.quick


def _targets(url: str, secret: str = "${HOOK_SECRET}") -> list:
    """The target, written in this test's config.yaml (where a later command reads it again)."""
    from cloudtrain import paths

    path = paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"notify:\n  - webhook: {url}\n    secret: '{secret}'\n")
    return bind(load_config().notify, "config")


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = new_secret()
    monkeypatch.setenv("HOOK_SECRET", value)
    return value


@pytest.fixture(autouse=True)
def fresh_round() -> None:
    send._TRIED.clear()  # each test is its own command


def test_signature_verifies_with_the_standard_webhooks_package() -> None:
    secret = new_secret()
    event = Event(EventType.RUN_FAILED, {"run": "r1", "exit_code": 3})
    body = event.body()
    signed = headers(secret_key(secret), event.id, int(time.time()), body)
    assert Webhook(secret).verify(body, signed)["data"] == {"run": "r1", "exit_code": 3}
    # The same bytes as the package's own signer, and a tampered body fails.
    assert signed["webhook-signature"] == Webhook(secret).sign(event.id, _dt(int(signed["webhook-timestamp"])), body)
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(secret).verify(body.replace("r1", "r2"), signed)


def _dt(stamp: int):  # noqa: ANN202
    from datetime import datetime, timezone

    return datetime.fromtimestamp(stamp, tz=timezone.utc)


def test_envelope_is_versioned_and_typed() -> None:
    event = Event(EventType.RUN_SUCCEEDED, {"run": "r1", "cluster": "c", "cloud": "local", "cost_usd": 0.25})
    envelope = json.loads(event.body())
    assert envelope["version"] == 1 and envelope["type"] == "run.succeeded" and envelope["id"].startswith("msg_")
    assert envelope["timestamp"].endswith("Z") and envelope["source"] == "laptop"
    assert line("run.succeeded", envelope["data"]) == "cloudtrain run.succeeded r1 on c local ($0.25)"
    assert run_end_type("interrupted") == EventType.RUN_CANCELLED and run_end_type("failed") == EventType.RUN_FAILED
    assert budget_type(0.79, 1.0) is None and budget_type(0.8, 1.0) == EventType.BUDGET_WARNING
    assert budget_type(1.0, 1.0) == EventType.BUDGET_EXHAUSTED and budget_type(5.0, None) is None


def test_targets_validate_with_one_clear_problem_each(tmp_path: Path) -> None:
    def problem(**target: object) -> str:
        path = tmp_path / "config.yaml"
        path.write_text(json.dumps({"notify": [target]}))  # JSON is YAML
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert info.value.exit_code == 2 and len(info.value.one_line().splitlines()) == 1
        return info.value.one_line()

    assert "expected an http(s):// URL" in problem(webhook="ftp://x", secret="${S}")
    assert "webhook needs secret" in problem(webhook="https://example.com/h")
    assert "either webhook: URL" in problem(webhook="https://example.com/h", secret="${S}", apprise="slack://a/b/c")
    assert "did you mean 'run.failed'" in problem(webhook="https://example.com/h", secret="${S}", on=["run.faild"])
    leaked = problem(webhook="https://example.com/h", secret="whsec_c2hvcnQ=")
    assert "at least 16" in leaked and "c2hvcnQ" not in leaked  # a bad secret is never echoed
    # YAML reads a bare `on:` as true; it still means the events.
    target = NotifyTarget.model_validate({"webhook": "https://example.com/h", "secret": "${S}", True: ["run.*"]})
    assert target.wants("run.started") and not target.wants("gc.leaks")


def test_default_on_is_everything_but_a_start_and_groups_match() -> None:
    target = NotifyTarget(webhook="https://example.com/h", secret="${S}")
    assert target.wants(EventType.RUN_FAILED) and target.wants(EventType.WATCHDOG_STOPPED)
    assert not target.wants(EventType.RUN_STARTED)
    assert NotifyTarget(webhook="https://e.com/h", secret="${S}", on=["*"]).wants("run.started")


def test_labels_and_references_carry_no_secret() -> None:
    slack = NotifyTarget(webhook="https://hooks.slack.com/services/T0/B0/SECRETPATH", secret="${S}")
    assert slack.label() == "webhook https://hooks.slack.com/…"
    mail = NotifyTarget(apprise="mailtos://me:PASSWORD@example.com")
    assert mail.label() == "apprise mailtos://…"
    assert NotifyTarget(webhook="${HOOK_URL}", secret="${S}").label() == "webhook ${HOOK_URL}"
    ref = bind([slack], "recipe", Path("/r/x.yaml"))[0].ref
    assert TargetRef.parse(ref.key()) == ref and "SECRET" not in ref.key()


def test_expand_reads_the_environment_at_send_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A", "1")
    assert expand("x${A}y${B:-2}") == "x1y2"
    monkeypatch.delenv("A")
    with pytest.raises(LookupError, match=r"\$\{A\} is not set"):
        expand("${A}")


def test_500_twice_then_delivered_on_the_third_try_with_the_same_id(tmp_path: Path, secret: str) -> None:
    store = StateStore(tmp_path / "state.db")
    with receiving(secret, fail_first=2) as receiver:
        event = emit(store, EventType.RUN_FAILED, {"run": "r1", "exit_code": 2}, _targets(receiver.url))
    assert [d.answered for d in receiver.got] == [500, 500, 204]
    assert {d.headers["webhook-id"] for d in receiver.got} == {event.id}
    assert all(d.verified is not None for d in receiver.got)  # each attempt signed anew, all valid
    [row] = outbox.events(store)
    assert [(d.state, d.attempts) for d in row.deliveries] == [("delivered", 3)]


def test_a_receiver_that_never_answers_costs_about_the_budget(tmp_path: Path, secret: str) -> None:
    store = StateStore(tmp_path / "state.db")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        started = time.monotonic()
        emit(store, EventType.RUN_SUCCEEDED, {"run": "r1"}, _targets(url))
        assert time.monotonic() - started < send.BUDGET_S + 0.8
    [row] = outbox.events(store)
    assert row.deliveries[0].state == "pending"


def test_a_delivery_not_yet_on_the_wire_at_the_deadline_is_released_for_the_next_command(
        tmp_path: Path, secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender still getting ready when the command's budget ends (Apprise's import takes seconds
    on a busy machine) never sends: its claim is released, and the next command sends it at once,
    not after the lease (the run-end e-mail was lost for a minute under load)."""
    store = StateStore(tmp_path / "state.db")
    real = send._webhook

    def slow_to_get_ready(*args: Any) -> None:
        time.sleep(send.BUDGET_S + 0.3)  # past the command's deadline before anything is sent
        real(*args)

    with receiving(secret) as receiver:
        monkeypatch.setattr(send, "_webhook", slow_to_get_ready)
        event = emit(store, EventType.RUN_FAILED, {"run": "r1"}, _targets(receiver.url))
        time.sleep(0.5)  # the late thread reaches the gate, finds it closed and stops
        assert receiver.got == []
        [row] = outbox.events(store)
        assert row.deliveries[0].state == "pending"
        monkeypatch.setattr(send, "_webhook", real)
        send._TRIED.clear()  # the next command
        assert send.flush(store).delivered == 1
    assert [d.headers["webhook-id"] for d in receiver.got] == [event.id]


def test_a_receiver_down_gets_it_from_the_next_command(tmp_path: Path, secret: str) -> None:
    store = StateStore(tmp_path / "state.db")
    port = free_port()
    warned: list[str] = []
    event = emit(store, EventType.RUN_FAILED, {"run": "r1"}, _targets(f"http://127.0.0.1:{port}/hook"),
                 warn=warned.append)
    assert len(warned) == 1 and "Connection refused" in warned[0] and "kept" in warned[0]
    send._TRIED.clear()  # the next command
    with receiving(secret, port=port) as receiver:
        assert send.flush(store).delivered == 1
    assert [d.headers["webhook-id"] for d in receiver.got] == [event.id]


def test_a_missing_variable_is_kept_pending_and_named_not_leaked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path / "state.db")
    monkeypatch.delenv("HOOK_SECRET", raising=False)
    emit(store, EventType.RUN_FAILED, {"run": "r1"}, _targets("http://127.0.0.1:9/h"))
    [row] = outbox.events(store)
    assert row.deliveries[0].state == "pending"
    assert row.deliveries[0].last_error == "${HOOK_SECRET} is not set in this command's environment"


def test_a_target_no_longer_configured_is_given_up(tmp_path: Path, secret: str) -> None:
    store = StateStore(tmp_path / "state.db")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nrun: 'true'\nnotify:\n  - webhook: http://127.0.0.1:9/h\n    secret: ${HOOK_SECRET}\n")
    from cloudtrain.notify.targets import file_targets

    targets = bind(file_targets(recipe), "recipe", recipe)
    outbox.enqueue(store, Event(EventType.RUN_FAILED, {"run": "r1"}), targets)
    recipe.write_text("name: r\nrun: 'true'\n")
    send.flush(store)
    [row] = outbox.events(store)
    assert row.deliveries[0].state == "failed" and "no longer configured" in row.deliveries[0].last_error


def test_state_keeps_no_secret_and_old_state_files_migrate(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)  # a state file of the version before the outbox
    from cloudtrain.state.schema import _MIGRATIONS

    for script in _MIGRATIONS[:-1]:
        old.executescript(script)
    old.execute(f"PRAGMA user_version = {len(_MIGRATIONS) - 1}")
    old.execute("INSERT INTO events (ts, cluster, kind, message) VALUES (1, 'c', 'k', 'kept')")
    old.commit()
    old.close()
    store = StateStore(path)
    assert [e.message for e in store.list_events()] == ["kept"]
    url_secret = "PATHSECRET123"
    with receiving(secret) as receiver:
        emit(store, EventType.RUN_SUCCEEDED, {"run": "r1"}, _targets(receiver.url + "/" + url_secret, secret))
    assert receiver.accepted()
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("state.db*"))
    assert secret.encode() not in raw and secret[6:].encode() not in raw and url_secret.encode() not in raw


def test_two_commands_at_once_send_once(tmp_path: Path, secret: str) -> None:
    store = StateStore(tmp_path / "state.db")
    other = StateStore(tmp_path / "state.db")
    with receiving(secret) as receiver:
        outbox.enqueue(store, Event(EventType.GC_LEAKS, {"cluster": "c"}), _targets(receiver.url))
        results = []
        threads = [threading.Thread(target=lambda s=s: results.append(send.flush(s))) for s in (store, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(receiver.got) == 1 and sum(r.delivered for r in results) == 1


def test_gc_leaks_tells_the_same_leaks_once_a_day_and_new_ones_at_once(tmp_path: Path, secret: str) -> None:
    from cloudtrain.notify import hooks
    from cloudtrain.providers.leak import Leak

    store = StateStore(tmp_path / "state.db")
    one = Leak("aws", "old-run", "instance", ("i-1",), "not in this state")
    two = Leak("aws", "other", "instance", ("i-2",), "not in this state")
    with receiving(secret) as receiver:
        _targets(receiver.url)
        config = load_config()
        for _ in range(3):  # gc every hour, the same leak: told once
            hooks.gc_leaks(store, config, [one], 1.0, 0)
        hooks.gc_leaks(store, config, [two, one], 2.0, 0)  # a new leak: told at once
        told = [e for e in outbox.events(store) if e.type == "gc.leaks"]
        assert len(told) == 2
        # A day later the same two, still there, are told again.
        store._db.execute("UPDATE notify_events SET at = at - ?", (hooks.LEAKS_REMIND_S + 60,))
        hooks.gc_leaks(store, config, [one, two], 2.0, 0)
        assert len([e for e in outbox.events(store, since=0) if e.type == "gc.leaks"]) == 3
    assert len({d.headers["webhook-id"] for d in receiver.got if d.answered == 204}) == 3
