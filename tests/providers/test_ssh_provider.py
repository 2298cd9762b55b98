"""The ssh provider: existing hosts become Instances; nothing is created, stopped or deleted."""

from __future__ import annotations

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import ProviderError
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import (
    Backend,
    CreatesMachines,
    GivenHosts,
    HostSpec,
    InstanceSpec,
    InstanceState,
    Schedules,
    SelfStopping,
    StopsMachines,
    machines,
    supports,
)
from cloudtrain.remote.facts import probe_host
from cloudtrain.remote.ssh import open_transport
from cloudtrain.testing.sshd import SshdFactory


def _spec(*hosts: HostSpec) -> InstanceSpec:
    return InstanceSpec(cluster="lab", owner="me", hosts=hosts)


def test_given_hosts_become_running_instances() -> None:
    provider = get_provider("ssh", Config())
    assert isinstance(provider, Backend) and supports(provider, GivenHosts)
    assert provider.traits.remote and not provider.traits.priced
    hosts = (HostSpec("10.0.0.5", user="ubuntu"), HostSpec("gpu-2.lab", port=2222), HostSpec("unused"))
    nodes = provider.given_nodes(_spec(*hosts), 2)
    assert [n.id for n in nodes] == ["ssh-lab-0-10.0.0.5", "ssh-lab-1-gpu-2.lab-p2222"]  # a non-default port is part of the machine
    assert all(n.state is InstanceState.RUNNING and n.cluster == "lab" for n in nodes)
    assert (nodes[0].public_ip, nodes[0].ssh_user, nodes[0].ssh_port) == ("10.0.0.5", "ubuntu", 22)
    assert (nodes[1].public_ip, nodes[1].ssh_port) == ("gpu-2.lab", 2222) and nodes[1].ssh_user
    assert [n.id for n in provider.given_nodes(_spec(*hosts), 2)] == [n.id for n in nodes]  # same hosts, same ids


@pytest.mark.parametrize("capability", [CreatesMachines, StopsMachines, SelfStopping, Schedules])
def test_nothing_is_created_stopped_or_scheduled(capability: type) -> None:
    assert not supports(get_provider("ssh", Config()), capability)


def test_too_few_hosts_and_what_lifecycle_sees() -> None:
    provider = get_provider("ssh", Config())
    with pytest.raises(ProviderError, match="only 1 host"):
        provider.given_nodes(_spec(HostSpec("a")), 2)
    # Lifecycle's one flow, through machines(): the hosts are taken, always running, never listed
    # by tag (nothing of ours leaks), and terminating them touches nothing.
    seen = machines(provider)
    launched = seen.launch(_spec(HostSpec("10.1.1.1", port=2200)), 1)
    assert [i.state for i in seen.describe([launched[0].id])] == [InstanceState.RUNNING]
    assert seen.list_tagged("lab") == [] and seen.release_resources("lab") == []
    seen.terminate([launched[0].id])
    assert provider.check_credentials().ok


def test_launched_hosts_are_reachable_and_probed(sshd_vm_factory: SshdFactory) -> None:
    """What lifecycle does with an ssh host: launch record -> open_transport(host=...) -> probe."""
    vms = sshd_vm_factory.start_many(2)
    key = str(sshd_vm_factory.client_key.private_path)
    hosts = tuple(vm.host_spec(key) for vm in vms)
    provider = get_provider("ssh", Config())
    nodes = provider.given_nodes(_spec(*hosts), 2)
    for node, host, vm in zip(nodes, hosts, vms):
        with open_transport(cluster="lab", instance=node, config=Config(ssh={"connect_retries_s": 0}), host=host) as t:
            facts = probe_host(t)
            assert facts.python3 and t.home == vm.home
