"""Cluster lifecycle: up, stop, start, refresh, down. The only writer of cluster state.

Money safety lives here: the state row is written before any create call, a failed `up`
terminates whatever it launched, and `down` is idempotent (finds instances by tag as well as
from state, so it works after a crash between create and record).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cloudtrain.expiry import launch_tags
from cloudtrain.buckets.grants import recipe_grants
from cloudtrain.config import Config
from cloudtrain.errors import (
    CloudtrainError,
    ClusterBusyError,
    ClusterNotFoundError,
    LaunchLostError,
    LostLaunch,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.events import NullReporter, Reporter
from cloudtrain.state.locks import cluster_lock, launch_in_flight
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import HostSpec, Instance, InstanceSpec, InstanceState, Provider, owner_id
from cloudtrain.providers.base import TAG_ALIVE, TAG_INCARNATION, alive_value
from cloudtrain.providers.base import ListsEnded, StopsMachines, launched_by, machines, supports
from cloudtrain.recipe import Recipe
from cloudtrain.remote.jobs import OPEN_STATES, JobState
from cloudtrain.state import ClusterRecord, ClusterStatus, NodeRecord, StateStore
from cloudtrain.cluster.hosts import end_work_on_hosts
from cloudtrain.cluster import access
from cloudtrain.cluster.holds import precheck, write_intent
from cloudtrain.cluster.intent import Heartbeat, is_me
from cloudtrain.cluster.reconcile import LISTING_SETTLE_S, Observation, Pricing, observe, reconcile

if TYPE_CHECKING:
    from cloudtrain.cluster.planning import UsablePlan

# Clouds whose providers exist but whose recipe features land in later work. Refused, never ignored.
_LIVE_STATES = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING, InstanceState.STOPPED}


@dataclass(frozen=True)
class Cluster:
    record: ClusterRecord
    nodes: tuple[NodeRecord, ...]
    provider: Provider


def refuse_unavailable(recipe: Recipe) -> None:
    """Recipe fields that validate but that no provider acts on yet fail loudly (library callers
    that skip preflight); one rule, kept in preflight."""
    from cloudtrain.preflight import unsupported

    problem = unsupported(recipe)
    if problem is not None:
        _, message, hint = problem
        raise NotAvailableError(message, hint=hint)


class Lifecycle:
    def __init__(self, store: StateStore, config: Config, reporter: Reporter | None = None) -> None:
        self.store = store
        self.config = config
        self.reporter = reporter or NullReporter()
        self.wait_timeout_s = 900.0

    def provider(self, name: str) -> Provider:
        return get_provider(name, self.config)

    def get(self, name: str) -> Cluster:
        record = self.store.get_cluster(name)
        if record is None:
            known = [c.name for c in self.store.list_clusters()]
            from cloudtrain.yamlfile import did_you_mean

            hint = did_you_mean(name, known) or ("see `cloudtrain status`" if known else "no clusters exist")
            raise ClusterNotFoundError(f"no cluster named {name!r}", hint=hint)
        return Cluster(record, tuple(self.store.get_nodes(name)), self.provider(record.provider))

    # up ------------------------------------------------------------------------------------------

    def up(self, recipe: Recipe, name: str, recipe_path: str | None = None, digest: str | None = None,
           run_id: str | None = None, usable: UsablePlan | None = None,
           deadline_at: float | None = None) -> tuple[Cluster, bool]:
        """Bring the cluster up (reuse it if it exists). Returns (cluster, created_now).

        `deadline_at` (epoch seconds; a sweep's lease): a new cluster's machines are deleted by then
        whatever happens, the deadline going in the launch request itself with the budget's.

        With run_id (a `run`), an existing cluster that another live run is using is refused:
        the two would overwrite each other's workdir and the first would tear it down under the other.
        """
        from cloudtrain.providers import ANY

        refuse_unavailable(recipe)
        cloud = recipe.resources.cloud
        self._remake_if_hosts_moved(recipe, name, run_id)
        with cluster_lock(name):
            existing = self.store.get_cluster(name)
            if existing is not None:
                if run_id is not None:
                    self.refuse_if_busy(name, run_id)
                # `cloud: any` reuses the cluster wherever the plan put it.
                provider = self.provider(existing.provider if cloud == ANY else cloud)
                return self._reuse(existing, provider, recipe), False
            return self._create(recipe, name, recipe_path, digest, usable, deadline_at), True

    def _remake_if_hosts_moved(self, recipe: Recipe, name: str, run_id: str | None) -> None:
        """A cluster of given hosts (ssh) whose recipe now names other hosts (a corrected typo, a
        machine swapped): the cluster is the recipe's hosts, so it is ended on the old ones and
        made anew, never reused on machines the recipe no longer names."""
        from cloudtrain.cluster.hosts import moved_hosts

        existing = self.store.get_cluster(name)
        if existing is None or not recipe.resources.hosts or existing.provider != recipe.resources.cloud:
            return
        wanted = [(h.address, h.port, h.user) for h in recipe.resources.hosts]
        moved = moved_hosts(wanted, self.store.get_nodes(name))
        if moved is None:
            return
        busy = self.live_runs(name, except_run=run_id)
        if busy:
            raise ClusterBusyError(f"cluster {name!r}: the recipe's hosts changed ({moved}), but run {busy[0].id} "
                                   "is using it", hint="wait for that run to end, or pass --cluster NEW-NAME")
        self.reporter.info(f"cluster {name}: the recipe's hosts changed ({moved}); ending it on the old host(s) "
                           "and making it anew")
        self.down(name)

    def launches_priced(self, recipe: Recipe) -> bool:
        """Whether creating this recipe's cluster launches on a cloud that bills (or `cloud: any`)."""
        from cloudtrain.providers import ANY

        return recipe.resources.cloud == ANY or self.provider(recipe.resources.cloud).traits.priced

    def live_runs(self, name: str, except_run: str | None = None) -> list:  # noqa: ANN201
        """Runs on this cluster whose `cloudtrain run` process is still alive on this machine."""
        return self.store.live_runs(name, except_run)

    def refuse_if_busy(self, name: str, run_id: str | None = None) -> None:
        others = self.live_runs(name, except_run=run_id)
        if others:
            other = others[0]
            raise ClusterBusyError(
                f"cluster {name!r} is in use by run {other.id} (pid {other.pid}); a second run would "
                "overwrite its workdir",
                hint=f"wait for it to finish, or pass --cluster {name}-2 to run on a cluster of its own",
            )

    def _reuse(self, existing: ClusterRecord, provider: Provider, recipe: Recipe) -> Cluster:
        if existing.provider != provider.name:
            raise UsageError(
                f"cluster {existing.name!r} already exists on {existing.provider}, the recipe asks for {provider.name}",
                hint="pass --cluster NEW-NAME or `cloudtrain down` it first",
            )
        if existing.num_nodes != recipe.num_nodes:
            raise UsageError(
                f"cluster {existing.name!r} has {existing.num_nodes} node(s), the recipe asks for {recipe.num_nodes}",
                hint="pass --cluster NEW-NAME or `cloudtrain down` it first",
            )
        nodes = self.store.get_nodes(existing.name)
        if existing.status == ClusterStatus.STOPPED:
            self._start_locked(existing, provider, nodes)
        if existing.status == ClusterStatus.UP and nodes and all(n.state == InstanceState.RUNNING.value for n in nodes):
            # State says nothing changed: a warm run asks the cloud nothing. If a node went away
            # behind our back, connecting fails and the caller refreshes once (`refresh`).
            self.reporter.info(f"reusing cluster {existing.name} ({provider.name}, {len(nodes)} node(s))")
            return Cluster(existing, tuple(nodes), provider)
        cluster = self._refresh_locked(existing.name, provider)
        dead = [n for n in cluster.nodes if n.state != InstanceState.RUNNING.value]
        if dead or not cluster.nodes:
            raise ProviderError(
                f"cluster {existing.name!r} is {existing.status} with nodes not running "
                f"({', '.join(f'{n.instance_id}: {n.state}' for n in dead) or 'no nodes'})",
                hint="`cloudtrain down` it and run again",
            )
        self.reporter.info(f"reusing cluster {existing.name} ({provider.name}, {len(cluster.nodes)} node(s))")
        return cluster

    def _spec(self, recipe: Recipe, name: str, provider: Provider) -> InstanceSpec:
        res = recipe.resources
        hosts = tuple(
            HostSpec(address=h.address, user=h.user, port=h.port, key=h.key, proxy_command=h.proxy_command)
            for h in (res.hosts or [])
        )
        public_key, allowed_cidr = access.grant(name, provider, self.config, self.reporter)
        return InstanceSpec(
            cluster=name,
            owner=owner_id(self.config),
            instance_type=res.instance_type,
            region=res.region,
            zone=res.zone,
            image=res.image,
            disk_gb=res.disk_gb,
            spot=res.spot,
            accelerators=res.accelerators,
            ssh_public_key=public_key,
            allowed_cidr=allowed_cidr,
            # The on-node watchdog stops a machine by shutting it down from inside: the cloud makes
            # that a stop, or a delete when autostop says down.
            shutdown_behavior="terminate" if recipe.autostop is not None and recipe.autostop.down else "stop",
            # What the on-node watchdog may do to it: providers attach (and check) the identity it needs.
            watchdog="stop" if recipe.autostop is not None or recipe.budget is not None else None,
            hosts=hosts,
            # autostop.delete_after_stopped_days, where every state sees it (cloudtrain/expiry.py).
            tags=launch_tags(recipe.autostop.delete_after_stopped_days if recipe.autostop is not None else None),
            buckets=recipe_grants(recipe),  # the nodes' own identity may read/write exactly these
        )

    def _create(self, recipe: Recipe, name: str, recipe_path: str | None, digest: str | None,
                usable: UsablePlan | None = None, deadline_at: float | None = None) -> Cluster:
        if self.launches_priced(recipe):
            # Provisioning takes a plan (made with working credentials) and its approval; it makes
            # neither: the caller did both before anything existed (run/pipeline.Executor.check).
            if usable is None:
                raise UsageError(f"cluster {name!r}: a launch on a priced cloud needs its plan",
                                 hint="make it with cloudtrain.cluster.planning.plan_with_credentials, "
                                      "approve it, and pass it as `usable` (Executor.check does both)")
            for cloud, why in usable.skipped:
                self.reporter.warn(f"skipping {cloud}: {why} (see `cloudtrain check {cloud}`)")
            self.reporter.info(f"plan: {usable.plan.summary()}")
            candidates, providers = list(usable.plan.candidates), usable.providers
        else:
            provider = self.provider(recipe.resources.cloud)
            candidates, providers = [None], {provider.name: provider}
        if candidates[0] is not None:
            # A team budget that cannot hold the first placement's worst case refuses before any cloud call.
            precheck(self.store, owner_id(self.config), candidates[0].cloud, candidates[0].hourly_price,
                     recipe.num_nodes, _max_run_s(recipe, candidates[0].hourly_price, deadline_at),
                     recipe.resources.disk_gb)
        self._refuse_untracked_machines(name, providers.values())
        first = next(iter(providers.values()))
        spec = self._spec(recipe, name, first)
        if deadline_at is not None:
            spec = replace(spec, shutdown_behavior="terminate", watchdog="delete")
        tried: dict[str, Provider] = {}
        launched: list[Instance] = []
        heartbeat = Heartbeat(self.store.path, name)
        try:
            launched, provider, answered = self._launch(recipe, spec, candidates, providers, tried, recipe_path,
                                                        digest, heartbeat, deadline_at)
            record = self.store.get_cluster(name)
            assert record is not None
            # The create call's answer is the first observation: billed from the moment it was
            # answered, so a launch that fails from here on still costs its seconds (and minimum).
            self._apply(record, provider, [observe(i, answered, verb_at=answered) for i in launched],
                        complete=False)
            self._record_hosts(name, spec.hosts)
            self._wait_running(provider, [i.id for i in launched],
                               ended=lambda what: self._launch_lost(name, provider, what))
            cluster = self._observe_all(name, provider, launch_done=True)
            if cluster.record.status != ClusterStatus.UP:
                # Running when asked a moment ago, gone (or going) now: a machine the cloud took back.
                gone = ", ".join(f"{n.instance_id} ({n.state})" for n in cluster.nodes
                                 if n.state != InstanceState.RUNNING.value)
                raise self._launch_lost(name, provider, f"instances {gone or 'of the launch'} while starting")
            head = next((n for n in cluster.nodes if n.instance_id == launched[0].id), None)
            self.store.upsert_cluster(name=name, region=launched[0].region or record.region,
                                      zone=launched[0].zone or record.zone,
                                      instance_type=launched[0].instance_type or record.instance_type,
                                      driver=None)
            assert head is not None
        except BaseException as exc:
            heartbeat.stop()
            # Ctrl-C, `kill` or a closed terminal here must not cut the cleanup short.
            from cloudtrain.shield import no_interrupts

            with no_interrupts():
                self._cleanup_failed_launch(name, list(tried.values()), launched, exc)
            raise
        heartbeat.stop()
        return Cluster(self.store.get_cluster(name), tuple(self.store.get_nodes(name)), provider)  # type: ignore[arg-type]

    def _launch_lost(self, name: str, provider: Provider, what: str) -> LaunchLostError:
        record = self.store.get_cluster(name)
        assert record is not None
        return LaunchLostError(f"{provider.name} ended {what}", LostLaunch(
            cloud=provider.name, region=record.region, zone=record.zone, instance_type=record.instance_type,
            spot=bool(record.spot), hourly_price=record.hourly_price, incarnation=record.uid))

    @staticmethod
    def _refuse_untracked_machines(name: str, providers: Iterable[Provider]) -> None:
        """No state row, yet the cloud has machines tagged with this cluster (a lost state database,
        another laptop of the same owner): a create would launch a second cluster beside them (GCP)
        or overwrite them (Azure's PUT). Refused before any create call."""
        for provider in providers:
            if not provider.traits.owns_machines:  # this machine's nodes, given hosts: not a cloud's
                continue
            found = [i for i in machines(provider).list_tagged(name) if i.state in _LIVE_STATES]
            if found:
                listed = ", ".join(f"{i.id} ({i.state.value})" for i in found)
                raise UsageError(
                    f"cluster {name!r} is not in this machine's state, but {provider.name} already has its "
                    f"machines: {listed}",
                    hint=f"`cloudtrain gc --cloud {provider.name}` lists them with their cost and `--yes` removes "
                         "them; or choose another name with --cluster")

    def _launch(self, recipe: Recipe, spec: InstanceSpec, candidates: list, providers: dict[str, Provider],
                tried: dict[str, Provider], recipe_path: str | None, digest: str | None,
                heartbeat: Heartbeat, deadline_at: float | None = None) -> tuple[list[Instance], Provider, float]:
        """Launch at the cheapest placement; on a capacity error fail over to the next one that the
        error does not rule out (a zone's, a region's, or the whole cloud's), across clouds for
        `cloud: any`. The state row (the launch intent: a new incarnation, this process as its
        driver, the placement's price) names each attempt's cloud before its create call, so an
        instance whose answer is lost is found by tag and billed at the right price. Returns the
        instances, their provider and when the create call was answered."""
        from cloudtrain.errors import CapacityError

        failures: list[str] = []
        ruled_out: set[tuple[str, str | None]] = set()  # (cloud, region or None for the whole cloud)
        for placement in candidates:
            cloud = placement.cloud if placement is not None else next(iter(providers))
            provider = providers[cloud]
            if placement is not None and ((cloud, None) in ruled_out or (cloud, placement.region) in ruled_out):
                continue
            attempt = spec if placement is None else replace(
                spec, region=placement.region, zone=placement.zone, avoid_zones=placement.avoid_zones,
                instance_type=placement.instance_type,
                spot=placement.spot, max_run_s=_max_run_s(recipe, placement.hourly_price, deadline_at))
            # State first: if we die between the create call and the next line, `status --refresh`
            # and `down` still know where to look for instances tagged with this cluster.
            from cloudtrain import procid

            from cloudtrain.providers.deadline import deadline_seconds

            hourly = placement.hourly_price if placement is not None else 0.0
            # The intent and its hold against the team's budgets, in one transaction (cluster/holds.py).
            write_intent(self.store, dict(
                # The latest its machines can live: what an answer lost to a crash is booked up to.
                deadline_at=(time.time() + deadline_seconds(attempt.max_run_s)
                             if attempt.max_run_s is not None else None),
                name=spec.cluster, provider=cloud, status=ClusterStatus.PROVISIONING, region=attempt.region,
                zone=attempt.zone, instance_type=attempt.instance_type, num_nodes=recipe.num_nodes,
                recipe_path=recipe_path, recipe_digest=digest, owner=spec.owner, last_error=None,
                spot=int(attempt.spot), driver=procid.identity(), heartbeat_at=time.time(),
                # One price source: the plan's placement, per node, known before anything exists.
                hourly_price=hourly * recipe.num_nodes,
            ), owner=spec.owner, cloud=cloud, hourly_per_node=hourly, num_nodes=recipe.num_nodes,
                max_run_s=attempt.max_run_s, disk_gb=attempt.disk_gb)
            heartbeat.start()
            uid = self.store.get_cluster(spec.cluster).uid  # type: ignore[union-attr]
            # The launch carries its first liveness mark: `gc` from any state leaves it alone until
            # the holder's marks take over (cluster/liveness.py), or stop.
            attempt = replace(attempt, tags={**attempt.tags, TAG_INCARNATION: uid, TAG_ALIVE: alive_value(time.time())})
            self.store.add_event(spec.cluster, "launch", f"{cloud}: launching {recipe.num_nodes} node(s)")
            tried[cloud] = provider
            try:
                instances = machines(provider).launch(attempt, recipe.num_nodes)
            except CapacityError as exc:
                if placement is None:
                    raise
                failures.append(f"{placement.describe()}: {exc.message}")
                self.store.add_event(spec.cluster, "capacity", failures[-1])
                if exc.scope in ("region", "cloud"):
                    ruled_out.add((cloud, placement.region if exc.scope == "region" else None))
                left = [c for c in candidates[candidates.index(placement) + 1:]
                        if (c.cloud, None) not in ruled_out and (c.cloud, c.region) not in ruled_out]
                self.reporter.warn(f"no capacity: {placement.describe()}"
                                   + ("; trying the next placement" if left else "; no other placement fits"))
                continue
            return instances, provider, time.time()
        raise CapacityError(
            f"no capacity for {spec.cluster} in any of {len(failures)} placement(s): " + "; ".join(failures),
            hint="try another region, instance type or later",
        )

    def _cleanup_failed_launch(self, name: str, providers: list[Provider], launched: list[Instance],
                               exc: BaseException) -> None:
        """Whatever the providers created, by our records or by their tags, goes away now.

        The row stays (status launch-failed) until every instance is observed gone and every side
        resource (an Azure static IP, a security group) is released: `down` or `gc` finish the
        job later, and forgetting the row could hide a billed resource.
        """
        self.store.add_event(name, "launch-failed", f"{type(exc).__name__}: {exc}")
        # Instances the provider ended itself when the launch was cut short are observed too.
        ended_by_provider = launched_by(exc)
        launched_ids = {i.id for i in launched} | {i.id for i in ended_by_provider}
        left: list[str] = []
        for provider in providers:
            try:
                found = [i for i in machines(provider).list_tagged(name) if i.state in _LIVE_STATES]
                ids = {i.id for i in found}
                if provider is providers[-1]:
                    ids |= launched_ids
                    listed = {i.id for i in found}
                    found += [i for i in ended_by_provider if i.id not in listed]
                    record = self.store.get_cluster(name)
                    if found and record is not None:
                        # Seen before they go: once deleted, some clouds (Azure) no longer say when
                        # they were made, and their seconds (and minimum) are still billed.
                        self._apply(record, provider, [observe(i, time.time()) for i in found], complete=False)
                if ids:
                    self.reporter.warn(f"launch failed; terminating {len(ids)} instance(s) it created on {provider.name}")
                    machines(provider).terminate(sorted(ids))
                answered = time.time()
                if provider is providers[-1]:
                    cluster = self._observe_all(name, provider, verb_at=answered, verb_ids=ids | launched_ids)
                    left += [f"{n.instance_id} ({n.state})" for n in cluster.nodes
                             if n.state != InstanceState.TERMINATED.value]
                left += [f"{k.kind} {k.id} ({k.note})" for k in machines(provider).release_resources(name)]
            except CloudtrainError as cleanup_error:
                left.append(f"{provider.name}: {cleanup_error.one_line()}")
        if left:
            detail = "; ".join(left)
            self.store.set_cluster_status(name, ClusterStatus.LAUNCH_FAILED, error=detail)
            self.store.upsert_cluster(name=name, driver=None)
            self.reporter.warn(f"the failed launch left {detail}; run `cloudtrain down {name}` to finish the cleanup")
            return
        self.store.delete_cluster(name)

    def _record_hosts(self, name: str, hosts: Sequence[HostSpec]) -> None:
        """Existing machines (the `ssh` provider): how to log in comes from the recipe's hosts."""
        if not hosts:
            return
        nodes = [replace(n, ssh_user=hosts[n.rank].user or n.ssh_user, ssh_port=hosts[n.rank].port or n.ssh_port,
                         ssh_key=hosts[n.rank].key, proxy_command=hosts[n.rank].proxy_command)
                 if n.rank < len(hosts) else n for n in self.store.get_nodes(name)]
        self.store.put_nodes(name, nodes)

    def _wait_for(self, provider: Provider, ids: list[str], want: InstanceState, doing: str,
                  ended: Callable[[str], CloudtrainError] | None = None) -> list[Instance]:
        """Poll describe with backoff until every instance is in `want`; the only wait on instance state.
        `ended`: the error for an instance the cloud terminated while it was to start (a launch's)."""
        deadline = time.monotonic() + self.wait_timeout_s
        delay = 0.2
        said = time.monotonic()
        while True:
            instances = machines(provider).describe(ids)
            states = {i.id: i.state for i in instances}
            if len(states) == len(set(ids)) and all(s is want for s in states.values()):
                return instances
            if want is InstanceState.RUNNING:
                bad = {k: v for k, v in states.items() if v in (InstanceState.TERMINATED, InstanceState.STOPPED)}
            else:
                bad = {k: v for k, v in states.items() if v in (InstanceState.TERMINATED, InstanceState.RUNNING)}
            if bad:
                what = f"instances {', '.join(f'{k} ({v.value})' for k, v in bad.items())} while {doing}"
                if ended is not None and InstanceState.TERMINATED in bad.values():
                    raise ended(what)
                raise ProviderError(what)
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"instances not {want.value} after {self.wait_timeout_s:.0f}s: "
                    + ", ".join(f"{k} ({v.value})" for k, v in states.items())
                )
            if time.monotonic() - said > 10:
                said = time.monotonic()
                self.reporter.info(f"waiting for {len(ids)} instance(s) to be {want.value} ("
                                   + ", ".join(f"{k}: {v.value}" for k, v in states.items()) + ")")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _wait_running(self, provider: Provider, ids: list[str],
                      ended: Callable[[str], CloudtrainError] | None = None) -> list[Instance]:
        return self._wait_for(provider, ids, InstanceState.RUNNING, "starting", ended)

    # observations ----------------------------------------------------------------------------------

    def _pricing(self, record: ClusterRecord, provider: Provider) -> Pricing:
        from cloudtrain.cost import HOURS_PER_MONTH, billing_minimum_s, disk_hourly, disk_price

        cloud = provider.name
        return Pricing(running=record.hourly_price / max(1, record.num_nodes), disk=disk_hourly(cloud),
                       min_s=billing_minimum_s(cloud), priced=provider.traits.priced,
                       disk_per_gb=(disk_price(cloud) or 0.0) / HOURS_PER_MONTH)

    def _apply(self, record: ClusterRecord, provider: Provider, observations: Sequence[Observation], *,
               complete: bool, launch_done: bool = False, abandoned: bool = False, final: bool = False) -> Cluster:
        """The one way observations enter state: reconcile, then write the transition at once."""
        assert record.uid is not None
        transition = reconcile(record, self.store.get_nodes(record.name), self.store.open_billing(record.uid),
                               observations, self._pricing(record, provider), complete=complete,
                               launch_done=launch_done, abandoned=abandoned, final=final, at=time.time(),
                               settle_s=float(os.environ.get("CLOUDTRAIN_LISTING_SETTLE_S", LISTING_SETTLE_S)))
        self.store.apply(record.name, transition, record.uid, provider.name)
        updated = self.store.get_cluster(record.name)
        return Cluster(updated or record, tuple(self.store.get_nodes(record.name)), provider)

    def _observe_all(self, name: str, provider: Provider, *, verb_at: float | None = None,
                     verb_ids: Sequence[str] | set[str] = (), launch_done: bool = False,
                     final: bool = False) -> Cluster:
        """Ask the provider about every machine of the cluster (its rows, and whatever carries its
        tag) and reconcile. `verb_at`: when our own call that changed `verb_ids` was answered."""
        record = self.store.get_cluster(name)
        assert record is not None
        nodes = self.store.get_nodes(name)
        # What our own call just acted on is asked about too: a machine it terminated is no longer
        # listed by tag, and its life must still reach the ledger.
        ids = [n.instance_id for n in nodes] + sorted(set(verb_ids) - {n.instance_id for n in nodes})
        described = {i.id: i for i in machines(provider).describe(ids)} if ids else {}
        abandoned = abandoned_intent(record, launch_done)
        listed = machines(provider).list_tagged(name)
        if abandoned and supports(provider, ListsEnded):
            # Its creator died before the create's answer: a machine that ran and already ended
            # is known only to the cloud, and only while it still reports it (EC2: about an hour).
            listed += [i for i in provider.list_ended(name) if i.incarnation in (None, record.uid)]  # type: ignore[attr-defined]
        for inst in listed:
            known = described.get(inst.id)
            if known is None:
                described[inst.id] = inst
            elif known.disk_gb is None and inst.disk_gb is not None:
                described[inst.id] = replace(known, disk_gb=inst.disk_gb)  # the listing sizes the disks
        looked = time.time()
        # Known nodes first, in rank order: found ones take the ranks after them.
        order = ids + [i for i in described if i not in ids]
        observations = [observe(described[i], looked, verb_at if i in verb_ids else None)
                        for i in order if i in described]
        return self._apply(record, provider, observations, complete=True, launch_done=launch_done,
                           abandoned=abandoned, final=final)

    def _machines(self, name: str, provider: Provider, nodes: Sequence[NodeRecord]) -> list[str]:
        """What a verb acts on: the rows' machines and whatever else carries this cluster's tag (a
        create whose answer was lost, a second terminal's instance), never only the rows."""
        ids = [n.instance_id for n in nodes if n.state != InstanceState.TERMINATED.value]
        if provider.traits.owns_machines:
            listed = machines(provider).list_tagged(name)
            self._observe_before_verb(name, provider, listed)
            ids += [i.id for i in listed if i.state in _LIVE_STATES and i.id not in ids]
        return ids

    def _observe_before_verb(self, name: str, provider: Provider, listed: Sequence[Instance]) -> None:
        """What a verb's listing by tag saw before the verb acts enters state first. A machine the
        cloud stopped on its own (the watchdog, a deadline) says so, at the cloud's time, only until
        the verb acts: a terminate replaces the stop's time with its own, and a stop of a stopped
        machine may restamp it; observed only after the verb, it was billed until the command."""
        record = self.store.get_cluster(name)
        if listed and record is not None and record.uid is not None:
            looked = time.time()
            self._apply(record, provider, [observe(i, looked) for i in listed], complete=False)

    # stop / start / refresh ----------------------------------------------------------------------

    def stop(self, name: str) -> Cluster:
        cluster = self.get(name)
        check_stop_possible(cluster.provider, bool(cluster.record.spot), name)
        with cluster_lock(name):
            ids = self._machines(name, cluster.provider, cluster.nodes)
            cluster.provider.stop(ids)
            answered = time.time()
            self.store.add_event(name, "stop", f"stop asked for {len(ids)} instance(s)")
            # A stopped machine runs nothing: its jobs ended with it.
            end_open_jobs(self.store, name)
            if ids and cluster.provider.traits.owns_machines:
                # "stopped" is said only once the cloud says so.
                self._wait_for(cluster.provider, ids, InstanceState.STOPPED, "stopping")
            return self._observe_all(name, cluster.provider, verb_at=answered, verb_ids=set(ids))

    def start(self, name: str) -> Cluster:
        cluster = self.get(name)
        with cluster_lock(name):
            return self._start_locked(cluster.record, cluster.provider, list(cluster.nodes))

    def _start_locked(self, record: ClusterRecord, provider: Provider, nodes: Sequence[NodeRecord]) -> Cluster:
        if not supports(provider, StopsMachines):
            return self._observe_all(record.name, provider)
        ids = self._machines(record.name, provider, nodes)
        provider.start(ids)
        answered = time.time()
        # A restarted cloud VM usually has a new public IP; the observation that follows records it.
        self._wait_running(provider, ids)
        cluster = self._observe_all(record.name, provider, verb_at=answered, verb_ids=set(ids), launch_done=True)
        # It boots again: connecting gets the patience of a fresh launch.
        self.store.put_nodes(record.name, [replace(n, started_at=answered) for n in cluster.nodes])
        self.store.add_event(record.name, "start", f"started {len(ids)} instance(s)")
        return replace(cluster, nodes=tuple(self.store.get_nodes(record.name)))

    def refresh(self, name: str) -> Cluster:
        cluster = self.get(name)
        with cluster_lock(name):
            return self._observe_all(name, cluster.provider)

    def settled(self, name: str) -> ClusterRecord | None:
        """The cluster's record once no other command is changing it: a `down` from another
        terminal that has already ended the jobs but not yet removed the row is waited for, so the
        caller sees the cluster gone instead of a row that is about to go."""
        with cluster_lock(name):
            return self.store.get_cluster(name)

    def _refresh_locked(self, name: str, provider: Provider) -> Cluster:
        return self._observe_all(name, provider)

    # down ----------------------------------------------------------------------------------------

    def down(self, name: str, forget: bool = False) -> bool:
        """End the cluster's jobs, terminate every instance and forget it. False if there was nothing.

        On machines that outlive the cluster (local, ssh) every job is ended and our files removed
        first; if a node cannot be reached the state row stays (status down-failed) so that a
        later `down` finishes the job, unless `forget` says to drop it anyway. The row goes only
        once every machine is observed gone; its billed intervals stay, closed, as history.
        """
        record = self.store.get_cluster(name)
        if record is None:
            return False
        provider = self.provider(record.provider)
        with cluster_lock(name):
            record = self.store.get_cluster(name)
            if record is None:
                return False
            # A launch of another process holds this lock while it runs (`up`): one whose
            # process died (a team database frees its lock with its session) is ended here.
            if launch_in_flight(record) and record.driver and not is_me(record.driver):
                raise ClusterBusyError(
                    f"cluster {name!r} is being launched by another cloudtrain process ({record.driver.split(':')[1]})",
                    hint="wait for that launch to finish (or fail), then `cloudtrain down` it",
                )
            nodes = self.store.get_nodes(name)
            if not provider.traits.owns_machines:
                failures = end_work_on_hosts(provider, nodes, self.config)
                if failures and not forget:
                    detail = "; ".join(failures)
                    self.store.set_cluster_status(name, ClusterStatus.DOWN_FAILED, error=detail)
                    self.store.add_event(name, "down-failed", detail)
                    from cloudtrain.errors import RemoteError

                    raise RemoteError(
                        f"could not end jobs and remove files on {len(failures)} node(s) of {name}: {detail}",
                        hint=f"`cloudtrain down {name}` again once the node is reachable; "
                             f"`cloudtrain down {name} --forget` drops it and leaves the files there",
                    )
                for failure in failures:
                    self.reporter.warn(f"forgetting {name} although {failure}")
            listed = machines(provider).list_tagged(name)
            self._observe_before_verb(name, provider, listed)
            ids = {n.instance_id for n in nodes} | {i.id for i in listed}
            if ids:
                machines(provider).terminate(sorted(ids))
            else:
                # No instance, but a launch killed halfway may have left billed resources (an
                # Azure static IP, a security group): terminate would have released them.
                for kept in machines(provider).release_resources(name):
                    self.reporter.warn(f"kept for now: {kept.kind} {kept.id} ({kept.note})")
            answered = time.time()
            if provider.traits.owns_machines:
                cluster = self._observe_all(name, provider, verb_at=answered, verb_ids=ids, final=True)
                left = [n for n in cluster.nodes if n.state != InstanceState.TERMINATED.value]
                if left and not forget:
                    detail = ", ".join(f"{n.instance_id} ({n.state})" for n in left)
                    self.store.set_cluster_status(name, ClusterStatus.DOWN_FAILED, error=f"still there: {detail}")
                    raise ProviderError(f"{provider.name} still reports {detail} after terminating them",
                                        hint=f"`cloudtrain down {name}` again; `cloudtrain status {name} --refresh` shows them")
            access.revoke(name, provider, ids)
            if provider.traits.remote:
                from cloudtrain.remote import muxkeep

                for instance_id in sorted(ids):
                    muxkeep.stop(instance_id)  # its kept connections end with its pin (revoke forgot it)
            if record.uid is not None:
                # Machines nobody bills, or forgotten: nothing more will be observed of them.
                self.store.end_billing(record.uid, answered)
            self.store.add_event(name, "down", f"terminated {len(ids)} instance(s)")
            # A new cluster of the same name starts with no jobs of this one.
            self.store.delete_jobs(name)
            self.store.delete_cluster(name)
        return True


def _max_run_s(recipe: Recipe, hourly_per_node: float, deadline_at: float | None = None) -> float | None:
    """The budget as running seconds at this placement's price, or less to end by `deadline_at`:
    the deadline every machine gets in its launch request (InstanceSpec.max_run_s)."""
    from cloudtrain.budget import budget_limit
    from cloudtrain.providers.deadline import grace_s

    limit = budget_limit(recipe.budget, hourly_per_node * recipe.num_nodes)
    limits = [limit[0]] if limit is not None else []
    if deadline_at is not None:
        # The launch request's backstop fires its grace after max_run_s; a lease (a sweep's) ends
        # at deadline_at itself, backstop included, so the grace comes off it.
        limits.append(max(1.0, deadline_at - time.time() - grace_s()))
    return min(limits) if limits else None


def end_open_jobs(store: StateStore, cluster: str, state: str = JobState.KILLED) -> None:
    """The cluster's machines stopped or went away: nothing of it runs any more."""
    for job in store.list_jobs(cluster):
        if job.status in OPEN_STATES:
            store.update_job(job.id, status=state, ended_at=time.time())


def abandoned_intent(record: ClusterRecord, launch_done: bool = False) -> bool:
    """A launch whose creating process is gone without hearing its create's answer."""
    return (record.status == ClusterStatus.PROVISIONING and not launch_done and record.driver is not None
            and not is_me(record.driver) and not launch_in_flight(record))


def check_stop_possible(provider: Provider, spot: bool, name: str | None = None) -> None:
    """Refuse a stop that cannot happen before it is needed: never leave a billed machine running."""
    what = f"cluster {name!r}" if name else "this run"
    if not supports(provider, StopsMachines):
        raise NotAvailableError(
            f"cloud {provider.name} cannot stop instances ({what})", hint="use `cloudtrain down` (or --down) instead"
        )
    if spot and not provider.traits.stops_spot:
        raise NotAvailableError(
            f"{provider.name} spot instances cannot be stopped, only terminated ({what} is spot)",
            hint="use --down (results are collected first) or --keep",
        )
