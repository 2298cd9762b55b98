"""Finding (and removing) what cloudtrain created but no longer tracks: leaked instances and
leftover per-cluster resources, found by their `cloudtrain-cluster` tag, not from local state.

State can be lost (a deleted $CLOUDTRAIN_HOME, another laptop, a crash between create and record);
the tags cannot. Only this user's resources are considered (providers filter by owner tag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cloudtrain.config import Config
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import Instance, InstanceState, Provider
from cloudtrain.state import StateStore


def gc_clouds() -> tuple[str, ...]:
    """Clouds whose machines cloudtrain creates; hosts from a recipe are the user's, never collected."""
    from cloudtrain.providers import available, capabilities

    return tuple(name for name in available() if not capabilities(name).takes_hosts)


@dataclass(frozen=True)
class Leak:
    cloud: str
    cluster: str
    kind: str  # "instance" | "resources"
    ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Skipped:
    cloud: str
    reason: str


def find_leaks(store: StateStore, config: Config, clouds: Sequence[str] | None = None) -> tuple[list[Leak], list[Skipped]]:
    clouds = gc_clouds() if clouds is None else clouds
    leaks: list[Leak] = []
    skipped: list[Skipped] = []
    tracked = {c.name: c for c in store.list_clusters()}
    for cloud in clouds:
        try:
            provider = get_provider(cloud, config)
            creds = provider.check_credentials()
            if not creds.ok:
                skipped.append(Skipped(cloud, creds.detail))
                continue
            leaks += _instance_leaks(cloud, provider, store, tracked)
            by_cluster: dict[str, list[str]] = {}
            for resource in provider.list_resources():
                if resource.cluster not in tracked:
                    by_cluster.setdefault(resource.cluster, []).append(
                        f"{resource.kind} {resource.id}" + (f" in {resource.region}" if resource.region else ""))
            for cluster, items in sorted(by_cluster.items()):
                leaks.append(Leak(cloud, cluster, "resources", tuple(items), "resources of a cluster not in state"))
        except CloudtrainError as exc:
            skipped.append(Skipped(cloud, exc.one_line()))
    return leaks, skipped


def _instance_leaks(cloud: str, provider: Provider, store: StateStore, tracked: dict) -> list[Leak]:
    by_cluster: dict[str, list[Instance]] = {}
    for inst in provider.list_tagged(None):
        if inst.state is not InstanceState.TERMINATED:
            by_cluster.setdefault(inst.cluster, []).append(inst)
    leaks = []
    for cluster, instances in sorted(by_cluster.items()):
        record = tracked.get(cluster)
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
        leaks.append(Leak(cloud, cluster, "instance", tuple(sorted(i.id for i in instances)), reason))
    return leaks


def collect(leaks: Sequence[Leak], config: Config) -> list[str]:
    """Terminate leaked instances and release leftover resources; return what was done."""
    done = []
    providers: dict[str, Provider] = {}
    for leak in leaks:
        provider = providers.setdefault(leak.cloud, get_provider(leak.cloud, config))
        if leak.kind == "instance":
            provider.terminate(list(leak.ids))
            done.append(f"{leak.cloud}: terminated {', '.join(leak.ids)} ({leak.cluster})")
        kept = provider.release_resources(leak.cluster)
        note = f"; kept for now: {', '.join(f'{k.kind} {k.id} ({k.note})' for k in kept)}" if kept else ""
        if leak.kind == "resources" or kept:
            done.append(f"{leak.cloud}: released resources of {leak.cluster}{note}")
    return done
