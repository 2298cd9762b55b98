"""Our Slurm jobs that nothing follows any more, for `cloudtrain gc`: on every Slurm cluster in
state (through its login node), the queued or running jobs whose comment names this owner
(`cloudtrain:OWNER:CLUSTER`, templates/slurm_submit.sh) and whose submit script on the login node
is gone (its login node rebooted, its directory removed) or whose cluster is no longer in state.
Such a job holds an allocation until its time limit; `gc --yes` cancels it with scancel.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudtrain.errors import RemoteError
from cloudtrain.providers.slurm.batch import job_name

if TYPE_CHECKING:
    from cloudtrain.providers.leak import Leak
    from cloudtrain.cluster.nodes import Node
    from cloudtrain.config import Config
    from cloudtrain.providers.base import Provider
    from cloudtrain.state import StateStore

_PREFIX = "cloudtrain:"
_NAME_PREFIX = job_name("")


@dataclass(frozen=True)
class QueuedJob:
    id: str
    name: str
    state: str
    comment: str

    @property
    def owner_and_cluster(self) -> tuple[str, str] | None:
        if not self.comment.startswith(_PREFIX):
            return None
        owner, _, cluster = self.comment[len(_PREFIX):].partition(":")
        return (owner, cluster) if cluster else None

    @property
    def cloudtrain_job(self) -> str | None:
        return self.name[len(_NAME_PREFIX):] if self.name.startswith(_NAME_PREFIX) else None


def parse_queue(text: str) -> list[QueuedJob]:
    """`squeue -h -o '%i|%j|%T|%k'` lines (the node's answer is data: odd lines are skipped)."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[0]:
            jobs.append(QueuedJob(*parts))
    return jobs


def find(store: StateStore, config: Config, provider: Provider, owner: str | None) -> list[Leak]:
    """Leaks on every Slurm cluster in state; raises RemoteError naming a login node that did not answer."""
    from cloudtrain.providers.leak import Item, Leak
    from cloudtrain.cluster.nodes import close_all, connect

    clusters = [c for c in store.list_clusters() if c.provider == provider.name]
    tracked = {c.name for c in store.list_clusters()}
    leaks: list[Leak] = []
    seen: set[str] = set()
    for record in clusters:
        nodes = connect(store.get_nodes(record.name)[:1], provider, config)
        try:
            login = nodes[0]
            for job in _queue(login):
                found = job.owner_and_cluster
                if job.id in seen or found is None or (owner is not None and found[0] != owner):
                    continue
                seen.add(job.id)
                why = _why_leaked(job, found[1], tracked, login, record.name)
                if why is not None:
                    leaks.append(Leak(provider.name, found[1], "queued-job", (job.id,), why, (Item(
                        "queued-job", job.id, record.name, f"{job.state} ({job.name}) via {login.address}", 0.0,
                        "not billed by cloudtrain (your cluster)"),)))
        finally:
            close_all(nodes)
    return leaks


def cancel(store: StateStore, config: Config, provider: Provider, leak: Leak) -> None:
    """scancel a leaked job, through the login node of the cluster it was found on."""
    from cloudtrain.cluster.nodes import close_all, connect

    found_on = leak.items[0].region if leak.items else None
    nodes = connect(store.get_nodes(found_on)[:1] if found_on else [], provider, config)
    if not nodes:
        raise RemoteError(f"slurm job {', '.join(leak.ids)}: cluster {found_on} is no longer in state")
    try:
        nodes[0].transport.run(["scancel", *leak.ids], what="cancelling the slurm job")
    finally:
        close_all(nodes)


def _queue(login: Node) -> list[QueuedJob]:
    result = login.transport.run(["sh", "-c", "squeue -h -o " + shlex.quote("%i|%j|%T|%k")],
                                 what="listing the slurm queue")
    return parse_queue(result.text)


def _why_leaked(job: QueuedJob, cluster: str, tracked: set[str], login: Node, login_cluster: str) -> str | None:
    if cluster not in tracked:
        return "cluster not in state"
    ct_job = job.cloudtrain_job
    if ct_job is None or cluster != login_cluster:
        return None  # another cluster's job: judged when that cluster's login node is listed
    from cloudtrain.remote import jobs

    status = jobs.status(login.transport, login.layout, ct_job)
    if status.finished or status.pid is None:
        return f"its submit script on the login node is {status.state}"
    return None
