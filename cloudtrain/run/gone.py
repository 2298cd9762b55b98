"""The one rule for "is the attempt's machine gone?" (issue 36.1), for a recovering run
(run/recover.py, its watcher run/recover_watch.py) and a sweep (sweep/backend.py) alike.

What the cloud says about a cluster goes in (lifecycle's refresh: describe and list by tag, which
also puts the answer in the ledger); a typed reason comes out, or None while the machines are there
or still booting. Each caller decides what a reason means to it: a recovering run relaunches on
LEAVING or ENDED and leaves TAKEN_DOWN to the pipeline (another command's `down` is not a loss to
recover from), a sweep retries the attempt on any of them. Before this module each had its own
rule with its own set of states, and they disagreed on a cluster still provisioning and on one
whose machines the cloud no longer lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Cluster, Lifecycle

# Node states that mean the machine is gone or on its way: a spot reclaim, a lost host, a watchdog's
# lease end. A node still "stopping" leaves the cluster UP in state for a while, but the job it
# killed did not fail on its own. (The values of providers.base.InstanceState.)
GOING = frozenset({"stopping", "stopped", "terminated"})


class GoneKind(Enum):
    TAKEN_DOWN = "taken down"  # state has no row for it: a `down` (this process's or another's) removed it
    LEAVING = "leaving"  # the cloud reports some of its machines stopping, stopped or terminated
    ENDED = "ended"  # the cluster itself is no longer up (or the cloud lists none of its machines)


@dataclass(frozen=True)
class Gone:
    """Why a cluster's machines are gone, as the cloud (or state) said it."""

    kind: GoneKind
    cluster: str
    provider: str = ""
    leaving: tuple[tuple[str, str], ...] = ()  # (instance id, state) of each node the cloud reports going
    status: str = ""  # the cluster's status in state after the refresh

    @property
    def state(self) -> str:
        """One word for it: the first leaving node's state, else the cluster's status."""
        if self.kind is GoneKind.TAKEN_DOWN:
            return "taken down"
        return self.leaving[0][1] if self.leaving else self.status

    def __str__(self) -> str:
        # The cloud's words, said once (run.json's attempt reason, the recover phase line).
        if self.kind is GoneKind.TAKEN_DOWN:
            return f"cluster {self.cluster} was taken down"
        what = ", ".join(f"{iid} {state}" for iid, state in self.leaving) or f"cluster {self.status}"
        return f"{self.provider} reports {what}"


def judge(cluster: Cluster) -> Gone | None:
    """The rule: gone when any node is going, or the cluster is neither up with machines nor still
    provisioning (a launch in progress is lifecycle's to finish or clean up, not a loss)."""
    from cloudtrain.state import ClusterStatus

    leaving = tuple((n.instance_id, n.state) for n in cluster.nodes if n.state in GOING)
    status = cluster.record.status
    if not leaving and (status == ClusterStatus.PROVISIONING or (status == ClusterStatus.UP and cluster.nodes)):
        return None
    kind = GoneKind.LEAVING if leaving else GoneKind.ENDED
    return Gone(kind, cluster.record.name, cluster.provider.name, leaving, str(status))


def ask(lc: Lifecycle, name: str, warn: Callable[[str], None]) -> Gone | None:
    """Ask the cloud once about cluster `name` and judge its answer. No row in state: TAKEN_DOWN
    (without a cloud call). A cloud that does not answer is said (`warn`) and counts as not gone:
    nobody can tell, and the next look asks again."""
    if lc.store.get_cluster(name) is None:
        return Gone(GoneKind.TAKEN_DOWN, name)
    try:
        return judge(lc.refresh(name))
    except CloudtrainError as exc:
        warn(f"could not ask the cloud about {name}: {exc.one_line()}")
        return None
