"""Each node's home directory, remembered from its helper's hello (ssh/homes.json in cloudtrain's home),
and other facts of a node a command may act on before the node confirms them (`remember`).

Every command's paths start at the node's home, and asking for it costs a round trip before the
first real request can go. With the home remembered, the first request goes with the helper's
start; each request carries the home it was built for and the helper refuses it (exit 125) if its
own differs, so a wrong guess fails cleanly and is corrected for the next command, never writes
elsewhere. Keyed by instance id and user (a pinned host key ties the id to one machine).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from cloudtrain import paths

log = logging.getLogger(__name__)


def _file() -> Path:
    return paths.home() / "ssh" / "homes.json"


def _key(instance_id: str, user: str) -> str:
    return f"{user}@{instance_id}"


def _read() -> dict[str, str]:
    try:
        data = json.loads(_file().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def get(instance_id: str, user: str) -> str | None:
    home = _read().get(_key(instance_id, user))
    return home if home and home.startswith("/") else None


def put(instance_id: str, user: str, home: str) -> None:
    """Remember (or correct) a node's home. Losing a concurrent writer's entry costs it one round trip."""
    _put_key(_key(instance_id, user), home)


def _put_key(key: str, value: str) -> None:
    data = _read()
    if data.get(key) == value:
        return
    data[key] = value
    target = _file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".homes.")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, target)
    except OSError as exc:  # a cache: the next command asks again
        log.debug("could not remember %s: %s", key, exc)


def remembered(instance_id: str, user: str, what: str) -> str | None:
    """A fact of the node remembered under `what` (run/prepare.py: that a cluster's runtime is ready,
    and with which python). A guess the node checks before anything acts on it."""
    return _read().get(f"{what}|{_key(instance_id, user)}")


def remember(instance_id: str, user: str, what: str, value: str) -> None:
    _put_key(f"{what}|{_key(instance_id, user)}", value)


def forget(instance_id: str, user: str) -> None:
    data = _read()
    if data.pop(_key(instance_id, user), None) is not None:
        try:
            _file().write_text(json.dumps(data))
        except OSError as exc:
            log.debug("could not forget the home of %s: %s", instance_id, exc)
