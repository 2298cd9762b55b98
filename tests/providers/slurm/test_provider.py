"""The slurm provider's shape: given hosts (its login node) and a scheduler, nothing else."""

from __future__ import annotations

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import ProviderError
from cloudtrain.providers import get_provider, implements, traits
from cloudtrain.providers.base import (
    CreatesMachines,
    GivenHosts,
    HostSpec,
    InstanceSpec,
    InstanceState,
    Schedules,
    SelfStopping,
    StopsMachines,
    machines,
)


@pytest.mark.parametrize("capability, implemented", [
    (GivenHosts, True), (Schedules, True),
    (CreatesMachines, False), (StopsMachines, False), (SelfStopping, False),
])
def test_what_it_implements(capability: type, implemented: bool) -> None:
    assert implements("slurm", capability) is implemented


def test_its_traits_say_what_preflight_lets_through() -> None:
    said = traits("slurm")
    assert (said.remote, said.priced, said.owns_machines, said.cloud_fields) == (True, False, False, False)
    assert said.limits_time and said.honours_fields == ("accelerators",)


@pytest.mark.parametrize("count", [1, 4])
def test_the_login_node_is_the_one_node_whatever_num_nodes(count: int) -> None:
    provider = get_provider("slurm", Config())
    spec = InstanceSpec(cluster="hpc", owner="me", hosts=(HostSpec("login.example", user="me", port=2222),))
    (login,) = machines(provider).launch(spec, count)  # what lifecycle does: Slurm allocates per run
    assert (login.public_ip, login.ssh_user, login.ssh_port, login.state) == ("login.example", "me", 2222,
                                                                            InstanceState.RUNNING)
    assert machines(provider).list_tagged("hpc") == []  # no machine of ours: our leaks are queued jobs


def test_more_than_the_login_node_is_refused() -> None:
    spec = InstanceSpec(cluster="hpc", owner="me", hosts=(HostSpec("a"), HostSpec("b")))
    with pytest.raises(ProviderError, match="takes one host, its login node"):
        get_provider("slurm", Config()).given_nodes(spec, 2)
