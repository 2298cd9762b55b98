"""Keeping a node's SSH connection within one process, and handing it to a mux at exit.

- Shared: a transport opened while another transport of this process is open on the same node
  uses that connection (a helper channel of its own): `run --down`'s teardown starts while the
  run's transport is still open.
- Parked: a closed transport leaves its connection (and idle node helper) for ssh.persist_s, for a
  later transport of this process.
- At exit, each node whose parked connection is still alive gets a mux (remote/mux.py, started
  detached; remote/muxlink.py says why at exit), unless `down` forgot the node meanwhile.
"""

from __future__ import annotations

import atexit
import json
import logging
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from cloudtrain.remote import muxlink
from cloudtrain.remote.muxlink import MuxSpec, available, mux_dir

if TYPE_CHECKING:
    from cloudtrain.remote.connection import Connection
    from cloudtrain.remote.helper import NodeHelper

log = logging.getLogger("cloudtrain.remote.ssh")


class _Shared:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.users = 1


_live: dict[MuxSpec, _Shared] = {}


def register(spec: MuxSpec, conn: Connection) -> None:
    """A transport of this process connected: others opened meanwhile share it (`run --down`'s
    teardown while the run's transport is still open), each with a helper channel of its own."""
    if spec.persist_s > 0 and spec.instance_id not in _forgotten:
        with _parked_lock:
            _live[spec] = _Shared(conn)


def share(spec: MuxSpec) -> Connection | None:
    with _parked_lock:
        entry = _live.get(spec)
        if entry is None or not entry.conn.alive():
            return None
        entry.users += 1
        return entry.conn


def release(spec: MuxSpec, conn: Connection) -> bool:
    """A transport is done with `conn`: True if another transport still uses it (keep it open)."""
    with _parked_lock:
        entry = _live.get(spec)
        if entry is None or entry.conn is not conn:
            return False
        entry.users -= 1
        if entry.users > 0:
            return True
        del _live[spec]
        return False


@dataclass
class _Parked:
    conn: Connection
    helper: NodeHelper | None
    spec: MuxSpec
    timer: threading.Timer
    since: float = 0.0  # monotonic


# A connection parked longer than this is asked for a sign of life before it is used again: the
# machine may have been stopped and started meanwhile (at the same address), and a request sent on
# its previous boot's connection would fail instead of connecting again.
_CONFIRM_AFTER_S = 2.0


_parked: dict[MuxSpec, _Parked] = {}
_forgotten: set[str] = set()
_parked_lock = threading.Lock()


def park(spec: MuxSpec, conn: Connection, helper: NodeHelper | None) -> bool:
    """Keep a closed transport's connection for a later one in this process, for spec.persist_s;
    at exit, a mux takes over. False: not kept (the caller closes it)."""
    if spec.persist_s <= 0 or spec.instance_id in _forgotten or not conn.alive():
        return False
    with _parked_lock:
        old = _parked.pop(spec, None)
        timer = threading.Timer(spec.persist_s, _expire, args=(spec, conn))
        timer.daemon = True
        _parked[spec] = _Parked(conn, helper, spec, timer, time.monotonic())
        if len(_parked) == 1:
            _register_exit()
    timer.start()
    if old is not None:
        _close(old)
    return True


def take_parked(spec: MuxSpec) -> tuple[Connection, NodeHelper | None] | None:
    with _parked_lock:
        entry = _parked.pop(spec, None)
    if entry is None:
        return None
    entry.timer.cancel()
    confirm = time.monotonic() - entry.since >= _CONFIRM_AFTER_S
    if not entry.conn.alive() or (confirm and not entry.conn.answers(min(5.0, spec.connect_timeout))):
        _close(entry)
        return None
    if entry.helper is not None and not entry.helper.alive:
        entry.helper = None
    register(spec, entry.conn)
    return entry.conn, entry.helper


def forget(instance_id: str) -> None:
    """The node is being taken down: no parked connection or mux for it from this process."""
    _forgotten.add(instance_id)
    with _parked_lock:
        for spec in [spec for spec in _live if spec.instance_id == instance_id]:
            del _live[spec]  # its users close it when they are done
        gone = [entry for spec, entry in _parked.items() if spec.instance_id == instance_id]
        for entry in gone:
            del _parked[entry.spec]
    for entry in gone:
        _close(entry)


def _expire(spec: MuxSpec, conn: Connection) -> None:
    with _parked_lock:
        entry = _parked.get(spec)
        if entry is None or entry.conn is not conn:
            return
        del _parked[spec]
    _close(entry)


def _close(entry: _Parked) -> None:
    entry.timer.cancel()
    if entry.helper is not None:
        entry.helper.discard()
    entry.conn.close()


_exit_registered = False


def _register_exit() -> None:
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    """Close what is parked; for each node still reachable a mux takes over (started detached)."""
    with _parked_lock:
        entries = list(_parked.values())
        _parked.clear()
    for entry in entries:
        handover = entry.conn.alive() and entry.spec.instance_id not in _forgotten
        _close(entry)
        if handover:
            try:
                spawn(entry.spec)
            except OSError as exc:
                log.debug("could not start a mux for %s: %s", entry.spec.address, exc)


def spawn(spec: MuxSpec) -> subprocess.Popen[bytes] | None:
    """Start a mux for `spec` in a session of its own; it logs in by itself. None: not possible."""
    if not available() or mux_dir() is None:
        return None
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain.remote.mux"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True, cwd="/")
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(asdict(spec)).encode())
        proc.stdin.close()
    except BrokenPipeError as exc:
        log.debug("the mux for %s ended at once: %s", spec.address, exc)
    return proc


def stop(instance_id: str, timeout: float = 10.0) -> int:
    """Stop every mux of the node (`down`, a forgotten host key) and wait until each has closed
    its connection. Returns how many answered."""
    forget(instance_id)
    directory = mux_dir(create=False)
    if directory is None:
        return 0
    stopped = 0
    for path in sorted(directory.glob(f"{muxlink.prefix(instance_id)}-*.sock")):
        sock = muxlink.connect(path, timeout)
        if sock is None:
            continue
        try:
            answer, _ = muxlink.ask(sock, "stop")
            stopped += bool(answer.get("ok"))
        except (OSError, EOFError, ValueError) as exc:
            log.debug("stopping mux %s: %s", path.name, exc)
        finally:
            sock.close()
    # Each mux answers once its SSH connection is closed and holds its lock until it exits; one
    # still logging in has no socket yet, and sees the forgotten pin within a second of its check.
    for lock in sorted(directory.glob(f"{muxlink.prefix(instance_id)}-*.lock")):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with muxlink.held_lock(lock) as free:
                if free:
                    break
            time.sleep(0.05)
    return stopped
