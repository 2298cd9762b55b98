"""Reconcile: the one step that turns what was observed about a cluster's machines into state.

Every path that learns something about machines (a create call's answer, describe or a listing by
tag, a stop/start/terminate that returned, a run finding its cluster stopped by the watchdog, gc)
builds `Observation`s and calls `reconcile`, a pure function: the cluster's record, its node rows
and its open billed intervals before, plus the observations, give the `Transition` (node rows,
status, billing opens/closes with their times, events). `StateStore.apply` writes a Transition in
one transaction. Nothing else writes node states or billed intervals.

Billing follows observations, never a verb's intent: a node bills compute while it is pending,
running or stopping (an Azure VM stopped from inside stays allocated and billed: the provider says
STOPPING for it) and its disks while it exists. Each interval carries the time the state began, from
the best source there is: the cloud's own transition time, a verb's answer, else the time we
looked (an upper bound, marked as such). Every time the ledger gets is a whole second (see `_second`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from cloudtrain.providers.base import Instance, InstanceState
from cloudtrain.state.records import BillingRecord, BillKind, ClusterRecord, ClusterStatus, NodeRecord

# Billed compute: the machine holds its hardware.
COMPUTE_STATES = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING})
_VERB_OWNED = frozenset({ClusterStatus.LAUNCH_FAILED, ClusterStatus.DOWN_FAILED})


class Source(StrEnum):
    """Where an observation's time comes from, best first."""

    CLOUD = "cloud"  # the cloud's own transition timestamp (EC2 reason/launch time, GCE last*Timestamp, ...)
    VERB = "verb"  # our call that made the change returned (create, stop, start, terminate)
    WATCHDOG = "watchdog"  # the node's watchdog logged the action itself
    LOOKED = "looked"  # only when we looked: the change happened at or before this time
    # Nothing was seen: a machine whose create answer was lost and that the cloud no longer
    # reports, booked at its worst case, from the launch intent to its deadline (see `_estimate`).
    ESTIMATE = "estimate"


@dataclass(frozen=True)
class Observation:
    instance: Instance
    at: float  # when the instance entered instance.state (see source)
    source: Source
    # Our own clock's bound on the change (our call's answer, else when we looked) and its source:
    # what `at` falls back to where reconcile finds the cloud's time stale (see `_stale_start`).
    # None: no bound known (reconcile's own time, an upper bound, is used).
    fallback_at: float | None = None
    fallback_source: Source = Source.LOOKED


@dataclass(frozen=True)
class Pricing:
    """What one node costs, per hour, in each billed kind; the cloud's minimum per start."""

    running: float
    disk: float  # one node's disks of the default size
    min_s: float
    priced: bool = True  # False: machines nobody bills (this computer, the user's own hosts)
    disk_per_gb: float = 0.0  # per GB-hour, for nodes whose disk size the provider reports

    def disk_hourly(self, disk_gb: float | None) -> float:
        return self.disk_per_gb * disk_gb if disk_gb and self.disk_per_gb else self.disk


@dataclass(frozen=True)
class BillingOp:
    """Open an interval at `at`, close the open one at `at`, or (amend) correct the open one's
    price from a better observation (the disks' real size, known only once the cloud lists it)."""

    open: bool  # True: open (or, with amend, correct) an interval; False: close the open one at `at`
    instance_id: str
    kind: BillKind
    at: float
    hourly_price: float = 0.0
    min_s: float = 0.0
    source: Source = Source.LOOKED
    amend: bool = False


@dataclass(frozen=True)
class Transition:
    nodes: tuple[NodeRecord, ...]
    status: ClusterStatus
    billing: tuple[BillingOp, ...]
    events: tuple[tuple[str, str], ...]  # (kind, message)

    @property
    def live(self) -> tuple[NodeRecord, ...]:
        return tuple(n for n in self.nodes if n.state != InstanceState.TERMINATED.value)


def observe(instance: Instance, looked_at: float, verb_at: float | None = None) -> Observation:
    """An observation with its best time: the earliest of the cloud's own transition time (for this
    state, where the provider reports one) and our own bound on the change, which is when our call
    that made it was answered (`verb_at`), else when we looked (an upper bound).

    With a call of ours, the cloud's time is either that call's own change, to the cloud's whole
    second (at or a little before our answer), or a change the cloud made before we called: the
    watchdog stopped the machine an hour before `stop`, a deadline deleted it before `down`. Either
    way the cloud's time is when billing changed; our answer would bill the machine until our
    command. A cloud time after our bound is a cloud clock ahead of ours: the bound wins, so that
    no change lands in the future."""
    since = instance.state_since
    if verb_at is not None:
        if since is not None and since < verb_at:
            return Observation(instance, since, Source.CLOUD, verb_at, Source.VERB)
        return Observation(instance, verb_at, Source.VERB, verb_at, Source.VERB)
    if since is not None:
        return Observation(instance, min(since, looked_at), Source.CLOUD, looked_at, Source.LOOKED)
    return Observation(instance, looked_at, Source.LOOKED, looked_at, Source.LOOKED)


def _second(t: float) -> float:
    """A ledger time, truncated to its whole second. EC2 reports its transition times truncated to
    the second (LaunchTime, StateTransitionReason) and bills in whole seconds; our own clock and
    GCE's/Azure's times have fractions. An interval from one truncated second to another is off
    from the machine's true life by less than a second either way; mixing ends (opened at our
    answer, a fraction after the launch, and closed at the cloud's truncated second) made short
    VMs read up to a couple of seconds short every time."""
    return float(math.floor(t))


def _stale_start(obs: Observation, before: NodeRecord | None) -> bool:
    """The cloud's start time of a machine we saw stopped is not after the start we already knew
    of (`started_at`): it is that old start, not this one. EC2 sets LaunchTime at every start;
    moto keeps the first launch's, which would bill the stopped hours again."""
    return (before is not None and before.state == InstanceState.STOPPED.value and before.started_at is not None
            and obs.source is Source.CLOUD and obs.instance.state in COMPUTE_STATES
            and obs.at <= before.started_at)


def _merged(old: NodeRecord, inst: Instance) -> NodeRecord:
    """A node row updated with what the provider says now; what it does not say (an existing host
    has no API to ask) is kept."""
    return replace(old, state=inst.state.value, public_ip=inst.public_ip or old.public_ip,
                   private_ip=inst.private_ip or old.private_ip, ssh_user=old.ssh_user or inst.ssh_user,
                   started_at=old.started_at or inst.launched_at)


def _new_node(cluster: str, rank: int, inst: Instance) -> NodeRecord:
    return NodeRecord(cluster=cluster, rank=rank, instance_id=inst.id, state=inst.state.value,
                      public_ip=inst.public_ip, private_ip=inst.private_ip, ssh_user=inst.ssh_user,
                      ssh_port=inst.ssh_port, ssh_key=None, proxy_command=None, started_at=inst.launched_at)


def _wanted(instance: Instance) -> set[BillKind] | None:
    """The billed kinds a node in its state has open; None: not known (leave the ledger as it is)."""
    state = instance.state
    if instance.compute_billed is not None and state not in (InstanceState.TERMINATED, InstanceState.UNKNOWN):
        return {BillKind.RUNNING, BillKind.DISK} if instance.compute_billed else {BillKind.DISK}
    if state in COMPUTE_STATES:
        return {BillKind.RUNNING, BillKind.DISK}
    if state is InstanceState.STOPPED:
        return {BillKind.DISK}
    if state is InstanceState.TERMINATED:
        return set()
    return None


def _billing_ops(obs: Observation, open_now: Mapping[BillKind, BillingRecord], pricing: Pricing,
                 launched_at: float | None, first_sighting: bool = False) -> list[BillingOp]:
    wanted = _wanted(obs.instance)
    if wanted is None or not pricing.priced:
        return []
    ops: list[BillingOp] = []
    inst_id = obs.instance.id
    # Whole seconds, both ends of every interval alike (see _second).
    seen_at = _second(obs.at)
    launched_at = _second(launched_at) if launched_at is not None else None
    if first_sighting and launched_at is not None and launched_at <= seen_at and BillKind.RUNNING not in wanted:
        # Seen for the first time already stopped or deleted (a create whose answer was lost, then
        # stopped, or terminated by the failed launch's cleanup): it ran from its launch until its
        # stop. Closed intervals, so the bill has them (each start costs the cloud's minimum, even
        # one ended within the second it was launched in: EC2's times are whole seconds).
        history = [BillKind.RUNNING] + ([BillKind.DISK] if BillKind.DISK not in wanted else [])
        for kind in history:
            price = pricing.running if kind is BillKind.RUNNING else pricing.disk_hourly(obs.instance.disk_gb)
            ops.append(BillingOp(True, inst_id, kind, launched_at, price,
                                 pricing.min_s if kind is BillKind.RUNNING else 0.0, Source.CLOUD))
            ops.append(BillingOp(False, inst_id, kind, seen_at, source=obs.source))
    for kind, interval in open_now.items():
        # A legacy "stopped" interval is the v4 disk: it closes when the disks stop being "stopped".
        still = kind in wanted or (kind is BillKind.STOPPED and obs.instance.state is InstanceState.STOPPED)
        if not still:
            ops.append(BillingOp(False, inst_id, kind, max(seen_at, interval.started_at), source=obs.source))
    disk = open_now.get(BillKind.DISK)
    if disk is not None and BillKind.DISK in wanted and obs.instance.disk_gb:
        real = pricing.disk_hourly(obs.instance.disk_gb)
        if abs(real - disk.hourly_price) > 1e-12:
            ops.append(BillingOp(True, inst_id, BillKind.DISK, disk.started_at, real, 0.0, obs.source, amend=True))
    has_disk = BillKind.DISK in open_now or (BillKind.STOPPED in open_now
                                             and obs.instance.state is InstanceState.STOPPED)
    for kind in sorted(wanted - set(open_now)):
        if kind is BillKind.DISK and has_disk:
            continue
        at = seen_at
        if kind is BillKind.DISK and launched_at is not None and not open_now:
            # Found running with nothing open (adopted after a crash): its disks exist since launch.
            at = min(at, launched_at)
        if (kind is BillKind.RUNNING and first_sighting and launched_at is not None
                and obs.source is Source.LOOKED):
            # First seen running with no time for its state: it has run since its launch at most.
            at = min(at, launched_at)
        price = pricing.running if kind is BillKind.RUNNING else pricing.disk_hourly(obs.instance.disk_gb)
        ops.append(BillingOp(True, inst_id, kind, at, price, pricing.min_s if kind is BillKind.RUNNING else 0.0,
                             obs.source))
    return ops


# How long after an abandoned intent's last sign of life an empty listing is believed: a machine
# whose create was accepted is listed within seconds (EC2's describe is eventually consistent).
# CLOUDTRAIN_LISTING_SETTLE_S overrides it (the test kit's fakes list at once).
LISTING_SETTLE_S = 120.0


def _estimate(record: ClusterRecord, pricing: Pricing, at: float, settle_s: float,
              final: bool) -> tuple[list[BillingOp], str] | None:
    """An abandoned launch intent (its creating process died before hearing the create's answer)
    whose machines the cloud does not report, live or ended (GCE and ARM forget a deleted VM at
    once; EC2 after about an hour). Not listed now, each node it asked for ran at most from the
    intent until now or its deadline, whichever came first: booked so, closed, marked as an
    estimate (the bill may have it; never $0). Without a deadline nothing bounds it: nothing is
    booked (a machine without one would still run, and be listed). None: too early to believe the
    listing (`final`: the caller forgets the cluster now; this is the last look)."""
    if not final and at < max(record.created_at, record.heartbeat_at or 0.0) + settle_s:
        return None
    if record.deadline_at is None or not pricing.priced:
        return [], "no machine of this launch is reported by the cloud and it had no deadline: nothing booked"
    ops: list[BillingOp] = []
    start = _second(record.created_at)
    end = max(start, _second(min(record.deadline_at, at)))
    for rank in range(max(1, record.num_nodes)):
        machine = f"estimate:{record.uid}:{rank}"
        for kind, price, min_s in ((BillKind.RUNNING, pricing.running, pricing.min_s),
                                   (BillKind.DISK, pricing.disk, 0.0)):
            if price <= 0:
                continue
            ops.append(BillingOp(True, machine, kind, start, price, min_s, Source.ESTIMATE))
            ops.append(BillingOp(False, machine, kind, end, source=Source.ESTIMATE))
    return ops, ("no machine of this launch is reported by the cloud: booked from the launch until its deadline "
                 "or now, whichever came first, as an estimate")


def _status(record: ClusterRecord, live: Sequence[NodeRecord], launch_done: bool,
            settled: bool = False) -> ClusterStatus:
    current = ClusterStatus(record.status)
    if current in _VERB_OWNED and live:
        return current  # `down` (or gc) has to finish what a failed verb left; the nodes say nothing of that
    if not live:
        if current is ClusterStatus.PROVISIONING and not launch_done and not settled:
            return current  # the create may still be in flight: nothing to see yet
        return ClusterStatus.TERMINATED
    states = {InstanceState(n.state) for n in live}
    if states == {InstanceState.STOPPED}:
        return ClusterStatus.STOPPED
    if states == {InstanceState.RUNNING} and (launch_done or current is not ClusterStatus.PROVISIONING):
        return ClusterStatus.UP
    return current


def reconcile(record: ClusterRecord, nodes: Sequence[NodeRecord], open_billing: Sequence[BillingRecord],
              observations: Sequence[Observation], pricing: Pricing, *, complete: bool,
              launch_done: bool = False, abandoned: bool = False, final: bool = False, at: float,
              settle_s: float = LISTING_SETTLE_S) -> Transition:
    """The transition that `observations` make of the cluster's state.

    complete     the observations cover every machine of the cluster (describe + listing by tag):
                 a node row that none of them mentions is gone (terminated at `at`, an upper bound).
                 False: only the observed nodes change (a verb that acted on some).
    launch_done  the creating process saw its create answered and its nodes running: PROVISIONING may end.
    abandoned    PROVISIONING, and the creating process is gone without hearing its create's answer
                 (`complete` observations, ended machines included where the cloud still lists them):
                 what the cloud reports of it is all there will be. Machines seen, all ended: the
                 intent is settled. None seen: booked at its worst case (`_estimate`).
    final        the caller forgets the cluster after this (down): the last chance to book it.
    """
    by_id: dict[str, Observation] = {}
    events: list[tuple[str, str]] = []
    known_ids = {n.instance_id for n in nodes}
    for o in observations:
        if (o.instance.incarnation not in (None, record.uid) and o.instance.id not in known_ids
                and not any(b.instance_id == o.instance.id for b in open_billing)):
            # Carries the name but was launched by an earlier incarnation (a `down` that failed):
            # not this cluster's to adopt or bill; `gc` and `down` deal with it.
            events.append(("foreign", f"{o.instance.id} belongs to incarnation {o.instance.incarnation}"))
            continue
        by_id[o.instance.id] = o
    if complete:
        for node in nodes:
            if node.instance_id not in by_id and node.state != InstanceState.TERMINATED.value:
                gone = Instance(id=node.instance_id, cluster=record.name, state=InstanceState.TERMINATED)
                by_id[node.instance_id] = Observation(gone, at, Source.LOOKED)
    open_by_node: dict[str, dict[BillKind, BillingRecord]] = {}
    for interval in open_billing:
        if interval.ended_at is None:
            open_by_node.setdefault(interval.instance_id, {})[BillKind(interval.kind)] = interval
    if complete:
        # Open intervals of machines no row or observation knows (a row lost to a crash) end too.
        for instance_id in open_by_node:
            if instance_id not in by_id:
                gone = Instance(id=instance_id, cluster=record.name, state=InstanceState.TERMINATED)
                by_id[instance_id] = Observation(gone, at, Source.LOOKED)

    known = {n.instance_id: n for n in nodes}
    updated = [_merged(n, by_id[n.instance_id].instance) if n.instance_id in by_id else n for n in nodes]
    # New nodes take ranks in the order observed (a create call answers in launch order).
    found = [i for i, o in by_id.items() if i not in known and o.instance.state is not InstanceState.TERMINATED]
    for offset, instance_id in enumerate(found):
        updated.append(_new_node(record.name, len(nodes) + offset, by_id[instance_id].instance))
        events.append(("adopt", f"found {instance_id} ({by_id[instance_id].instance.state.value}) by its tags"))

    ops: list[BillingOp] = []
    for instance_id, obs in sorted(by_id.items()):
        before = known.get(instance_id)
        if _stale_start(obs, before):
            obs = replace(obs, at=obs.fallback_at if obs.fallback_at is not None else at,
                          source=obs.fallback_source)
        if before is not None and before.state != obs.instance.state.value:
            events.append(("observed", f"{instance_id}: {before.state} -> {obs.instance.state.value} "
                                       f"({obs.source.value} time)"))
        ops += _billing_ops(obs, open_by_node.get(instance_id, {}), pricing, obs.instance.launched_at,
                            first_sighting=before is None and instance_id not in open_by_node)

    live = [n for n in updated if n.state != InstanceState.TERMINATED.value]
    settled = False
    if abandoned and complete and not live:
        if by_id or nodes or open_billing:
            settled = True  # it was seen (now or before): its ledger is what was observed
        else:
            estimate = _estimate(record, pricing, at, settle_s, final)
            if estimate is not None:
                ops += estimate[0]
                settled = True
                events.append(("estimate", estimate[1]))
    # Terminated rows stay (they keep their rank, so rank 0 stays the head); they bill nothing.
    return Transition(tuple(updated), _status(record, live, launch_done, settled), tuple(ops), tuple(events))
