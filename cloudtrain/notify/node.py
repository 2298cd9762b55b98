"""The node's own events (docs/notifications.md, "From the node"): which targets the on-node
watchdog (cloudtrain/node/tell.py) is given, and recording what it sent.

Only `webhook:` targets that want a watchdog event go to the node, with the URL expanded and the
secret in a 0600 file of its own (never in the watchdog's config, a log or a command line); Apprise
targets stay on this machine (their URLs are credentials, and the node has no Apprise). What the
node sent comes back in its sent-log, read by the next command that talks to its watchdog, and is
recorded here as delivered by the node, so nothing sends it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.node.protocol import secret_file
from cloudtrain.notify.model import EventType
from cloudtrain.notify.targets import Bound, MissingVariable, expand

if TYPE_CHECKING:
    from cloudtrain.state import StateStore

# run.preempted: on the cloud's interruption notice, with the id this machine uses for the same
# preemption (model.preemption_event_id), so a closed laptop still hears and an open one adds no second.
# budget.warning: the cluster's running time passed 80% of its budget (max_hours / max_usd), told
# by the node while it happens (the laptop's run-end budget.warning is about the run's spend).
NODE_EVENTS = (EventType.WATCHDOG_STOPPED, EventType.WATCHDOG_DELETED, EventType.DEADLINE_REACHED,
               EventType.RUN_PREEMPTED, EventType.BUDGET_WARNING)


@dataclass(frozen=True)
class NodeTarget:
    name: str  # the target's label: what the node's log and the sent-log say
    ref: str  # the outbox's key of the target (TargetRef.key)
    url: str
    on: tuple[str, ...]
    secret: str = field(repr=False)

    @property
    def secret_file(self) -> str:
        return secret_file(self.ref.rsplit("#", 1)[-1])

    def entry(self) -> dict[str, Any]:
        """As the node's config has it: no secret, only the name of its file."""
        return {"name": self.name, "ref": self.ref, "url": self.url, "on": list(self.on),
                "secret_file": self.secret_file}


def node_targets(targets: Iterable[Bound], warn: Callable[[str], None] | None = None) -> list[NodeTarget]:
    """The webhook targets that want a node event, expanded now (the node has not this shell's
    environment). One whose ${VAR} is unset is left to this machine, with a warning."""
    found = []
    for bound in targets:
        target = bound.target
        wanted = tuple(str(t) for t in NODE_EVENTS if target.wants(t))
        if target.webhook is None or not wanted:
            continue
        try:
            url, secret = expand(target.webhook), expand(target.secret or "")
        except MissingVariable as exc:
            if warn is not None:
                warn(f"notify: {target.label()} is not given to the watchdog: {exc}")
            continue
        found.append(NodeTarget(target.label(), bound.ref.key(), url, wanted, secret))
    return found


def node_config(cloud: str, targets: list[NodeTarget]) -> dict[str, Any]:
    return {"cloud": cloud, "targets": [t.entry() for t in targets]}


def node_secrets(targets: list[NodeTarget]) -> dict[str, str]:
    """File name -> secret: what ensure writes 0600 beside the config (sent on its stdin)."""
    return {t.secret_file: t.secret for t in targets}


def reconcile(store: StateStore, sent: Iterable[Mapping[str, Any]]) -> int:
    """The node's sent-log into the outbox: each event once, with the node's body (the bytes it
    signed), delivered where the node delivered it, else pending for this machine (the same id).
    Returns how many entries were new to the outbox. Idempotent: a sent-log read twice changes nothing."""
    from cloudtrain.notify import outbox

    new = 0
    for entry in sent:
        try:
            envelope = json.loads(str(entry["body"]))
            event_id, kind, target = str(entry["id"]), str(envelope["type"]), str(entry["target"])
        except (KeyError, TypeError, ValueError):
            continue  # a torn or foreign line: nothing to record
        if envelope.get("id") != event_id or kind not in {str(t) for t in NODE_EVENTS}:
            continue
        new += outbox.record_node(store, event_id, kind, float(entry.get("at") or 0.0), envelope.get("data") or {},
                                  str(entry["body"]), target, str(entry.get("name") or "webhook"),
                                  delivered=entry.get("status") == "delivered")
    return new
