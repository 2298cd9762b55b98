"""Cluster lifecycle: up, stop, start, refresh, down. The only writer of cluster state.

Money safety lives here: the state row is written before any create call, a failed `up`
terminates whatever it launched, and `down` is idempotent (finds instances by tag as well as
from state, so it works after a crash between create and record).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cloudtrain.config import Config
from cloudtrain.errors import ClusterBusyError, ClusterNotFoundError, NotAvailableError, ProviderError, UsageError
from cloudtrain.events import NullReporter, Reporter
from cloudtrain.state.locks import cluster_lock
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import HostSpec, Instance, InstanceSpec, InstanceState, Provider, owner_id
from cloudtrain.recipe import Recipe
from cloudtrain.state import ClusterRecord, ClusterStatus, NodeRecord, RunStatus, StateStore
from cloudtrain.cluster.hosts import end_work_on_hosts
from cloudtrain.cluster.nodes import node_record

# Clouds whose providers exist but whose recipe features land in later work. Refused, never ignored.
_LIVE_STATES = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING, InstanceState.STOPPED}


@dataclass(frozen=True)
class Cluster:
    record: ClusterRecord
    nodes: tuple[NodeRecord, ...]
    provider: Provider


def _merged(old: NodeRecord, inst: Instance) -> NodeRecord:
    """The one way provider facts enter state: a node record updated with what the provider says
    now; what it does not say (an existing host has no API to ask) is kept."""
    return replace(old, state=inst.state.value, public_ip=inst.public_ip or old.public_ip,
                   private_ip=inst.private_ip or old.private_ip, ssh_user=old.ssh_user or inst.ssh_user,
                   started_at=old.started_at or inst.launched_at)


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
           run_id: str | None = None, usable: object = None) -> tuple[Cluster, bool]:
        """Bring the cluster up (reuse it if it exists). Returns (cluster, created_now).

        With run_id (a `run`), an existing cluster that another live run is using is refused:
        the two would overwrite each other's workdir and the first would tear it down under the other.
        """
        from cloudtrain.providers import ANY

        refuse_unavailable(recipe)
        cloud = recipe.resources.cloud
        with cluster_lock(name):
            existing = self.store.get_cluster(name)
            if existing is not None:
                if run_id is not None:
                    self.refuse_if_busy(name, run_id)
                # `cloud: any` reuses the cluster wherever the plan put it.
                provider = self.provider(existing.provider if cloud == ANY else cloud)
                return self._reuse(existing, provider, recipe), False
            return self._create(recipe, name, recipe_path, digest, usable), True

    def launches_priced(self, recipe: Recipe) -> bool:
        """Whether creating this recipe's cluster launches on a cloud that bills (or `cloud: any`)."""
        from cloudtrain.providers import ANY

        return recipe.resources.cloud == ANY or self.provider(recipe.resources.cloud).capabilities.priced

    def live_runs(self, name: str, except_run: str | None = None) -> list:  # noqa: ANN201
        """Runs on this cluster whose `cloudtrain run` process is still alive on this machine."""
        return [r for r in self.store.list_runs(cluster=name, limit=100)
                if r.status == RunStatus.RUNNING and r.id != except_run and r.driver_alive()]

    def refuse_if_busy(self, name: str, run_id: str) -> None:
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
        public_key = None
        allowed_cidr = self.config.ssh.allowed_cidr
        caps = provider.capabilities
        if caps.remote and not caps.takes_hosts:
            # A machine we create: it gets this cluster's key, and a firewall open to us only.
            from cloudtrain.remote import keys

            public_key = keys.cluster_key(name).public_openssh
            if allowed_cidr is None:
                # Never 0.0.0.0/0 by default: SSH is opened to the caller's own address only.
                from cloudtrain.netaddr import caller_cidr

                allowed_cidr = caller_cidr()
                self.reporter.info(f"SSH ingress limited to {allowed_cidr} (set ssh.allowed_cidr to change)")
        return InstanceSpec(
            cluster=name,
            owner=owner_id(),
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
            hosts=hosts,
        )

    def _create(self, recipe: Recipe, name: str, recipe_path: str | None, digest: str | None,
                usable: object = None) -> Cluster:
        if self.launches_priced(recipe):
            # Credentials first, before anything is written or created: the commonest first-run
            # mistake. `cloud: any` skips (and names) the clouds without them.
            from cloudtrain.cluster.planning import UsablePlan, plan_with_credentials

            if not isinstance(usable, UsablePlan):
                usable = plan_with_credentials(recipe, self.config)
            for cloud, why in usable.skipped:
                self.reporter.warn(f"skipping {cloud}: {why} (see `cloudtrain check {cloud}`)")
            self.reporter.info(f"plan: {usable.plan.summary()}")
            candidates, providers = list(usable.plan.candidates), usable.providers
        else:
            provider = self.provider(recipe.resources.cloud)
            candidates, providers = [None], {provider.name: provider}
        first = next(iter(providers.values()))
        spec = self._spec(recipe, name, first)
        tried: dict[str, Provider] = {}
        launched: list[Instance] = []
        try:
            launched, provider, hourly_per_node = self._launch(recipe, spec, candidates, providers, tried,
                                                               recipe_path, digest)
            launch_time = time.time()
            ids = [i.id for i in launched]
            # Billed from now: a launch that fails from here on still cost its seconds.
            self.store.bill(name, provider.name, ids, "running", hourly_per_node, at=launch_time)
            self._record_nodes(name, launched, spec.hosts)
            running = {i.id: i for i in self._wait_running(provider, ids)}
            nodes = [_merged(n, running[n.instance_id]) for n in self.store.get_nodes(name)]
            self.store.put_nodes(name, nodes)
            head = running[launched[0].id]
            self.store.upsert_cluster(
                name=name, status=ClusterStatus.UP, region=head.region or launched[0].region,
                zone=head.zone or launched[0].zone,
                instance_type=head.instance_type or launched[0].instance_type,
                # One price source: the plan's placement, per node.
                hourly_price=hourly_per_node * len(launched),
            )
        except BaseException as exc:
            self._cleanup_failed_launch(name, list(tried.values()), launched, exc)
            raise
        return Cluster(self.store.get_cluster(name), tuple(self.store.get_nodes(name)), provider)  # type: ignore[arg-type]

    def _launch(self, recipe: Recipe, spec: InstanceSpec, candidates: list, providers: dict[str, Provider],
                tried: dict[str, Provider], recipe_path: str | None,
                digest: str | None) -> tuple[list[Instance], Provider, float]:
        """Launch at the cheapest placement; on a capacity error fail over to the next one that the
        error does not rule out (a zone's, a region's, or the whole cloud's), across clouds for
        `cloud: any`. The state row names each attempt's cloud before its create call. Returns the
        instances, their provider and the placement's hourly price per node."""
        from cloudtrain.errors import CapacityError

        failures: list[str] = []
        ruled_out: set[tuple[str, str | None]] = set()  # (cloud, region or None for the whole cloud)
        for placement in candidates:
            cloud = placement.cloud if placement is not None else next(iter(providers))
            provider = providers[cloud]
            if placement is not None and ((cloud, None) in ruled_out or (cloud, placement.region) in ruled_out):
                continue
            attempt = spec if placement is None else replace(
                spec, region=placement.region, zone=placement.zone, instance_type=placement.instance_type,
                spot=placement.spot, max_run_s=_max_run_s(recipe, placement.hourly_price))
            # State first: if we die between the create call and the next line, `status --refresh`
            # and `down` still know where to look for instances tagged with this cluster.
            self.store.upsert_cluster(
                name=spec.cluster, provider=cloud, status=ClusterStatus.PROVISIONING, region=attempt.region,
                zone=attempt.zone, instance_type=attempt.instance_type, num_nodes=recipe.num_nodes,
                recipe_path=recipe_path, recipe_digest=digest, owner=spec.owner, last_error=None,
                spot=int(attempt.spot),
            )
            self.store.add_event(spec.cluster, "launch", f"{cloud}: launching {recipe.num_nodes} node(s)")
            tried[cloud] = provider
            try:
                instances = provider.launch(attempt, recipe.num_nodes)
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
            return instances, provider, (placement.hourly_price if placement is not None else 0.0)
        raise CapacityError(
            f"no capacity for {spec.cluster} in any of {len(failures)} placement(s): " + "; ".join(failures),
            hint="try another region, instance type or later",
        )

    def _cleanup_failed_launch(self, name: str, providers: list[Provider], launched: list[Instance],
                               exc: BaseException) -> None:
        """Whatever the providers created, by our records or by their tags, goes away now.

        If a provider cannot even be asked, the state row stays (status launch-failed) so that
        `down` or `gc` can finish the job later: forgetting it could hide a running instance.
        """
        from cloudtrain.errors import CloudtrainError

        self.store.add_event(name, "launch-failed", f"{type(exc).__name__}: {exc}")
        launched_ids = {i.id for i in launched}
        for provider in providers:
            try:
                ids = {i.id for i in provider.list_tagged(name) if i.state in _LIVE_STATES}
                if provider is providers[-1]:
                    ids |= launched_ids
                if ids:
                    self.reporter.warn(f"launch failed; terminating {len(ids)} instance(s) it created on {provider.name}")
                    provider.terminate(sorted(ids))
            except CloudtrainError as cleanup_error:
                self.store.upsert_cluster(name=name, provider=provider.name)
                self.store.set_cluster_status(name, ClusterStatus.LAUNCH_FAILED, error=cleanup_error.one_line())
                self.store.end_billing(name)
                self.reporter.warn(
                    f"could not check for instances left by the failed launch ({cleanup_error.one_line()}); "
                    f"run `cloudtrain down {name}` once the cloud is reachable"
                )
                return
        self.store.end_billing(name)
        self.store.delete_cluster(name)

    def _record_nodes(self, name: str, instances: Sequence[Instance], hosts: Sequence[HostSpec]) -> None:
        records = [
            node_record(name, rank, inst, hosts[rank] if rank < len(hosts) else None)
            for rank, inst in enumerate(instances)
        ]
        self.store.put_nodes(name, records)

    def _wait_running(self, provider: Provider, ids: list[str]) -> list[Instance]:
        """Poll describe with backoff until every instance runs; the only wait on instance state."""
        deadline = time.monotonic() + self.wait_timeout_s
        delay = 0.2
        while True:
            instances = provider.describe(ids)
            states = {i.id: i.state for i in instances}
            if all(s is InstanceState.RUNNING for s in states.values()):
                return instances
            bad = {k: v for k, v in states.items() if v in (InstanceState.TERMINATED, InstanceState.STOPPED)}
            if bad:
                raise ProviderError(
                    "instances stopped or terminated while starting: "
                    + ", ".join(f"{k} ({v.value})" for k, v in bad.items())
                )
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"instances not running after {self.wait_timeout_s:.0f}s: "
                    + ", ".join(f"{k} ({v.value})" for k, v in states.items())
                )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    # stop / start / refresh ----------------------------------------------------------------------

    def stop(self, name: str) -> Cluster:
        cluster = self.get(name)
        check_stop_possible(cluster.provider, bool(cluster.record.spot), name)
        with cluster_lock(name):
            ids = [n.instance_id for n in cluster.nodes]
            cluster.provider.stop(ids)
            if cluster.provider.capabilities.priced:
                # Compute stops billing; the disks do not.
                from cloudtrain.cost import disk_hourly

                self.store.bill(name, cluster.provider.name, ids, "stopped", disk_hourly(cluster.provider.name))
            self.store.set_cluster_status(name, ClusterStatus.STOPPED)
            self.store.add_event(name, "stop", "stopped all nodes")
            # A stopped machine runs nothing: its jobs ended with it.
            from cloudtrain.run.jobstate import end_open_jobs

            end_open_jobs(self.store, name)
            return self._refresh_locked(name, cluster.provider)

    def start(self, name: str) -> Cluster:
        cluster = self.get(name)
        with cluster_lock(name):
            self._start_locked(cluster.record, cluster.provider, list(cluster.nodes))
            return self._refresh_locked(name, cluster.provider)

    def _start_locked(self, record: ClusterRecord, provider: Provider, nodes: Sequence[NodeRecord]) -> None:
        if not provider.capabilities.supports_stop:
            return
        ids = [n.instance_id for n in nodes]
        provider.start(ids)
        if provider.capabilities.priced:
            self.store.bill(record.name, provider.name, ids, "running", record.hourly_price / max(1, len(ids)))
        # A restarted cloud VM usually has a new public IP; the refresh that follows records it.
        self._wait_running(provider, ids)
        # It boots again: connecting gets the patience of a fresh launch.
        self.store.put_nodes(record.name, [replace(n, started_at=time.time()) for n in self.store.get_nodes(record.name)])
        self.store.set_cluster_status(record.name, ClusterStatus.UP)
        self.store.add_event(record.name, "start", "started all nodes")

    def refresh(self, name: str) -> Cluster:
        cluster = self.get(name)
        with cluster_lock(name):
            return self._refresh_locked(name, cluster.provider)

    def _refresh_locked(self, name: str, provider: Provider) -> Cluster:
        """Reconcile state with the provider: node states, IPs, and instances found only by tag."""
        record = self.store.get_cluster(name)
        assert record is not None
        nodes = {n.instance_id: n for n in self.store.get_nodes(name)}
        described = {i.id: i for i in provider.describe(list(nodes))} if nodes else {}
        for inst in provider.list_tagged(name):
            described.setdefault(inst.id, inst)
        # Known nodes keep their rank; instances found only by tag are appended after them.
        known = sorted((i for i in described if i in nodes), key=lambda i: nodes[i].rank)
        found = sorted(i for i in described if i not in nodes)
        updated = [_merged(nodes[i], described[i]) for i in known]
        updated += [node_record(name, len(updated) + k, described[i]) for k, i in enumerate(found)]
        live = [n for n in updated if n.state != InstanceState.TERMINATED.value]
        self.store.put_nodes(name, updated)
        status = record.status
        if not live and record.status in (ClusterStatus.UP, ClusterStatus.STOPPED, ClusterStatus.PROVISIONING):
            status = ClusterStatus.TERMINATED
        elif live and all(n.state == InstanceState.STOPPED.value for n in live):
            status = ClusterStatus.STOPPED
        elif live and all(n.state == InstanceState.RUNNING.value for n in live) and record.status != ClusterStatus.PROVISIONING:
            status = ClusterStatus.UP
        if status != record.status:
            self.store.set_cluster_status(name, status)
        return Cluster(self.store.get_cluster(name), tuple(self.store.get_nodes(name)), provider)  # type: ignore[arg-type]

    # down ----------------------------------------------------------------------------------------

    def down(self, name: str, forget: bool = False) -> bool:
        """End the cluster's jobs, terminate every instance and forget it. False if there was nothing.

        On machines that outlive the cluster (local, ssh) every job is ended and our files removed
        first; if a node cannot be reached the state row stays (status down-failed) so that a
        later `down` finishes the job, unless `forget` says to drop it anyway.
        """
        record = self.store.get_cluster(name)
        if record is None:
            return False
        provider = self.provider(record.provider)
        with cluster_lock(name):
            nodes = self.store.get_nodes(name)
            if not provider.capabilities.owns_machines:
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
            ids = {n.instance_id for n in nodes} | {i.id for i in provider.list_tagged(name)}
            if ids:
                provider.terminate(sorted(ids))
            elif provider.capabilities.remote and not provider.capabilities.takes_hosts:
                # No instance, but a launch killed halfway may have left billed resources (an
                # Azure static IP, a security group): terminate would have released them.
                for kept in provider.release_resources(name):
                    self.reporter.warn(f"kept for now: {kept.kind} {kept.id} ({kept.note})")
            if provider.capabilities.remote:
                from cloudtrain.remote import keys

                for instance_id in ids:
                    keys.KnownHosts().forget(instance_id)
                keys.delete_cluster_key(name)
                keys.remove_ssh_config(name)
            self.store.end_billing(name)
            self.store.add_event(name, "down", f"terminated {len(ids)} instance(s)")
            # A new cluster of the same name starts with no jobs of this one.
            self.store.delete_jobs(name)
            self.store.delete_cluster(name)
        return True

def _max_run_s(recipe: Recipe, hourly_per_node: float) -> float | None:
    """The budget as running seconds at this placement's price: a cloud-side backstop for the
    on-node watchdog where the cloud has one (InstanceSpec.max_run_s)."""
    from cloudtrain.run.watchdog import budget_limit

    limit = budget_limit(recipe.budget, hourly_per_node * recipe.num_nodes)
    return limit[0] if limit is not None else None


def check_stop_possible(provider: Provider, spot: bool, name: str | None = None) -> None:
    """Refuse a stop that cannot happen before it is needed: never leave a billed machine running."""
    what = f"cluster {name!r}" if name else "this run"
    if not provider.capabilities.supports_stop:
        raise NotAvailableError(
            f"cloud {provider.name} cannot stop instances ({what})", hint="use `cloudtrain down` (or --down) instead"
        )
    if spot and not provider.capabilities.stop_spot:
        raise NotAvailableError(
            f"{provider.name} spot instances cannot be stopped, only terminated ({what} is spot)",
            hint="use --down (results are collected first) or --keep",
        )
