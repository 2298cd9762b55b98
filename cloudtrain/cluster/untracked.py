"""`down NAME` for a name this machine's state does not hold.

A lost state database, a second laptop or CI runner of the same owner, a CLI killed before its
first row: the cloud may still run NAME's machines, and "nothing to do" would leave them billing.
So the clouds are asked by tag first. A name that no cloud holds is either one that was here and is
gone (history in the state: runs, events, billing; `down` is idempotent) or a mistake (a typo of a
live cluster's name), which must never read as success.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cloudtrain.config import Config
from cloudtrain.errors import CloudtrainError
from cloudtrain.providers.base import CreatesMachines, InstanceState, machines
from cloudtrain.state import StateStore

# What may still bill or run: terminated (and shutting-down-to-terminated) machines are done.
_LIVE = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING, InstanceState.STOPPED}


class Outcome(enum.Enum):
    TERMINATED = "terminated"  # machines carrying NAME's tag were found and ended
    LIVE = "live"  # machines carrying NAME's tag have a fresh liveness mark: left alone
    ALREADY_DOWN = "already-down"  # NAME was here before, nothing of it is left
    UNKNOWN = "unknown"  # never here, and no cloud that could be asked holds it


@dataclass(frozen=True)
class UntrackedDown:
    outcome: Outcome
    ended: dict[str, list[str]] = field(default_factory=dict)  # cloud -> instance ids terminated
    released: dict[str, list[str]] = field(default_factory=dict)  # cloud -> resources released
    kept: list[str] = field(default_factory=list)  # resources a cloud had to keep for now, with why
    not_asked: dict[str, str] = field(default_factory=dict)  # configured cloud -> why it could not be asked
    live: dict[str, str] = field(default_factory=dict)  # cloud -> the evidence of a fresh mark, left alone


def down_untracked(store: StateStore, config: Config, name: str, include_live: bool = False) -> UntrackedDown:
    """End whatever carries NAME's tag in every cloud whose machines cloudtrain creates and whose
    credentials work; then say whether NAME was ever known here. Machines with a fresh liveness
    mark are a cloudtrain command's elsewhere (another state of this owner): left alone, as `gc`
    leaves them, unless `include_live`."""
    import time

    from cloudtrain.cluster.liveness import evidence, is_live

    from cloudtrain.providers import available, get_provider, implements

    ended: dict[str, list[str]] = {}
    released: dict[str, list[str]] = {}
    kept: list[str] = []
    not_asked: dict[str, str] = {}
    live: dict[str, str] = {}
    for cloud in available():
        if not implements(cloud, CreatesMachines):
            continue
        try:
            provider = get_provider(cloud, config)
            creds = provider.check_credentials()
            if not creds.ok:
                if creds.set_up:  # configured, but not usable now: it may hold NAME's machines
                    not_asked[cloud] = creds.detail
                # Not set up here: it cannot hold anything this user made from this machine's config.
                continue
            tagged = [i for i in machines(provider).list_tagged(name) if i.state in _LIVE]
            marks = [i.alive_at for i in tagged if i.alive_at is not None]
            now = time.time()
            if marks and is_live(max(marks), now) and not include_live:
                live[cloud] = f"{', '.join(sorted(i.id for i in tagged))} {evidence(max(marks), now)}"
                continue
            found = [i.id for i in tagged]
            if found:
                machines(provider).terminate(sorted(found))
                ended[cloud] = sorted(found)
            resources = machines(provider).list_resources(name)
            if resources:
                kept += [f"{k.kind} {k.id} on {cloud} ({k.note})" for k in machines(provider).release_resources(name)]
                released[cloud] = [f"{r.kind} {r.id}" for r in resources]
        except CloudtrainError as exc:
            not_asked[cloud] = exc.one_line()
    if live:
        return UntrackedDown(Outcome.LIVE, ended, released, kept, not_asked, live)
    if ended or released:
        store.add_event(name, "down", "not in state; ended by tag: " + "; ".join(
            f"{cloud}: {', '.join(ids)}" for cloud, ids in {**released, **ended}.items()))
        return UntrackedDown(Outcome.TERMINATED, ended, released, kept, not_asked)
    known = bool(store.list_events(name) or store.list_runs(cluster=name, limit=1) or store.billing(cluster=name))
    return UntrackedDown(Outcome.ALREADY_DOWN if known else Outcome.UNKNOWN, not_asked=not_asked)


def near_names(store: StateStore, name: str) -> list[str]:
    """Names a typo of NAME may have meant: the clusters in state, then those seen before."""
    live = [c.name for c in store.list_clusters()]
    past = sorted({e.cluster for e in store.list_events() if e.cluster and e.cluster not in live})
    return live + past
