"""The SSH transports of this process by cluster: what an attempt's stop token (run/stop.py, set by
the cloud watcher of a recovering run or of a sweep, run/recover_watch.py) tells to give up when the
cloud says a cluster's machines are gone, and `logs -f` when the run it follows recorded its
attempt's node gone (run/recover_logs.py). Giving up is how a stop reaches a thread that is inside
a command or a reconnect loop: it fails there, in its own thread, and nothing is injected into it.

Some of them are not anyone's to hand over yet: a connect to a machine still booting waits in its
retry loop (up to `ssh.connect_retries_s`, 5 minutes by default) inside `cluster.nodes.connect`,
before the run holds any node. A spot machine taken back during its boot would be waited for that
long; found here, its connect ends at once and the next attempt starts.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class GivesUp(Protocol):
    cluster: str

    def give_up(self) -> None: ...

    def close(self) -> None: ...


_lock = threading.Lock()
_transports: weakref.WeakSet[GivesUp] = weakref.WeakSet()  # a closed, dropped transport leaves by itself


def track(transport: GivesUp) -> None:
    with _lock:
        _transports.add(transport)


def give_up_cluster(cluster: str, *, close: bool = False) -> int:
    """Every transport of `cluster` in this process gives up (remote/ssh.py SSHTransport.give_up):
    a connect in progress ends after its current attempt; with `close`, a connection still open
    closes too (a read on it fails now instead of waiting on a machine that is gone). Returns how
    many there were."""
    with _lock:
        found = [t for t in _transports if t.cluster == cluster]
    for transport in found:
        transport.give_up()
        if close:
            transport.close()
    return len(found)
