"""The `ssh` provider: machines that already exist, listed in the recipe's `resources.hosts`.

Nothing is created, stopped or deleted, so it implements GivenHosts only: `given_nodes` turns hosts
into Instance records (lifecycle ends our jobs and removes ~/.cloudtrain/<cluster> on them at
`down`; we never power a host off, by ourselves or by a watchdog). Reachability and GPUs are
checked by lifecycle with `cloudtrain.remote.facts.probe_host`, because providers never open SSH.
"""

from __future__ import annotations

import time

from cloudtrain.config import Config
from cloudtrain.errors import ProviderError
from cloudtrain.providers.base import (
    Traits,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
)
from cloudtrain.remote.keys import current_user


def instance_id(cluster: str, rank: int, address: str, port: int = 22) -> str:
    # The port too: two machines behind one address (a bastion's forwarded ports) are two
    # machines, with their own host key pins and remembered homes.
    return f"ssh-{cluster}-{rank}-{address}" + (f"-p{port}" if port != 22 else "")


class SshProvider:
    name = "ssh"
    traits = Traits(remote=True, priced=False)

    def __init__(self, config: Config) -> None:
        self.config = config

    # Nothing here is regional.
    default_region = None

    def check_credentials(self) -> CredentialStatus:
        return CredentialStatus("ssh", True, "uses the key in each host entry, else your ssh-agent/default keys")

    def given_nodes(self, spec: InstanceSpec, count: int) -> list[Instance]:
        if count > len(spec.hosts):
            raise ProviderError(f"{count} node(s) requested but only {len(spec.hosts)} host(s) listed",
                                hint="add hosts to resources.hosts or lower num_nodes")
        now = time.time()
        return [
            Instance(
                id=instance_id(spec.cluster, rank, host.address, host.port),
                cluster=spec.cluster,
                state=InstanceState.RUNNING,
                instance_type="existing",
                region="ssh",
                public_ip=host.address,
                private_ip=host.address,
                ssh_user=host.user or spec.ssh_user or current_user(),
                ssh_port=host.port,
                launched_at=now,
            )
            for rank, host in enumerate(spec.hosts[:count])
        ]


def make_provider(config: Config) -> SshProvider:
    return SshProvider(config)
