"""Finding (and removing) what cloudtrain created but no longer tracks: leaked instances and
leftover per-cluster resources, found by their `cloudtrain-cluster` tag, not from local state.

State can be lost (a deleted $CLOUDTRAIN_HOME, another laptop, a crash between create and record);
the tags cannot. Only this user's resources are considered (providers filter by owner tag).
On a team database the state is the team's: a teammate's live cluster or launch in it is never a
leak, whatever its machines' owner tag says (state/team.py: teammates_live).

Each thing found carries an estimated hourly cost, from the same sources the rest of cloudtrain
prices with: a running instance at the catalog's price for its type and region (spot or on
demand), a stopped one at its disks' size x the storage price (catalog_data/storage/disks.csv),
a loose disk or volume likewise, a public IP address at the hourly price its provider reads from
catalog_data/storage/flat.csv, and key pairs, firewall rules, security groups and resource groups
(as containers) at nothing. What cannot be priced says so (`hourly_usd` None): a guess
would make a leak look cheaper than it is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.catalog import Catalog, default_catalog
from cloudtrain.config import Config
from cloudtrain.cost import disk_hourly, disk_price
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import (
    ClusterResource,
    CreatesMachines,
    Instance,
    InstanceState,
    Provider,
    Schedules,
    machines,
    supports,
)
from cloudtrain.providers.leak import Item, Leak, OpenLogin
from cloudtrain.state import ClusterRecord, StateStore
from cloudtrain.state.locks import launch_in_flight
from cloudtrain.cluster.liveness import evidence, is_live

if TYPE_CHECKING:
    from cloudtrain.cluster.nodes import Node

log = logging.getLogger("cloudtrain.gc")

# Billed by the hour as compute. STOPPING too: some clouds bill a machine that is powered off but
# still allocated, and a transient state is better over- than under-counted.
_COMPUTE_STATES = (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING)
# Kinds that cost nothing while they exist (a resource group is priced by what is listed in it).
FREE_KINDS = frozenset({"key-pair", "security-group", "firewall", "resource-group", "network"})
# Kinds billed per GB-month of storage.
DISK_KINDS = frozenset({"volume", "disk"})


def gc_clouds() -> tuple[str, ...]:
    """Clouds whose machines cloudtrain creates; hosts from a recipe are the user's, never collected.
    A scheduler's (Slurm) leaks are our queued jobs nothing follows (its provider's `leaked_jobs`)."""
    from cloudtrain.providers import available, implements

    return tuple(name for name in available() if implements(name, CreatesMachines) or implements(name, Schedules))


@dataclass(frozen=True)
class Skipped:
    cloud: str
    reason: str
    set_up: bool = True  # False: nothing configured for it here (no credentials at all)


@dataclass(frozen=True)
class Total:
    hourly_usd: float  # the sum of what is priced
    unknown: int  # items of unknown price, left out of the sum


def total(leaks: Sequence[Leak]) -> Total:
    items = [item for leak in leaks for item in leak.items]
    return Total(sum(i.hourly_usd for i in items if i.hourly_usd is not None),
                 sum(1 for i in items if i.hourly_usd is None))


def driven_clusters(runs_dir: Path) -> dict[str, tuple[str, str]]:
    """{cluster: (run id, driver host)} of the runs `run --driver` started from this machine that
    are not fetched home yet (`runs/<id>/driver.json` without its run.json): their clusters are
    tracked in the driver host's state, so this machine's state does not know them."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(runs_dir.glob("*/driver.json")):
        if (path.parent / "run.json").exists():
            continue  # fetched: the run has ended, and its cluster with it
        try:
            with path.open() as handle:
                data = json.loads(handle.read(65536))
            cluster, run_id, host = data["cluster"], data["run_id"], data["host"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("gc: %s unreadable (%s): its cluster, if any, is listed as not in state", path, exc)
            continue
        if isinstance(cluster, str) and cluster:
            found[cluster] = (str(run_id), str(host))
    return found


def find_leaks(store: StateStore, config: Config, clouds: Sequence[str] | None = None,
               catalog: Catalog | None = None, runs_dir: Path | None = None) -> tuple[list[Leak], list[Skipped]]:
    from cloudtrain.providers import traits
    from cloudtrain.state.team import teammates_live

    clouds = gc_clouds() if clouds is None else clouds
    catalog = catalog or default_catalog()
    leaks: list[Leak] = []
    skipped: list[Skipped] = []
    tracked = {c.name: c for c in store.list_clusters()}
    teammates = teammates_live(store)
    for cloud in clouds:
        try:
            provider = get_provider(cloud, config)
            creds = provider.check_credentials()
            if not creds.ok:
                skipped.append(Skipped(cloud, creds.detail, creds.set_up))
                continue
            pricer = Pricer(cloud, catalog, traits(cloud).priced)
            found = _instance_leaks(cloud, provider, store, tracked, pricer, teammates)
            leaks += found
            # A cluster whose machines are live elsewhere still uses its key pair, firewall, group.
            held = {leak.cluster: leak for leak in found if leak.live}
            if supports(provider, Schedules):
                mine = [c.name for c in store.list_clusters() if c.provider == cloud]
                leaks += provider.leaked_jobs(mine, set(tracked), _login_opener(store, provider, config))
            by_cluster: dict[str, list[ClusterResource]] = {}
            for resource in machines(provider).list_resources():
                if resource.cluster not in tracked:
                    by_cluster.setdefault(resource.cluster, []).append(resource)
            for cluster, resources in sorted(by_cluster.items()):
                ids = tuple(f"{r.kind} {r.id}" + (f" in {r.region}" if r.region else "") for r in resources)
                holder = held.get(cluster)
                leaks.append(Leak(cloud, cluster, "resources", ids, "resources of a cluster not in state",
                                  tuple(pricer.resource(r) for r in resources),
                                  alive_at=holder.alive_at if holder else None, live=holder is not None,
                                  evidence=holder.evidence if holder else ""))
        except CloudtrainError as exc:
            skipped.append(Skipped(cloud, exc.one_line()))
    driven = driven_clusters(runs_dir if runs_dir is not None else Path(config.runs_dir))
    return [_mark_driven(leak, driven.get(leak.cluster)) for leak in leaks], skipped


def _mark_driven(leak: Leak, driven: tuple[str, str] | None) -> Leak:
    if driven is None:
        return leak
    run_id, host = driven
    return replace(leak, reason=f"{leak.reason}: run {run_id} is driven from {host} (its state is there)",
                   driven_by=host, driven_run=run_id)


def _instance_leaks(cloud: str, provider: Provider, store: StateStore, tracked: dict,
                    pricer: Pricer, teammates: dict | None = None) -> list[Leak]:
    by_cluster: dict[str, list[Instance]] = {}
    for inst in machines(provider).list_tagged(None):
        if inst.state is not InstanceState.TERMINATED:
            by_cluster.setdefault(inst.cluster, []).append(inst)
    leaks = []
    now = time.time()
    for cluster, instances in sorted(by_cluster.items()):
        record = tracked.get(cluster)
        if record is not None and record.provider == cloud and launch_in_flight(record, now):
            # Another terminal is creating it right now: its instances are not yet in its rows.
            log.info("gc: %s is being launched by a live process (%s); not a leak", cluster, record.driver)
            continue
        mate = (teammates or {}).get(cluster)
        if mate is not None and mate.cloud == cloud:
            # A teammate's live work in the team's state: theirs to end, whatever its machines'
            # owner tag, and even a machine their row does not list yet (a launch or relaunch
            # between its create call and its record).
            log.info("gc: %s is %s's live cluster (%s); not a leak", cluster, mate.member, mate.status)
            continue
        if record is None:
            reason = "cluster not in state"
        elif record.provider != cloud:
            reason = f"state has cluster {cluster} on {record.provider}"
        else:
            known = {n.instance_id for n in store.get_nodes(cluster)}
            unknown = [i for i in instances if i.id not in known]
            if not unknown:
                continue
            instances, reason = unknown, "instance not recorded in the cluster's state"
        instances = sorted(instances, key=lambda i: i.id)
        marks = [i.alive_at for i in instances if i.alive_at is not None]
        alive_at = max(marks) if marks else None
        leaks.append(Leak(cloud, cluster, "instance", tuple(i.id for i in instances), reason,
                          tuple(pricer.instance(i) for i in instances), alive_at=alive_at,
                          live=is_live(alive_at, now), evidence=evidence(alive_at, now)))
    return leaks


class Pricer:
    """Hourly prices for one cloud's leaks, from the catalog and the storage price table."""

    def __init__(self, cloud: str, catalog: Catalog, priced: bool) -> None:
        self.cloud = cloud
        self.catalog = catalog
        self.priced = priced  # False: the machines are the user's own (this computer), never billed

    def instance(self, inst: Instance) -> Item:
        kind = inst.instance_type or "unknown type"
        market = {True: "spot", False: "on-demand", None: "market unknown"}[inst.spot]
        if not self.priced:
            return Item("instance", inst.id, inst.region, f"{kind} {inst.state.value}", 0.0, "not billed")
        if inst.state in _COMPUTE_STATES:
            detail = f"{kind} {inst.state.value}, {market}"
            if not inst.instance_type or not inst.region:
                return Item("instance", inst.id, inst.region, detail, None, "price unknown: no type or region")
            # Market unknown: the on-demand price, an upper bound (spot is never dearer).
            price = self.catalog.price(self.cloud, inst.region, inst.instance_type, spot=bool(inst.spot),
                                       zone=inst.zone)
            if price is None:
                return Item("instance", inst.id, inst.region, detail, None,
                            f"price unknown: {kind} {'spot ' if inst.spot else ''}in {inst.region} not in the catalog")
            source = "catalog" if inst.spot is not None else "catalog on-demand (upper bound)"
            return Item("instance", inst.id, inst.region, detail, price, source)
        if inst.state is InstanceState.STOPPED:
            size = f"{inst.disk_gb:g} GB of disks" if inst.disk_gb is not None else "disks of the default size"
            hourly = self._disks(inst.disk_gb)
            return Item("instance", inst.id, inst.region, f"{kind} stopped: {size}", hourly,
                        "storage price" if hourly is not None else "price unknown: no disk price")
        return Item("instance", inst.id, inst.region, f"{kind} {inst.state.value}", None,
                    "price unknown: state unknown")

    def resource(self, resource: ClusterResource) -> Item:
        detail = f"{resource.size_gb:g} GB" if resource.size_gb is not None else ""
        if resource.hourly_usd is not None:
            return Item(resource.kind, resource.id, resource.region, detail, resource.hourly_usd, "provider")
        if resource.kind in FREE_KINDS or not self.priced:
            return Item(resource.kind, resource.id, resource.region, detail, 0.0, "free")
        if resource.kind in DISK_KINDS and resource.size_gb is not None:
            hourly = self._disks(resource.size_gb)
            return Item(resource.kind, resource.id, resource.region, detail, hourly,
                        "storage price" if hourly is not None else "price unknown: no disk price")
        return Item(resource.kind, resource.id, resource.region, detail, None, f"price unknown: {resource.kind}")

    def _disks(self, size_gb: float | None) -> float | None:
        """Storage price x size (None size: the cloud's default disk); None where the storage table
        has no price for this cloud."""
        if disk_price(self.cloud) is None:
            log.debug("gc: no disk price for %s in the storage table", self.cloud)
            return None
        return disk_hourly(self.cloud, size_gb)


def _login_opener(store: StateStore, provider: Provider, config: Config) -> OpenLogin:
    """What a scheduler's provider lists and cancels its leaked jobs through: the login node (rank 0)
    of a cluster in `store`, connected here (providers never open SSH) and closed on leaving."""
    from cloudtrain.cluster.nodes import close_all, connect

    @contextmanager
    def open_login(cluster: str) -> Iterator[Node | None]:
        nodes = connect(store.get_nodes(cluster)[:1], provider, config)
        try:
            yield nodes[0] if nodes else None
        finally:
            close_all(nodes)

    return open_login


def collect(leaks: Sequence[Leak], config: Config, include_driven: bool = False,
            include_live: bool = False) -> list[str]:
    """Terminate leaked instances and release leftover resources; return what was done. A cluster
    of a run driven from an SSH host is left alone (terminating it would kill a live run whose
    state is on that host) unless `include_driven`; machines with a fresh liveness mark (a
    cloudtrain process elsewhere holds them) unless `include_live`."""
    done = []
    providers: dict[str, Provider] = {}
    for leak in leaks:
        if leak.live and not include_live:
            done.append(f"{leak.cloud}: left {leak.cluster} alone: {leak.evidence} (a cloudtrain command "
                        "elsewhere holds it: another state of this owner; `gc --yes --include-live` removes it anyway)")
            continue
        if leak.driven_by is not None and not include_driven:
            done.append(f"{leak.cloud}: left {leak.cluster} alone: run {leak.driven_run} is driven from "
                        f"{leak.driven_by} (`cloudtrain driver status {leak.driven_run}`; `cloudtrain driver "
                        f"cancel {leak.driven_run}` stops it; `gc --yes --include-driven` removes it anyway)")
            continue
        provider = providers.setdefault(leak.cloud, get_provider(leak.cloud, config))
        if leak.kind == "queued-job":
            provider.cancel_leaked(leak, _login_opener(StateStore(), provider, config))  # type: ignore[attr-defined]
            done.append(f"{leak.cloud}: cancelled job {', '.join(leak.ids)} ({leak.cluster})")
            continue
        if leak.kind == "instance":
            machines(provider).terminate(list(leak.ids))
            done.append(f"{leak.cloud}: terminated {', '.join(leak.ids)} ({leak.cluster})")
        kept = machines(provider).release_resources(leak.cluster)
        note = f"; kept for now: {', '.join(f'{k.kind} {k.id} ({k.note})' for k in kept)}" if kept else ""
        if leak.kind == "resources" or kept:
            done.append(f"{leak.cloud}: released resources of {leak.cluster}{note}")
    return done


# ---------------------------------------------------------------------------------------- gc --expired
# Stopped, then deleted (cloudtrain/expiry.py, docs/watchdog.md): machines whose tags say they may go
# once stopped long enough, tracked in this state or not. The same care as above: never a machine of
# live work (a fresh liveness mark, whoever set it; in this state, a launch in flight or a run whose
# process is alive), never part of a cluster (a cluster goes whole or not at all), and each machine's
# state and mark read again just before it is deleted.


@dataclass(frozen=True)
class Expired:
    """One cluster with machines armed for deletion once stopped, and gc --expired's verdict on it."""

    cloud: str
    cluster: str
    ids: tuple[str, ...]
    items: tuple[Item, ...]  # the machines, priced as they bill now (stopped: their disks)
    due: float | None  # when the whole cluster may go (the latest of its machines); None: never
    delete: bool
    why: str
    tracked: bool  # in this machine's state (deleted through `down`: its row goes too)

    @property
    def hourly_usd(self) -> float | None:
        prices = [item.hourly_usd for item in self.items]
        return None if any(p is None for p in prices) else sum(p for p in prices if p is not None)


def find_expired(store: StateStore, config: Config, clouds: Sequence[str] | None = None,
                 catalog: Catalog | None = None, at: float | None = None) -> tuple[list[Expired], list[Skipped]]:
    """Every cluster of this owner with a machine armed by `autostop.delete_after_stopped_days`, and
    whether it may be deleted at `at` (expiry.now(): the kit's clock in tests)."""
    from cloudtrain import expiry
    from cloudtrain.providers import traits

    clouds = gc_clouds() if clouds is None else clouds
    catalog = catalog or default_catalog()
    at = expiry.now() if at is None else at
    found: list[Expired] = []
    skipped: list[Skipped] = []
    for cloud in clouds:
        try:
            provider = get_provider(cloud, config)
            if not supports(provider, CreatesMachines):
                continue  # nothing of a scheduler's or given hosts' is ever stopped by cloudtrain
            creds = provider.check_credentials()
            if not creds.ok:
                skipped.append(Skipped(cloud, creds.detail, creds.set_up))
                continue
            pricer = Pricer(cloud, catalog, traits(cloud).priced)
            by_cluster: dict[str, list[Instance]] = {}
            for inst in machines(provider).list_tagged(None):
                if inst.state is not InstanceState.TERMINATED:
                    by_cluster.setdefault(inst.cluster, []).append(inst)
            for cluster, instances in sorted(by_cluster.items()):
                if any(i.expiry.armed for i in instances):
                    found.append(_expired(cloud, cluster, instances, store, pricer, at))
        except CloudtrainError as exc:
            skipped.append(Skipped(cloud, exc.one_line()))
    return found, skipped


def _expired(cloud: str, cluster: str, instances: Sequence[Instance], store: StateStore, pricer: Pricer,
             at: float) -> Expired:
    from cloudtrain import expiry

    instances = sorted(instances, key=lambda i: i.id)
    record = store.get_cluster(cluster)
    tracked = record is not None and record.provider == cloud
    held = _held_here(store, record, cloud) if tracked else None
    marks = [i.alive_at for i in instances if i.alive_at is not None]
    alive_at = max(marks) if marks else None
    live = is_live(alive_at, at) or held is not None
    verdicts = [expiry.verdict(i.state is InstanceState.STOPPED, i.expiry, i.state_since, live, at) for i in instances]
    dues = [v.due for v in verdicts]
    due = None if any(d is None for d in dues) else max(d for d in dues if d is not None)
    delete = all(v.delete for v in verdicts)
    if delete:
        why = verdicts[0].why if len(verdicts) == 1 else f"every machine due, the last {expiry.when(due or at)}"
    else:
        first = next(v for v in verdicts if not v.delete)
        why = first.why
        if live and "live work" in why:
            why = why.replace("live work holds it", held or f"live work holds it ({evidence(alive_at, at)})")
        if len(verdicts) > 1:
            why = f"{sum(v.delete for v in verdicts)}/{len(verdicts)} machine(s) due; {why}"
    return Expired(cloud, cluster, tuple(i.id for i in instances), tuple(pricer.instance(i) for i in instances),
                   due, delete, why, tracked)


def _held_here(store: StateStore, record: ClusterRecord | None, cloud: str) -> str | None:
    """What of this state holds the cluster now (a launch in flight, a run whose process is alive),
    in words; None when nothing does."""
    now = time.time()  # (processes and heartbeats live on the real clock, whatever the kit's says)
    if record is None or record.provider != cloud:
        return None
    if launch_in_flight(record, now):
        return f"live work holds it (a launch in flight: {record.driver})"
    runs = store.live_runs(record.name)
    return f"live work holds it (run {runs[0].id}, pid {runs[0].pid})" if runs else None


def collect_expired(found: Sequence[Expired], store: StateStore, config: Config,
                    reporter: object | None = None) -> list[str]:
    """Delete the clusters `found` says may go, with their disks and resources; what was done, one
    line each. Each one's machines are described again first: one started or marked alive since the
    listing (another terminal, another state) keeps the whole cluster."""
    from cloudtrain import expiry
    from cloudtrain.cluster.lifecycle import Lifecycle

    done: list[str] = []
    for item in found:
        if not item.delete:
            continue
        provider = get_provider(item.cloud, config)
        now_listed = machines(provider).describe(list(item.ids))
        at = expiry.now()
        record = store.get_cluster(item.cluster)
        held = _held_here(store, record, item.cloud) if item.tracked else None
        marks = [i.alive_at for i in now_listed if i.alive_at is not None]
        live = is_live(max(marks) if marks else None, at) or held is not None
        again = [expiry.verdict(i.state is InstanceState.STOPPED, i.expiry, i.state_since, live, at)
                 for i in now_listed if i.state is not InstanceState.TERMINATED]
        if not again or not all(v.delete for v in again):
            why = next((v.why for v in again if not v.delete), "its machines are gone already")
            done.append(f"{item.cloud}: left {item.cluster} alone: {why}")
            continue
        if item.tracked:
            # Through `down`: its jobs' rows, its access and its state row go too, as for any down.
            Lifecycle(store, config, reporter).down(item.cluster)  # type: ignore[arg-type]
            done.append(f"{item.cloud}: deleted {item.cluster} ({', '.join(item.ids)}) and its disks: {item.why}")
            continue
        machines(provider).terminate(list(item.ids))
        kept = machines(provider).release_resources(item.cluster)
        note = f"; kept for now: {', '.join(f'{k.kind} {k.id} ({k.note})' for k in kept)}" if kept else ""
        done.append(f"{item.cloud}: deleted {item.cluster} ({', '.join(item.ids)}) and its disks: {item.why}{note}")
    return done
