"""The `slurm` provider: a Slurm cluster reached through its login node.

Slurm is a scheduler, not a machine API. The recipe names the login node (its one `hosts` entry,
the same fields as `ssh`) and how to queue (`resources.slurm`: partition, account, qos, time;
`num_nodes`; `accelerators` as `--gres=gpu:N`). The cluster cloudtrain keeps in state is the login
node: the workdir is synced there, into the login user's home, which on a Slurm cluster is the
shared filesystem every compute node mounts. A run is ONE batch job (`batch_job`): the login node
runs templates/slurm_submit.sh as a detached runner job, which submits with sbatch, streams the
job's output into the run's log, says why a pending job waits, and cancels with scancel when the
run is interrupted, cancelled or the cluster goes `down`. Nothing is created, stopped or deleted on
the cluster itself; cloudtrain never powers a node off. It implements GivenHosts (the login node)
and Schedules (the batch job, its plan, its leaked jobs) only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from cloudtrain.config import Config
from cloudtrain.errors import ProviderError
from cloudtrain.providers.base import (
    Traits,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
    owner_id,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from cloudtrain.providers.leak import Leak, OpenLogin
    from cloudtrain.providers.scheduling import ScheduledRecipe


def instance_id(cluster: str, address: str) -> str:
    return f"slurm-{cluster}-login-{address}"


class SlurmProvider:
    name = "slurm"
    # accelerators (GPUs per node) become `--gres=gpu:N`; budget.max_hours becomes the job's time
    # limit (`--time`): Slurm enforces it, no watchdog needed.
    traits = Traits(remote=True, priced=False, honours_fields=("accelerators",), limits_time=True)

    def __init__(self, config: Config) -> None:
        self.config = config

    default_region = None

    def check_credentials(self) -> CredentialStatus:
        return CredentialStatus("slurm", True, "uses the login node's host entry (key, else your ssh-agent/default keys)")

    def given_nodes(self, spec: InstanceSpec, count: int) -> list[Instance]:
        """The login node, whatever `count` is: the nodes are allocated per run by Slurm."""
        if len(spec.hosts) != 1:
            raise ProviderError(f"cloud slurm takes one host, its login node; {len(spec.hosts)} listed",
                                hint="list the login node under resources.hosts; num_nodes is the allocation")
        from cloudtrain.remote.keys import current_user

        host = spec.hosts[0]
        login = Instance(
            id=instance_id(spec.cluster, host.address), cluster=spec.cluster, state=InstanceState.RUNNING,
            instance_type="slurm-login", region="slurm", public_ip=host.address, private_ip=host.address,
            ssh_user=host.user or spec.ssh_user or current_user(), ssh_port=host.port, launched_at=time.time(),
        )
        return [login]

    @staticmethod
    def plan_lines(recipe: ScheduledRecipe) -> list[str]:
        """What `plan` says: where the batch job would queue, its sbatch options, its time limit and cost."""
        from cloudtrain.providers.slurm.plan import plan_lines

        return plan_lines(recipe)

    @staticmethod
    def plan_document(recipe: ScheduledRecipe) -> dict[str, Any]:
        from cloudtrain.providers.slurm.plan import plan_document

        return plan_document(recipe)

    def leaked_jobs(self, clusters: Sequence[str], tracked: Collection[str], open_login: OpenLogin) -> list[Leak]:
        """`gc`: our jobs still queued on a Slurm cluster in state that nothing follows (leaks.py),
        through the login nodes the caller opens."""
        from cloudtrain.providers.base import listing_owner
        from cloudtrain.providers.slurm.leaks import find

        return find(clusters, tracked, open_login, self.name, listing_owner(self.config))

    def cancel_leaked(self, leak: Leak, open_login: OpenLogin) -> None:
        """`gc --yes`: scancel the job through the login node it was found through."""
        from cloudtrain.providers.slurm.leaks import cancel

        cancel(leak, open_login)

    def batch_job(self, recipe: ScheduledRecipe, run: str, setup: str | None, job_id: str, cluster: str) -> str:
        """The script the login node runs for one run: one sbatch job doing `setup` then `run` on
        every allocated node (templates/slurm_submit.sh)."""
        from cloudtrain.providers.slurm.batch import submit_script

        return submit_script(recipe, run, setup, job_id, owner_id(self.config), cluster)


def make_provider(config: Config) -> SlurmProvider:
    return SlurmProvider(config)
