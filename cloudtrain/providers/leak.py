"""What `gc` finds: a leak and its priced items. Here, below cluster/gc.py that finds and removes
them, because a scheduler's provider (Slurm's queued jobs) reports its own leaks in the same record."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cloudtrain.remote.jobs import NodeLayout
    from cloudtrain.remote.transport import Transport


@dataclass(frozen=True)
class Item:
    """One leaked thing and what it costs per hour while it exists."""

    # "instance", "key-pair", "security-group", "firewall", "resource-group", "volume", "disk", "public-ip"
    kind: str
    id: str
    region: str | None
    detail: str  # what it is: "t3.medium running, on-demand", "stopped: 8 GB of disks"
    hourly_usd: float | None  # None: price unknown
    price: str  # where the price comes from, or why there is none


@dataclass(frozen=True)
class Leak:
    cloud: str
    cluster: str
    kind: str  # "instance" | "resources"
    ids: tuple[str, ...]
    reason: str
    items: tuple[Item, ...] = field(default=())
    # A run driven from an SSH host (docs/driver.md) whose cluster lives in that host's state, not
    # this machine's: "run RUN, driven from HOST". `collect` leaves it alone unless asked.
    driven_by: str | None = None
    driven_run: str | None = None
    # The freshest liveness mark of its machines (cluster/liveness.py) and whether it is fresh: a
    # cloudtrain process elsewhere (another state of the same owner) is doing their work.
    alive_at: float | None = None
    live: bool = False
    evidence: str = ""

    @property
    def hourly_usd(self) -> float | None:
        """The sum of its items' prices; None when any of them is unknown."""
        prices = [item.hourly_usd for item in self.items]
        return None if any(p is None for p in prices) else sum(p for p in prices if p is not None)


class LoginNode(Protocol):
    """A scheduler's login node, connected by the caller (cluster/nodes.Node is one): providers
    never open SSH nor read state, so a scheduler's leaks are listed and cancelled through these."""

    transport: Transport
    layout: NodeLayout

    @property
    def address(self) -> str: ...


# Opens the login node of a cluster in state and closes it on leaving; None where that cluster is no
# longer in state or has no node (cluster/gc.py passes one to a scheduler's leaked_jobs/cancel_leaked).
OpenLogin = Callable[[str], AbstractContextManager["LoginNode | None"]]
