"""The provider contract, written once and held by AWS, GCP and Azure alike, in process.

Each test below is one promise of `cloudtrain.providers.base` (CreatesMachines, StopsMachines and
what lifecycle, the ledger, `recover` and `gc` read from an Instance), run against each cloud's
wire fake through its real SDK: moto for EC2, the fake Compute Engine, the fake ARM. No CLI, no
sshd: a provider call and the fake's own record. A per-cloud adapter (`Aws`, `Gcp`, `Azure`) says
how that cloud's fake does what a console, a spot reclaim or a quota does; the tests never branch
on the cloud.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import pytest

from cloudtrain.errors import CapacityError
from cloudtrain.providers.aws import AwsProvider
from cloudtrain.providers.azure import AzureProvider
from cloudtrain.providers.base import (
    TAG_CLUSTER,
    Instance,
    InstanceSpec,
    InstanceState,
    StopsMachines,
    owner_id,
    supports,
)
from cloudtrain.providers.deadline import deadline_seconds
from cloudtrain.providers.gcp import GcpProvider
from cloudtrain.run.gone import GOING
from cloudtrain.testing.aws import LIVE_STATES, MotoServer
from cloudtrain.testing.azure import ArmServer
from cloudtrain.testing.gcp import GLOBAL_GPU_QUOTA_MESSAGE, GceServer
from cloudtrain.testing.wait import wait_until
from tests.lazy import requires
from tests.providers.test_aws import PUBLIC_KEY

pytestmark = pytest.mark.quick

CIDR = "203.0.113.7/32"
MAX_RUN_S = 3600.0
# (what the fake refuses with, how it is injected, the CapacityError scope that refusal means)
CapacityCase = tuple[str, Callable[[], object], str]


class Adapter(ABC):
    """One cloud behind the contract: its provider, a cheap default spec, and the few things its
    fake does by itself (a console stop, a spot reclaim, a refusal) or records (tags, requests)."""

    cloud = region = instance_type = ""

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.provider = self.make()

    @abstractmethod
    def make(self) -> Any:
        """A new provider, as a new CLI process (`gc` with local state lost) builds it."""

    def spec(self, **overrides: Any) -> InstanceSpec:
        fields: dict[str, Any] = dict(
            cluster=f"ct{uuid.uuid4().hex[:8]}", owner=owner_id(), instance_type=self.instance_type,
            region=self.region, ssh_public_key=PUBLIC_KEY, allowed_cidr=CIDR, tags={"team": "contract"})
        return InstanceSpec(**{**fields, **self.spec_fields(), **overrides})

    def spec_fields(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def tags(self, inst: Instance) -> dict[str, str]:
        """The tags (labels) the fake holds on the machine."""

    @abstractmethod
    def reclaim(self, inst: Instance) -> None:
        """Take a spot machine back the way the cloud does."""

    @abstractmethod
    def stop_from_cloud(self, inst: Instance) -> tuple[float, float]:
        """Stop the machine from the cloud's side (its console), not through the provider; returns
        the bounds of the stop time the fake recorded (equal where the fake says the exact time)."""

    @abstractmethod
    def deadline(self, cluster: str) -> tuple[int, str]:
        """From the fake's record of the create request: the seconds after which the cloud ends the
        machine by itself, and how ("stop" or "delete")."""

    @abstractmethod
    def capacity_cases(self) -> list[CapacityCase]:
        """Each refusal the fake can make at a launch, how to arm it, and the scope it means."""

    def clear_faults(self) -> None:
        self.fake.faults.clear()

    @abstractmethod
    def held(self, cluster: str) -> list[str]:
        """What the fake still holds for `cluster` that bills or would be leaked: live machines,
        disks, addresses, NICs, groups, firewall rules, key pairs."""


def _script_deadline(user_data: str) -> int:
    found = re.search(r"^CLOUDTRAIN_DEADLINE_S=(\d+)$", base64.b64decode(user_data).decode(), re.M)
    assert found is not None, "no deadline in the machine's boot script"
    return int(found.group(1))


class Aws(Adapter):
    cloud, region, instance_type = "aws", "us-east-1", "t3.medium"
    fake: MotoServer

    def make(self) -> AwsProvider:
        # One region keeps the sweeps cheap; one attempt: injected refusals are not retried.
        return AwsProvider(region=self.region, regions=(self.region,), max_attempts=1)

    def spec_fields(self) -> dict[str, Any]:
        return {"image": self.fake.ami(self.region)}

    @property
    def ec2(self) -> Any:
        return self.fake.client("ec2", self.region, internal=True)

    def tags(self, inst: Instance) -> dict[str, str]:
        (raw,) = [i for r in self.ec2.describe_instances(InstanceIds=[inst.id])["Reservations"] for i in r["Instances"]]
        return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}

    def reclaim(self, inst: Instance) -> None:
        # As AwsCloud.preempt (which needs the sshd-backed aws_cloud): EC2 terminates the instance
        # with its service's reason; moto's API cannot set one, its in-process record can.
        from moto.backends import get_backend
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models.instances import StateReason

        self.ec2.terminate_instances(InstanceIds=[inst.id])
        record = get_backend("ec2")[DEFAULT_ACCOUNT_ID][self.region].get_instance_by_id(inst.id)
        record._reason = f"Service initiated ({time.strftime('%Y-%m-%d %H:%M:%S GMT', time.gmtime())})"
        record.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                          "Server.SpotInstanceTermination")

    def stop_from_cloud(self, inst: Instance) -> tuple[float, float]:
        # moto writes "User initiated (<time>)" while it answers: between these two clock readings.
        before = time.time()
        self.ec2.stop_instances(InstanceIds=[inst.id])
        return before, time.time()

    def deadline(self, cluster: str) -> tuple[int, str]:
        (params,) = [r.params for r in self.fake.faults.requests
                     if r.action == "RunInstances" and r.params.get("KeyName") == f"cloudtrain-{cluster}"]
        effect = "delete" if params["InstanceInitiatedShutdownBehavior"] == "terminate" else "stop"
        return _script_deadline(params["UserData"]), effect

    def capacity_cases(self) -> list[CapacityCase]:
        # The provider tries every zone of the region itself: a stockout in all of them ends the region.
        faults, regions = self.fake.faults, {self.region}
        return [("InsufficientInstanceCapacity", lambda: faults.add("InsufficientInstanceCapacity", regions=regions,
                                                                    status=400), "region"),
                ("VcpuLimitExceeded", lambda: faults.add("VcpuLimitExceeded", regions=regions, status=400), "region")]

    def held(self, cluster: str) -> list[str]:
        tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        live = {"Name": "instance-state-name", "Values": list(LIVE_STATES)}
        ec2 = self.ec2
        found = [f"instance {i['InstanceId']}" for r in ec2.describe_instances(Filters=[*tag, live])["Reservations"]
                 for i in r["Instances"]]
        found += [f"volume {v['VolumeId']}" for v in ec2.describe_volumes(Filters=tag)["Volumes"]]
        found += [f"key pair {k['KeyName']}" for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]]
        return found + [f"security group {g['GroupId']}" for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]


class Gcp(Adapter):
    cloud, region, instance_type = "gcp", "us-central1", "e2-standard-2"
    fake: GceServer

    def make(self) -> GcpProvider:
        return GcpProvider(**self.fake.config(region=self.region))

    def _raw(self, inst: Instance) -> dict[str, Any]:
        raw = self.fake.instance(*inst.id.split(":"))
        assert raw is not None, f"no instance {inst.id}"
        return raw

    def tags(self, inst: Instance) -> dict[str, str]:
        return dict(self._raw(inst)["labels"])

    def reclaim(self, inst: Instance) -> None:
        self.fake.preempt(*inst.id.split(":"))

    def stop_from_cloud(self, inst: Instance) -> tuple[float, float]:
        from datetime import datetime

        zone, name = inst.id.split(":")
        self.fake.client("instances").stop_unary(project=self.fake.project, zone=zone, instance=name)
        # The operation ends (and GCE records lastStopTimestamp) when the fake next looks at it.
        raw = wait_until(lambda: (r := self._raw(inst))["status"] == "TERMINATED" and r, timeout=30,
                         what=f"{name} stopped")
        at = datetime.fromisoformat(raw["lastStopTimestamp"]).timestamp()
        return at, at

    def deadline(self, cluster: str) -> tuple[int, str]:
        (body,) = [r.body for r in self.fake.faults.seen("instances.insert") if r.body["labels"][TAG_CLUSTER] == cluster]
        scheduling = body["scheduling"]
        effect = "delete" if scheduling["instanceTerminationAction"] == "DELETE" else "stop"
        return int(scheduling["maxRunDuration"]["seconds"]), effect

    def capacity_cases(self) -> list[CapacityCase]:
        faults = self.fake.faults
        return [("ZONE_RESOURCE_POOL_EXHAUSTED", lambda: faults.add("ZONE_RESOURCE_POOL_EXHAUSTED"), "zone"),
                ("QUOTA_EXCEEDED", lambda: faults.add("QUOTA_EXCEEDED"), "region"),
                ("GPUS_ALL_REGIONS", lambda: faults.add("QUOTA_EXCEEDED", message=GLOBAL_GPU_QUOTA_MESSAGE), "cloud")]

    def held(self, cluster: str) -> list[str]:
        found = [f"instance {i['name']}" for _, i in self.fake.find_instances(f'labels.{TAG_CLUSTER} = "{cluster}"')]
        with self.fake.lock:
            found += [f"disk {d['name']}" for d in self.fake.disks.values()
                      if d.get("labels", {}).get(TAG_CLUSTER) == cluster]
        return found + [f"firewall {name}" for name in self.fake.added_firewalls
                        if name.startswith(f"cloudtrain-{cluster}-")]


class Azure(Adapter):
    cloud, region, instance_type = "azure", "eastus", "Standard_D2s_v5"
    fake: ArmServer
    VM = "Microsoft.Compute/virtualMachines"

    def make(self) -> AzureProvider:
        return AzureProvider(**self.fake.config(region=self.region), polling_interval=0)

    def _vm(self, inst: Instance) -> dict[str, Any]:
        group, name = inst.id.split(":")
        (vm,) = self.fake.find(self.VM, name=name, group=group)
        return vm

    def tags(self, inst: Instance) -> dict[str, str]:
        return dict(self._vm(inst).get("tags") or {})

    def reclaim(self, inst: Instance) -> None:
        self.fake.evict(inst.id.split(":")[1])

    def stop_from_cloud(self, inst: Instance) -> tuple[float, float]:
        # The platform deallocates it (as a spot eviction or the portal's Stop does): no call of
        # ours. Azure records when the operation ended on the ProvisioningState status.
        self.fake.evict(inst.id.split(":")[1])
        at = float(self._vm(inst)["properties"]["_provisioned_at"])
        return at, at

    def deadline(self, cluster: str) -> tuple[int, str]:
        (vm,) = self.fake.find(self.VM, group=f"cloudtrain-{cluster}-{self.region}")
        custom = vm["properties"]["osProfile"]["customData"]
        found = re.search(r"^CLOUDTRAIN_DEADLINE_ACTION='(.*)'$", base64.b64decode(custom).decode(), re.M)
        assert found is not None, "no deadline action in the VM's custom data"
        action = json.loads(found.group(1))
        return _script_deadline(custom), "delete" if action["method"] == "DELETE" else "stop"

    def capacity_cases(self) -> list[CapacityCase]:
        faults = self.fake.faults
        return [("AllocationFailed", lambda: faults.add("AllocationFailed"), "zone"),
                ("OperationNotAllowed (quota)", lambda: faults.add("OperationNotAllowed"), "region")]

    def held(self, cluster: str) -> list[str]:
        group = f"/resourcegroups/cloudtrain-{cluster}-"
        found = [f"group {g['name']}" for g in self.fake.find("Microsoft.Resources/resourceGroups")
                 if (g.get("tags") or {}).get(TAG_CLUSTER) == cluster]
        for kind in (self.VM, "Microsoft.Compute/disks", "Microsoft.Network/publicIPAddresses",
                     "Microsoft.Network/networkInterfaces"):
            found += [f"{kind} {r['name']}" for r in self.fake.find(kind) if group in r["id"].lower()]
        return found


ADAPTERS: dict[str, tuple[type[Adapter], str]] = {
    "aws": (Aws, "moto_server"), "gcp": (Gcp, "gce_server"), "azure": (Azure, "arm_server")}


@pytest.fixture(params=["aws", pytest.param("gcp", marks=requires("google.cloud.compute_v1")),
                        pytest.param("azure", marks=requires("azure.identity"))])
def contract(request: pytest.FixtureRequest) -> Adapter:
    """The cloud under the contract, with only its own fake started."""
    adapter, fixture = ADAPTERS[request.param]
    return adapter(request.getfixturevalue(fixture))


def describe_one(contract: Adapter, inst: Instance) -> Instance:
    (found,) = contract.provider.describe([inst.id])
    return found


def test_launched_machines_run_carry_the_tags_and_are_listed_by_their_cluster_only(contract: Adapter) -> None:
    """launch returns the machines, which describe as running (pending first at most), carry every
    tag of `spec.all_tags()` (TAG_CLUSTER, TAG_OWNER, the recipe's), and list_tagged(cluster) lists
    exactly them while another cluster's listing does not."""
    provider, spec = contract.provider, contract.spec()
    launched = provider.launch(spec, 2)
    ids = sorted(i.id for i in launched)
    assert len(set(ids)) == 2 and {i.cluster for i in launched} == {spec.cluster}
    wait_until(lambda: {i.state for i in provider.describe(ids)} == {InstanceState.RUNNING}, timeout=60,
               what="both machines running")
    for inst in launched:
        assert spec.all_tags().items() <= contract.tags(inst).items()
        assert inst.region == spec.region and inst.instance_type == spec.instance_type
    assert sorted(i.id for i in provider.list_tagged(spec.cluster)) == ids
    assert not {i.id for i in provider.list_tagged(f"other{spec.cluster}")} & set(ids)
    provider.terminate(ids)


def test_stop_then_start_are_described_stopped_then_running(contract: Adapter) -> None:
    """StopsMachines: after stop the machine describes as stopped (compute no longer billed), after
    start as running again, with the same id."""
    if not supports(contract.provider, StopsMachines):
        pytest.skip(f"{contract.cloud} does not stop machines")
    provider = contract.provider
    (inst,) = provider.launch(contract.spec(), 1)
    provider.stop([inst.id])
    assert describe_one(contract, inst).state is InstanceState.STOPPED
    provider.start([inst.id])
    wait_until(lambda: describe_one(contract, inst).state is InstanceState.RUNNING, timeout=60, what="running again")
    provider.terminate([inst.id])


def test_terminate_then_release_leaves_nothing_billed(contract: Adapter) -> None:
    """After terminate the machines describe as terminated and no listing calls them live;
    release_resources(cluster) then keeps nothing, list_resources(cluster) is empty, and the fake
    itself holds nothing of the cluster (machines, disks, addresses, NICs, groups, rules, keys)."""
    provider, spec = contract.provider, contract.spec()
    ids = [i.id for i in provider.launch(spec, 2)]
    assert contract.held(spec.cluster)  # the reader sees what a launch makes
    provider.terminate(ids)
    assert [i.state for i in provider.describe(ids)] == [InstanceState.TERMINATED] * 2
    assert {i.state for i in provider.list_tagged(spec.cluster)} <= {InstanceState.TERMINATED}
    assert provider.release_resources(spec.cluster) == []
    assert provider.list_resources(spec.cluster) == []
    assert contract.held(spec.cluster) == []


def test_a_reclaimed_spot_machine_is_described_going_and_spot(contract: Adapter) -> None:
    """A spot machine the cloud takes back describes as stopped or terminated (run/gone.py's GOING)
    and as spot, in describe and in list_tagged: what `recover` reads to call the loss a preemption
    (an Instance carries no reason of its own; `spot` plus a going state is the preemption)."""
    provider = contract.provider
    spec = contract.spec(spot=True)
    (inst,) = provider.launch(spec, 1)
    before = time.time()
    contract.reclaim(inst)
    seen = describe_one(contract, inst)
    assert seen.state.value in GOING and seen.state is not InstanceState.STOPPING
    assert seen.spot is True
    if seen.state_since is not None:  # the cloud's own time of the reclaim, where it says one
        assert math.floor(before) - 1 <= seen.state_since <= time.time()
    assert all(i.state.value in GOING for i in provider.list_tagged(spec.cluster))
    provider.terminate([inst.id])
    assert contract.held(spec.cluster) == []


def test_a_stop_by_the_cloud_is_described_with_the_clouds_time(contract: Adapter) -> None:
    """A stop nobody asked the provider for (the console, maxRunDuration, the watchdog) is
    described with the cloud's recorded stop time in `state_since`, not with the time of the
    describe call: the ledger bills the machine up to that time, not up to when we looked."""
    provider = contract.provider
    (inst,) = provider.launch(contract.spec(), 1)
    low, high = contract.stop_from_cloud(inst)
    wait_until(lambda: time.time() >= high + 1.5, timeout=10, what="time to pass after the stop")
    asked = time.time()
    seen = describe_one(contract, inst)
    assert seen.state is InstanceState.STOPPED
    assert seen.state_since is not None, "the provider reports no transition time for a stopped machine"
    assert low - 1.0 <= seen.state_since <= high + 0.01  # within the cloud's second (EC2: whole seconds)
    assert seen.state_since < asked - 1.0
    provider.terminate([inst.id])


@pytest.mark.parametrize("shutdown,effect", [("stop", "stop"), ("terminate", "delete")])
def test_a_budget_puts_the_clouds_own_deadline_in_the_create_request(contract: Adapter, shutdown: str,
                                                                      effect: str) -> None:
    """A spec with max_run_s carries the cloud's own deadline in the create request itself (EC2
    user data that shuts the OS down, GCE scheduling.maxRunDuration, Azure custom data that calls
    ARM with the VM's identity): at the budget, and no later than its grace (deadline_seconds),
    the cloud stops the machine, or deletes it when its shutdown behaviour says terminate."""
    provider = contract.provider
    spec = contract.spec(max_run_s=MAX_RUN_S, shutdown_behavior=shutdown)
    (inst,) = provider.launch(spec, 1)
    seconds, how = contract.deadline(spec.cluster)
    assert MAX_RUN_S <= seconds <= deadline_seconds(MAX_RUN_S)
    assert how == effect
    provider.terminate([inst.id])


def test_no_capacity_is_a_capacity_error_of_the_right_scope_that_leaves_nothing(contract: Adapter) -> None:
    """Each refusal the cloud means as capacity or quota raises CapacityError with the scope the
    refusal covers ("zone": try the next placement, "region": skip the region, "cloud": skip the
    cloud; lifecycle's failover reads it), and the failed launch leaves nothing behind."""
    provider = contract.provider
    for code, inject, scope in contract.capacity_cases():
        spec = contract.spec()
        inject()
        try:
            with pytest.raises(CapacityError) as caught:
                provider.launch(spec, 1)
        finally:
            contract.clear_faults()
        assert caught.value.scope == scope, code
        assert provider.list_tagged(spec.cluster) == [], code
        assert provider.list_resources(spec.cluster) == [], code
        assert contract.held(spec.cluster) == [], code


def test_a_tagged_machine_is_found_by_the_all_clusters_listing_of_a_new_process(contract: Adapter) -> None:
    """What `gc` lists with local state lost: a new provider's list_tagged(None) finds the machine
    with its cluster (from its tag), running and priced (market known), and its list_resources(None)
    finds the cluster's other resources (key pair, firewall, group) by their tags too."""
    spec = contract.spec()
    (inst,) = contract.provider.launch(spec, 1)
    fresh = contract.make()
    (found,) = [i for i in fresh.list_tagged(None) if i.id == inst.id]
    assert (found.cluster, found.state, found.spot) == (spec.cluster, InstanceState.RUNNING, False)
    assert spec.cluster in {r.cluster for r in fresh.list_resources(None)}
    fresh.terminate([inst.id])
    fresh.release_resources(spec.cluster)
    assert contract.held(spec.cluster) == []
