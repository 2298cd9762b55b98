"""The real CLI on the `local` cloud with receivers on loopback: a run that succeeds and one that
fails each deliver one signed event; a receiver down for a whole run costs the run under 2 s and
gets the events from the next command; e-mail through Apprise to an SMTP server; bad input is one
line, exit 2; no secret in output, run.json, state or `events`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cloudtrain.notify.signing import new_secret
from cloudtrain.testing.wait import wait_until
from tests.conftest import cloudtrain
from tests.notify.receiver import free_port, receiving


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = new_secret()
    monkeypatch.setenv("HOOK_SECRET", value)
    return value


def recipe(tmp_path: Path, run: str, url: str | None, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    text = f"name: {name}\nresources:\n  cloud: local\nrun: {run}\n"
    if url is not None:
        text += f"notify:\n  - webhook: {url}\n    secret: ${{HOOK_SECRET}}\n"
    path.write_text(text)
    return path


def run(tmp_path: Path, path: Path):  # noqa: ANN201
    return cloudtrain("run", str(path), "--runs-dir", str(tmp_path / "runs"), "-q", cwd=tmp_path, timeout=120)


def no_secret_anywhere(secret: str, home: Path, tmp_path: Path, *texts: str) -> None:
    key = secret.removeprefix("whsec_")
    for text in texts:
        assert key not in text
    for path in [*home.glob("state.db*"), *(tmp_path / "runs").glob("*/run.json")]:
        assert key.encode() not in path.read_bytes(), path


def test_a_run_that_succeeds_and_one_that_fails_each_deliver_one_signed_event(
        tmp_path: Path, secret: str, cloudtrain_home: Path) -> None:
    with receiving(secret) as receiver:
        ok = run(tmp_path, recipe(tmp_path, "echo hello", receiver.url))
        assert ok.returncode == 0, ok.stderr
        failed = run(tmp_path, recipe(tmp_path, "exit 3", receiver.url))
        assert failed.returncode == 3, failed.stderr
    # The default `on:` is the run's end, not its start: one event each, each verified.
    first, second = receiver.accepted()
    assert len(receiver.got) == 2
    assert first["type"] == "run.succeeded" and first["data"]["status"] == "succeeded"
    assert first["data"]["cloud"] == "local" and first["data"]["cluster"] == "tiny"
    assert first["data"]["run_dir"] == ok.stdout.strip().splitlines()[-1]
    assert second["type"] == "run.failed" and second["data"]["exit_code"] == 3
    listed = cloudtrain("events", "--json", cwd=tmp_path)
    documents = [json.loads(line) for line in listed.stdout.splitlines()]
    ends = [d for d in documents if d["type"] in ("run.succeeded", "run.failed")]
    assert [d["id"] for d in ends] == [receiver.got[0].headers["webhook-id"], receiver.got[1].headers["webhook-id"]]
    assert all(d["deliveries"][0]["state"] == "delivered" for d in ends)
    assert {d["type"] for d in documents} == {"run.started", "run.succeeded", "run.failed"}  # the stream has all
    text = cloudtrain("events", cwd=tmp_path).stdout
    assert "run.failed" in text and "delivered" in text
    no_secret_anywhere(secret, cloudtrain_home, tmp_path, ok.stdout + ok.stderr, failed.stdout + failed.stderr,
                       listed.stdout, text)


def test_a_receiver_down_for_the_whole_run_costs_under_2_s_and_the_next_command_delivers(
        tmp_path: Path, secret: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    run(tmp_path, recipe(tmp_path, "echo warm", None, name="plain"))  # imports cached, state created
    started = time.monotonic()
    plain = run(tmp_path, recipe(tmp_path, "echo hello", None, name="plain"))
    plain_s = time.monotonic() - started
    started = time.monotonic()
    down = run(tmp_path, recipe(tmp_path, "echo hello", url))
    down_s = time.monotonic() - started
    assert plain.returncode == 0 and down.returncode == 0, down.stderr
    assert down_s - plain_s < 2.0, (down_s, plain_s)
    assert "notify: run.succeeded to webhook http://127.0.0.1" in down.stderr and "kept" in down.stderr
    pending = [json.loads(line) for line in cloudtrain("events", "--json", cwd=tmp_path).stdout.splitlines()]
    [missed] = [d for d in pending if d["deliveries"]]
    assert missed["deliveries"][0]["state"] == "pending"
    with receiving(secret, port=port) as receiver:
        later = cloudtrain("events", cwd=tmp_path)  # the next command, now that the receiver is up
    assert later.returncode == 0, later.stderr
    [got] = receiver.accepted()
    assert got["id"] == missed["id"] and got["type"] == "run.succeeded"
    assert "delivered" in later.stdout


def test_retry_sends_every_undelivered_event_now(tmp_path: Path, secret: str) -> None:
    port = free_port()
    assert run(tmp_path, recipe(tmp_path, "exit 1", f"http://127.0.0.1:{port}/hook")).returncode == 1
    with receiving(secret, port=port) as receiver:
        retried = cloudtrain("events", "--retry", cwd=tmp_path)
    assert retried.returncode == 0 and "sent 1; 0 not delivered" in retried.stderr + retried.stdout
    assert [e["type"] for e in receiver.accepted()] == ["run.failed"]


def test_email_through_apprise_to_an_smtp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiosmtpd.controller import Controller

    class Inbox:
        def __init__(self) -> None:
            self.mails: list[bytes] = []

        async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, ANN201, N802
            self.mails.append(envelope.content)
            return "250 OK"

    inbox = Inbox()
    port = free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        monkeypatch.setenv("MAIL_URL", f"mailto://127.0.0.1:{port}?from=ct@example.com&to=me@example.com&mode=insecure")
        path = tmp_path / "mail.yaml"
        path.write_text("name: mail\nresources:\n  cloud: local\nrun: exit 4\nnotify:\n"
                        "  - apprise: ${MAIL_URL}\n    name: my inbox\n    on: [run.failed]\n")
        done = run(tmp_path, path)
        # Sent by the run within its budget or, on a machine too busy for that (Apprise's import
        # alone can take longer: the claim is released then), by a later command, which may in turn
        # run out of its budget: `events` until it says delivered.
        events = wait_until(lambda: (out := cloudtrain("events", cwd=tmp_path).stdout)
                            and "my inbox: delivered" in out and out, 120, "the mail delivered")
    finally:
        smtp.stop()
    assert done.returncode == 4, done.stderr
    # At least once (docs/notifications.md): on a machine busy enough that a send's reply misses its
    # timeout after the server took the mail, a later command sends the same event again.
    assert inbox.mails
    for mail in inbox.mails:
        assert b"Subject: cloudtrain run.failed" in mail and b"exit 4" in mail
    assert "my inbox: delivered" in events


def test_bad_notify_input_is_one_line_and_exit_2(tmp_path: Path, cloudtrain_home: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nresources:\n  cloud: local\nrun: 'true'\nnotify:\n  - webhook: https://e.com/h\n"
                    "    secret: ${S}\n    on: [run.finished]\n")
    done = run(tmp_path, path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}:8: notify.0.on: unknown event 'run.finished'")
    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("notify:\n  - apprise: not-a-url\n")
    done = run(tmp_path, recipe(tmp_path, "'true'", None))
    assert done.returncode == 2 and "notify.0.apprise: expected an Apprise URL" in done.stderr
    since = cloudtrain("events", "--since", "yesterday", cwd=tmp_path)
    assert since.returncode == 2 and since.stderr.count("\n") == 1 and "--since 'yesterday'" in since.stderr
