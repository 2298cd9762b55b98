"""What a sweep spent: the billed intervals in state, per cluster incarnation, as `cloudtrain cost` sums them.

Each VM of a sweep is a cluster `sw-<sweep>-<slot>` (a name no other sweep or cluster uses); every
incarnation of that name is this VM's (normally one: a slot is booted once). Its spend is
`cloudtrain.cost.spend` over `store.billing(name, incarnation=...)` for each incarnation: the same
rows and the same arithmetic (each start billed at least the cloud's minimum) as `cloudtrain cost`,
so the two never disagree. The scheduler's own account (core.py) is only the budget guard.

`gone_at` says when the ledger has a VM's last interval closed: the time the cloud says it went
(lifecycle's reconcile puts the cloud's own transition time there where the cloud reports one), or
None while something of it still bills. The backend reports that time in `VmGone`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cloudtrain.cost import spend
from cloudtrain.state.records import BillingRecord


class BillingSource(Protocol):
    """StateStore's reading of billed intervals (the simulation's ledger has the same)."""

    def billing(self, cluster: str | None = None, since: float = 0.0,
                incarnation: str | None = None) -> list[BillingRecord]: ...


def cluster_name(sweep_id: str, slot: int) -> str:
    return f"sw-{sweep_id}-{slot}"


@dataclass(frozen=True)
class IncarnationSpend:
    incarnation: str
    usd: float
    first: float  # its first interval's start
    last: float | None  # its last interval's end; None while it bills


@dataclass(frozen=True)
class VmSpend:
    vm: str
    cluster: str
    incarnations: tuple[IncarnationSpend, ...]

    @property
    def usd(self) -> float:
        return sum(i.usd for i in self.incarnations)

    @property
    def billing_now(self) -> bool:
        return any(i.last is None for i in self.incarnations)

    def as_json(self) -> dict[str, object]:
        return {"vm": self.vm, "cluster": self.cluster, "usd": round(self.usd, 6), "billing_now": self.billing_now,
                "incarnations": [{"incarnation": i.incarnation, "usd": round(i.usd, 6), "from": i.first,
                                  "until": i.last} for i in self.incarnations]}


@dataclass(frozen=True)
class SweepSpend:
    vms: tuple[VmSpend, ...]

    @property
    def usd(self) -> float:
        return sum(v.usd for v in self.vms)

    @property
    def billing_now(self) -> bool:
        return any(v.billing_now for v in self.vms)


def incarnations(store: BillingSource, cluster: str) -> list[str]:
    """The incarnations of `cluster` that were ever billed, oldest first."""
    seen: dict[str, None] = {}
    for interval in store.billing(cluster):
        seen.setdefault(_key(interval), None)
    return list(seen)


def vm_spend(store: BillingSource, sweep_id: str, vm: str, slot: int, now: float) -> VmSpend:
    name = cluster_name(sweep_id, slot)
    found = []
    for incarnation in incarnations(store, name):
        intervals = _of(store, name, incarnation)
        ends = [i.ended_at for i in intervals]
        found.append(IncarnationSpend(
            incarnation=incarnation, usd=spend(intervals, until=now).usd, first=min(i.started_at for i in intervals),
            last=None if None in ends else max(e for e in ends if e is not None)))
    return VmSpend(vm, name, tuple(found))


def sweep_spend(store: BillingSource, sweep_id: str, vms: Iterable[tuple[str, int]], now: float) -> SweepSpend:
    """`vms`: (VM id, slot) of every VM the sweep's journal knows."""
    return SweepSpend(tuple(vm_spend(store, sweep_id, vm, slot, now) for vm, slot in vms))


def gone_at(store: BillingSource, cluster: str) -> float | None:
    """When the last billed interval of `cluster` (every incarnation) ended; None while one is open,
    or when it was never billed (nothing in the ledger says when it went)."""
    intervals = store.billing(cluster)
    if not intervals or any(i.ended_at is None for i in intervals):
        return None
    return max(i.ended_at for i in intervals if i.ended_at is not None)


def _of(store: BillingSource, cluster: str, incarnation: str) -> Sequence[BillingRecord]:
    if incarnation.startswith(_LEGACY):
        # Rows written before incarnations existed: one pseudo-incarnation per row, as `cost` shows them.
        return [i for i in store.billing(cluster) if _key(i) == incarnation]
    return store.billing(cluster, incarnation=incarnation)


_LEGACY = "legacy-"


def _key(interval: BillingRecord) -> str:
    return interval.incarnation or f"{_LEGACY}{interval.id}"
