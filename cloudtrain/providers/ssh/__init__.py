"""The `ssh` provider: machines that already exist, listed in the recipe's `resources.hosts`.

Nothing is created, stopped or deleted: `launch` turns hosts into Instance records and
`terminate` succeeds without touching the machine (lifecycle removes ~/.cloudtrain/<cluster> on
it; we never power a host off). Reachability and GPUs are checked by lifecycle with
`cloudtrain.remote.facts.probe_host`, because providers never open SSH.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cloudtrain.config import Config
from cloudtrain.errors import NotAvailableError, ProviderError
from cloudtrain.providers.base import (
    Capabilities,
    Traits,
    ClusterResource,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
)
from cloudtrain.remote.keys import current_user


def instance_id(cluster: str, rank: int, address: str) -> str:
    return f"ssh-{cluster}-{rank}-{address}"


class SshProvider:
    name = "ssh"
    capabilities = Capabilities(supports_stop=False, supports_spot=False, remote=True, priced=False,
                                owns_machines=False, takes_hosts=True, cloud_fields=False)
    traits = Traits(remote=True, priced=False)

    def __init__(self, config: Config) -> None:
        self.config = config
        # Records handed out by launch in this process, so describe can repeat them (the ids do
        # not encode port or user). Another process gets state only; lifecycle keeps addresses.
        self._launched: dict[str, Instance] = {}

    # Nothing here is regional, and nothing is created besides the nodes themselves.
    default_region = None

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        return []

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        return []

    def check_credentials(self) -> CredentialStatus:
        return CredentialStatus("ssh", True, "uses the key in each host entry, else your ssh-agent/default keys")

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        if count > len(spec.hosts):
            raise ProviderError(f"{count} node(s) requested but only {len(spec.hosts)} host(s) listed",
                                hint="add hosts to resources.hosts or lower num_nodes")
        now = time.time()
        instances = [
            Instance(
                id=instance_id(spec.cluster, rank, host.address),
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
        self._launched.update({i.id: i for i in instances})
        return instances

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        # Existing machines are always "running" as far as the provider knows; whether one
        # answers is the probe's business (remote.facts.probe_host).
        return [self._launched.get(i) or Instance(id=i, cluster="", state=InstanceState.RUNNING) for i in ids]

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        # Nothing is created on a host's behalf, so nothing can leak for `gc` to find.
        return []

    def stop(self, ids: Sequence[str]) -> None:
        raise NotAvailableError("ssh hosts are not stopped by cloudtrain", hint="use `cloudtrain down` instead")

    def start(self, ids: Sequence[str]) -> None:
        return None

    def terminate(self, ids: Sequence[str]) -> None:
        return None

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        # The hosts are the user's: cloudtrain never powers them off, by itself or by a watchdog.
        raise NotAvailableError("ssh hosts are your own machines: cloudtrain never stops or deletes them",
                                hint="end the work with `cloudtrain cancel` or `cloudtrain down`")


def make_provider(config: Config) -> SshProvider:
    return SshProvider(config)
