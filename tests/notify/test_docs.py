"""docs/notifications.md's receiver examples run as written and accept what cloudtrain sends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.notify import outbox, send
from cloudtrain.notify.hooks import EventType, emit
from cloudtrain.notify.model import Event
from cloudtrain.notify.signing import headers, new_secret, secret_key
from cloudtrain.notify.targets import NotifyTarget, bind
from cloudtrain.state import StateStore
from tests.conftest import default_sigint
from tests.notify.receiver import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_receiver_example_verifies_what_cloudtrain_sends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [receiver] = [b for b in blocks() if b.startswith("# receiver.py")]
    script = tmp_path / "receiver.py"
    script.write_text(receiver)
    secret, port = new_secret(), free_port()
    monkeypatch.setenv("HOOK_SECRET", secret)
    process = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "WEBHOOK_SECRET": secret,
                                                                   "PORT": str(port)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        store = StateStore(tmp_path / "state.db")
        target = bind([NotifyTarget(webhook=f"http://127.0.0.1:{port}/", secret="${HOOK_SECRET}")], "config")
        deadline = time.monotonic() + 20
        event = None
        while time.monotonic() < deadline:  # until the example listens
            send._TRIED.clear()
            event = emit(store, EventType.RUN_FAILED, {"run": "r1", "status": "failed"}, target)
            if any(d.state == "delivered" for row in outbox.events(store) if row.id == event.id for d in row.deliveries):
                break
            time.sleep(0.3)
        assert event is not None
        forged = Event(EventType.RUN_SUCCEEDED, {"run": "forged"})
        wrong = headers(secret_key(new_secret()), forged.id, int(time.time()), forged.body())
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", data=forged.body().encode(),
                                                          headers=wrong, method="POST"), timeout=5)
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert "run.failed r1 failed" in out.splitlines() and "forged" not in out


def test_the_standard_library_check_agrees() -> None:
    [snippet] = [b for b in blocks() if "def verified" in b]
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102 - the documentation's own code, as written
    secret = new_secret()
    event = Event(EventType.GC_LEAKS, {"cluster": "c"})
    signed = headers(secret_key(secret), event.id, int(time.time()), event.body())
    assert namespace["verified"](secret, signed, event.body().encode())
    assert not namespace["verified"](new_secret(), signed, event.body().encode())
