"""The fakes' HTTP servers run on a thread of the test process: one way to start and stop them."""

from __future__ import annotations

import threading
from typing import Any


def serve(server: Any, name: str) -> threading.Thread:
    """Serve `server` (a socketserver) on a daemon thread named `name`."""
    # A short poll interval: shutdown() waits for it (the default 0.5 s, per fixture).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
    thread.start()
    return thread


def stop_serving(server: Any | None, thread: threading.Thread | None) -> None:
    """Stop serving, close the listening socket and wait for the thread (bounded: a hung handler
    must not hang the test session)."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=10)
