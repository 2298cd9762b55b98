"""A webhook receiver on loopback for the tests: records every delivery, checks its signature with
the Standard Webhooks package (an independent verifier), and answers what the test asks."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks import Webhook


@dataclass
class Delivery:
    headers: dict[str, str]
    body: str
    verified: dict[str, Any] | None  # the envelope, when the signature checked out
    answered: int


@dataclass
class Receiver:
    secret: str
    port: int
    fail_first: int = 0  # answer 500 to this many deliveries first
    got: list[Delivery] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def accepted(self) -> list[dict[str, Any]]:
        return [d.verified for d in self.got if d.verified is not None and d.answered == 204]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def receiving(secret: str, port: int | None = None, fail_first: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(secret, port or free_port(), fail_first)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"])).decode()
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                verified = Webhook(secret).verify(body, headers)
            except Exception:  # noqa: BLE001 - recorded as not verified; the test asserts on it
                verified = None
            with lock:
                code = 500 if len(receiver.got) < receiver.fail_first else (204 if verified is not None else 401)
                receiver.got.append(Delivery(headers, body, verified, code))
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", receiver.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def envelope_types(receiver: Receiver) -> list[str]:
    return [json.loads(d.body)["type"] for d in receiver.got if d.answered == 204]
