"""What was spent: the ledger's report, per cluster incarnation, per cluster name and per run.

Before it reports, `observe_billing` asks each cloud about every cluster still billing in state, so
that what the watchdog, the cloud or another terminal did since the last command is in the ledger
(through lifecycle's reconcile, like every other observation) and the report is the bill, not
what the last verb believed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.cost import spend
from cloudtrain.errors import CloudtrainError
from cloudtrain.state import BillingRecord, ClusterStatus, StateStore

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.cluster.lifecycle import Lifecycle

# reconcile.Source.ESTIMATE, by value: importing reconcile (and the providers it pulls in) was a
# tenth of `cost`'s cold start (tests/test_cost.py keeps the two equal).
ESTIMATE = "estimate"


def iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def observe_billing(store: StateStore, config: Callable[[], Config]) -> list[str]:
    """Reconcile every cluster that has an open billed interval with what its cloud reports now.
    Returns one line per cluster that could not be asked (its spend is then as last observed).
    `config` is loaded (and the lifecycle with its providers imported) only once a cluster needs
    asking: a ledger with nothing billing is reported without either (a third of `cost`'s time)."""
    billing_now = {b.incarnation for b in store.billing(since=time.time())}
    lc: Lifecycle | None = None
    problems = []
    # Besides clusters still billing: launches that died before their create was answered (their
    # machines may exist, unknown to the ledger) and cleanups that did not finish.
    unsettled = {ClusterStatus.PROVISIONING, ClusterStatus.LAUNCH_FAILED, ClusterStatus.DOWN_FAILED}
    # Whole rows (and state.locks) only for those: a ledger of 1,000 ended clusters asks nothing.
    for name, uid, status in store.cluster_states():
        if uid not in billing_now and status not in unsettled:
            continue
        from cloudtrain.state.locks import launch_in_flight

        record = store.get_cluster(name)
        if record is None or launch_in_flight(record):
            continue
        if lc is None:
            from cloudtrain.cluster.lifecycle import Lifecycle

            lc = Lifecycle(store, config())
        try:
            lc.refresh(record.name)
        except CloudtrainError as exc:
            problems.append(f"{record.name} ({record.provider}): could not ask the cloud: {exc.one_line()}")
    return problems


@dataclass(frozen=True)
class IncarnationSpend:
    cluster: str
    incarnation: str
    cloud: str
    status: str  # the cluster's status, or "down" for an incarnation that no longer exists
    usd: float
    node_hours: float
    billing_now: bool
    first: float
    last: float | None  # None: still billing
    # Of `usd`, what was booked as an estimate: machines of a launch whose answer was lost and that
    # the cloud no longer reports, at their worst case (reconcile.Source.ESTIMATE).
    estimated_usd: float = 0.0

    def as_json(self) -> dict:
        return {"cluster": self.cluster, "incarnation": self.incarnation, "cloud": self.cloud, "status": self.status,
                "usd": round(self.usd, 6), "estimated_usd": round(self.estimated_usd, 6),
                "node_hours": round(self.node_hours, 4), "billing_now": self.billing_now,
                "from": self.first, "from_iso": iso(self.first), "until": self.last, "until_iso": iso(self.last)}


def by_incarnation(store: StateStore, since: float, now: float) -> list[IncarnationSpend]:
    groups: dict[str, list[BillingRecord]] = {}
    for item in store.billing(since=since):
        groups.setdefault(item.incarnation or f"legacy-{item.id}", []).append(item)
    status = {uid: state for _, uid, state in store.cluster_states()}
    found = []
    for incarnation, items in groups.items():
        total = spend(items, since=since, until=now)
        estimates = [i for i in items if i.source == ESTIMATE]
        ends = [i.ended_at for i in items]
        found.append(IncarnationSpend(
            cluster=items[0].cluster, incarnation=incarnation, cloud=items[0].cloud,
            status=status.get(incarnation, "down"), usd=total.usd,
            node_hours=total.billed_s / 3600, billing_now=total.running, first=min(i.started_at for i in items),
            last=None if None in ends else max(e for e in ends if e is not None),
            estimated_usd=spend(estimates, since=since, until=now).usd if estimates else 0.0))
    return sorted(found, key=lambda s: (s.cluster, s.first))
