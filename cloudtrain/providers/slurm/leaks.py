"""Our Slurm jobs that nothing follows any more, for `cloudtrain gc`: on every Slurm cluster in
state (through its login node), the queued or running jobs whose comment names this owner
(`cloudtrain:OWNER:CLUSTER`, templates/slurm_submit.sh) and whose submit script on the login node
is gone (its login node rebooted, its directory removed) or whose cluster is no longer in state.
Such a job holds an allocation until its time limit; `gc --yes` cancels it with scancel.
"""

from __future__ import annotations

import shlex
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudtrain.errors import RemoteError
from cloudtrain.providers.slurm.batch import job_name

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from cloudtrain.providers.leak import Leak, LoginNode, OpenLogin

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


def find(clusters: Sequence[str], tracked: Collection[str], open_login: OpenLogin, cloud: str,
         owner: str | None) -> list[Leak]:
    """Leaks on every Slurm cluster in state (`clusters`), each seen from its login node, which
    `open_login` opens (the caller's connection: a provider never opens SSH); a login node that does
    not answer raises RemoteError naming it."""
    from cloudtrain.providers.leak import Item, Leak

    leaks: list[Leak] = []
    seen: set[str] = set()
    for name in clusters:
        with open_login(name) as login:
            if login is None:
                continue  # no node recorded: nothing to ask
            for job in _queue(login):
                found = job.owner_and_cluster
                if job.id in seen or found is None or (owner is not None and found[0] != owner):
                    continue
                seen.add(job.id)
                why = _why_leaked(job, found[1], tracked, login, name)
                if why is not None:
                    leaks.append(Leak(cloud, found[1], "queued-job", (job.id,), why, (Item(
                        "queued-job", job.id, name, f"{job.state} ({job.name}) via {login.address}", 0.0,
                        "not billed by cloudtrain (your cluster)"),)))
    return leaks


def cancel(leak: Leak, open_login: OpenLogin) -> None:
    """scancel a leaked job, through the login node of the cluster it was found on (its item's
    `region`, as find records it)."""
    found_on = leak.items[0].region if leak.items else None
    with open_login(found_on) if found_on else nullcontext() as login:
        if login is None:
            raise RemoteError(f"slurm job {', '.join(leak.ids)}: cluster {found_on} is no longer in state")
        login.transport.run(["scancel", *leak.ids], what="cancelling the slurm job")


def _queue(login: LoginNode) -> list[QueuedJob]:
    result = login.transport.run(["sh", "-c", "squeue -h -o " + shlex.quote("%i|%j|%T|%k")],
                                 what="listing the slurm queue")
    return parse_queue(result.text)


def _why_leaked(job: QueuedJob, cluster: str, tracked: Collection[str], login: LoginNode,
                login_cluster: str) -> str | None:
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
