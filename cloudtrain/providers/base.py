"""The provider contract: a small core Protocol, opt-in capability Protocols, and the typed records
that cross them.

Providers never open SSH and never sleep: polling and waiting live in `lifecycle`.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from cloudtrain.expiry import Expiry

if TYPE_CHECKING:
    from cloudtrain.buckets.grants import BucketGrant
    from cloudtrain.providers.leak import Leak, OpenLogin
    from cloudtrain.providers.scheduling import ScheduledRecipe

TAG_CLUSTER = "cloudtrain-cluster"
TAG_OWNER = "cloudtrain-owner"
# The cluster incarnation (state's uid) that launched it: a reused name never adopts an older
# incarnation's leftover as its own.
TAG_INCARNATION = "cloudtrain-incarnation"
# Epoch seconds (whole) of the last sign that a cloudtrain process is doing this machine's work: set
# in the launch request, then renewed while a command holds the cluster (cluster/liveness.py).
# `gc`, from any state, leaves a machine with a fresh mark alone: a tag is what every state can see.
TAG_ALIVE = "cloudtrain-alive"


def alive_value(at: float) -> str:
    """TAG_ALIVE's value: whole epoch seconds (digits: valid as an AWS/Azure tag and a GCP label)."""
    return str(int(at))


def alive_of(tags: Mapping[str, str]) -> float | None:
    """The mark a machine's tags carry; None when it has none, or one nobody could have written."""
    value = tags.get(TAG_ALIVE)
    return float(value) if isinstance(value, str) and value.isdigit() else None


class InstanceState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Traits:
    """Facts about a backend that are data, not behaviour (what it can DO is the capability
    Protocols below: `supports(provider, StopsMachines)`). Read from the class, before anything is
    launched, by callers that have only a cloud's name (`providers.traits(name)`)."""

    remote: bool  # reached over SSH (False: runs on this machine)
    priced: bool  # bills by the hour: it has catalog rows and a plan
    # terminate destroys the machine and everything running on it. False for machines that outlive
    # the cluster (this one, on-prem hosts): `down` must end the cluster's jobs on them itself.
    owns_machines: bool = False
    # With StopsMachines: a spot instance can be stopped (and started again). AWS one-time spot
    # instances cannot: `--stop` on them is refused before launch rather than left running and billed.
    stops_spot: bool = False
    # region, zone, instance_type, accelerators, image, disk_gb, spot mean something here.
    cloud_fields: bool = False
    # Cloud fields it uses although `cloud_fields` is False (Slurm: accelerators become --gres).
    honours_fields: tuple[str, ...] = ()
    # The backend enforces budget.max_hours itself (Slurm's --time): no watchdog is needed for it.
    limits_time: bool = False
    # How long a new bucket grant to the machines' identity may take to reach the store (the
    # cloud's documented IAM propagation): a node's first copy of a bucket retries access denied
    # for this long (buckets/steps.py) instead of failing a run the cloud would allow a minute later.
    grant_propagation_s: float = 0.0


@dataclass(frozen=True)
class ClusterResource:
    """Something a provider created for a cluster besides instances: a key pair, a security group or
    firewall rule, a resource group. Listed by tag/label so `gc` finds it with local state lost."""

    cloud: str
    cluster: str
    kind: str  # e.g. "key-pair", "security-group", "firewall", "resource-group"
    id: str
    region: str | None = None
    note: str = ""  # why it was kept, when release_resources had to keep it
    # What it costs while it exists, for `gc`: a disk/volume's size (priced per GB from
    # catalog_data/storage/disks.csv), or a price the provider knows itself (e.g. a static IP).
    # None: not known; key pairs, firewall rules, security groups and groups cost nothing anyway.
    size_gb: float | None = None
    hourly_usd: float | None = None


@dataclass(frozen=True)
class HostSpec:
    """An existing machine for the `ssh` provider."""

    address: str
    user: str | None = None
    port: int = 22
    key: str | None = None
    proxy_command: str | None = None


@dataclass(frozen=True)
class InstanceSpec:
    cluster: str
    owner: str
    instance_type: str | None = None
    region: str | None = None
    zone: str | None = None
    # Zones a launch without `zone` must not use (a spot preemption just took the machine there).
    avoid_zones: tuple[str, ...] = ()
    image: str | None = None
    disk_gb: int | None = None
    spot: bool = False
    accelerators: str | None = None
    ssh_public_key: str | None = None
    ssh_user: str | None = None
    allowed_cidr: str | None = None
    # What an OS shutdown from inside does (autostop.down: terminate); clouds without the
    # setting ignore it. Spot instances that cannot stop terminate whatever this says.
    shutdown_behavior: Literal["stop", "terminate"] = "stop"
    # A cloud-side backstop for the budget: seconds the instance may run before the cloud itself
    # stops it (or deletes it, per shutdown_behavior), where the cloud offers one. None: no limit.
    max_run_s: float | None = None
    # What the on-node watchdog may have to do to this machine: "stop" (autostop, budget), "delete"
    # (autostop.down, a sweep's lease), None (no watchdog). A cloud whose VMs act on themselves
    # with an identity of their own attaches one only when needed (GCP: a delete), and checks the
    # launching credentials may grant it before creating anything (Azure). A max_run_s or a
    # shutdown_behavior "terminate" implies at least "stop" / "delete" (see watchdog_needs).
    watchdog: Literal["stop", "delete"] | None = None
    hosts: tuple[HostSpec, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    # The recipe's buckets (cloudtrain/buckets/grants.py): a cloud whose machines have an identity
    # of their own gives it exactly these, created per cluster and released with it (docs/data.md).
    buckets: tuple[BucketGrant, ...] = ()

    def all_tags(self) -> dict[str, str]:
        return {**self.tags, TAG_CLUSTER: self.cluster, TAG_OWNER: self.owner}

    def watchdog_needs(self) -> Literal["stop", "delete"] | None:
        """`watchdog`, or what the other fields imply (autostop.down, a budget) when it is not set."""
        if self.watchdog == "delete" or self.shutdown_behavior == "terminate":
            return "delete"
        return self.watchdog or ("stop" if self.max_run_s is not None else None)


@dataclass(frozen=True)
class Instance:
    id: str
    cluster: str
    state: InstanceState
    instance_type: str | None = None
    region: str | None = None
    zone: str | None = None
    public_ip: str | None = None
    private_ip: str | None = None
    ssh_user: str | None = None
    ssh_port: int = 22
    launched_at: float | None = None
    # Where the node keeps its files when the provider decides it (local: a directory here).
    home: str | None = None
    # Filled where the provider knows them (listing), for pricing what `gc` finds: the market
    # (None: not known, priced on demand as an upper bound) and the attached disks' total size
    # (what a stopped instance still costs; None: not known).
    spot: bool | None = None
    disk_gb: float | None = None
    # When the instance entered `state`, by the cloud's own clock, where the provider reports it
    # (EC2's state-transition reason and launch time, GCE's last start/stop timestamps, Azure's
    # power-state time): what the ledger bills from. None: not reported.
    state_since: float | None = None
    # Whether the cloud bills compute in this state where the state alone does not say (EC2 bills
    # nothing while "stopping"; an Azure VM stopped from inside stays allocated and billed).
    # None: compute bills while PENDING, RUNNING or STOPPING.
    compute_billed: bool | None = None
    incarnation: str | None = None  # TAG_INCARNATION, where the machine carries it
    alive_at: float | None = None  # TAG_ALIVE, where the machine carries it
    # autostop.delete_after_stopped_days, from its tags (cloudtrain/expiry.py: expiry_of): `gc --expired`.
    expiry: Expiry = field(default_factory=Expiry)


@dataclass(frozen=True)
class CredentialStatus:
    cloud: str
    ok: bool
    detail: str
    # False: nothing is configured for this cloud at all (no credentials, no subscription): it is
    # not set up here, which `gc` and `down` by tag take as "nothing of ours there", not a failure.
    set_up: bool = True


# The backend shape: a small core every backend has, and capability Protocols it implements only
# where it truly can (as dstack's `Compute` and its mixins). Core code asks `supports(provider, X)`,
# never combines flags, and a backend has no stub members: what it cannot do, it does not define.
# Capability Protocols hold methods only, so that `supports` works on a class (a name's provider
# class, before anything is instantiated) as well as on an instance.


@runtime_checkable
class Backend(Protocol):
    """One backend (a cloud, this machine, given hosts, a scheduler). Providers never open SSH and
    never sleep (waiting lives in lifecycle); every resource they create carries TAG_CLUSTER and
    TAG_OWNER; capacity problems raise CapacityError with the scope they cover (zone, region or
    the whole cloud) so lifecycle can fail over."""

    name: str
    traits: Traits

    @property
    def default_region(self) -> str | None:
        """The region used when a recipe names none: config, then the SDK's own default chain."""
        ...

    def check_credentials(self) -> CredentialStatus: ...


# What core annotations call a backend.
Provider = Backend


@runtime_checkable
class CreatesMachines(Protocol):
    """Machines it creates on request, tags, lists and destroys (the clouds; local's directories)."""

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]: ...

    def describe(self, ids: Sequence[str]) -> list[Instance]: ...

    def list_tagged(self, cluster: str | None = None) -> list[Instance]: ...

    def terminate(self, ids: Sequence[str]) -> None:
        """Idempotent: an instance that is already gone counts as terminated."""
        ...

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        """This owner's per-cluster resources besides instances (all clusters when None)."""
        ...

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        """Delete the cluster's resources besides instances; return those that must stay for now
        (still in use by instances shutting down), each with a note. Idempotent."""
        ...


@runtime_checkable
class StopsMachines(Protocol):
    """Machines it can stop (nothing runs, compute is not billed) and start again; spot ones too
    where `traits.stops_spot`."""

    def stop(self, ids: Sequence[str]) -> None: ...

    def start(self, ids: Sequence[str]) -> None: ...


@runtime_checkable
class SelfStopping(Protocol):
    """Machines that can stop or delete themselves with no user credentials on them, so recipes may
    set `autostop` and `budget` (cloudtrain/node/)."""

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        """What the watchdog on `instance` must do to stop it (down=False) or delete it (down=True)
        by itself: a JSON-able dict with "kind" and "effect" ("stop" or "delete"), one of

          {"kind": "shutdown", "effect": ...}   power off from inside; the cloud makes it a stop or a delete
          {"kind": "http", "effect": ..., "method": "POST"|"DELETE", "url": "...", "headers": {...},
           "body": ... or None, "token": {"url": metadata token URL, "headers": {...}, "field": "access_token"},
           "ok": [200, 202], "gone_ok": True}
                                                one API call with the machine's own token from its metadata server
          {"kind": "exec", "effect": ..., "argv": [...], "exit_after": True}
                                                a command on the node (the machine itself stays up)

        May make idempotent cloud calls so that the action does what is asked (AWS sets the
        instance's shutdown behaviour); creates nothing."""
        ...


@runtime_checkable
class GivenHosts(Protocol):
    """Machines that already exist, listed in the recipe's `resources.hosts` (the user's own):
    nothing is created, stopped or destroyed; `down` ends our jobs and removes our files on them."""

    def given_nodes(self, spec: InstanceSpec, count: int) -> list[Instance]:
        """The hosts in `spec.hosts` as the cluster's nodes (records only: nothing is contacted)."""
        ...


@runtime_checkable
class Schedules(Protocol):
    """A scheduler that allocates the compute nodes per run (Slurm): the cluster is its login node,
    and a run is one batch job."""

    def batch_job(self, recipe: ScheduledRecipe, run: str, setup: str | None, job_id: str, cluster: str) -> str:
        """The script the login node runs for one run: `setup` then `run` on every allocated node."""
        ...

    def plan_lines(self, recipe: ScheduledRecipe) -> list[str]: ...

    def plan_document(self, recipe: ScheduledRecipe) -> dict[str, Any]: ...

    def leaked_jobs(self, clusters: Sequence[str], tracked: Collection[str], open_login: OpenLogin) -> list[Leak]:
        """`gc`: our jobs still queued that nothing follows, seen from the login node of each of
        `clusters` (this backend's in state); `tracked`: every cluster name in state."""
        ...

    def cancel_leaked(self, leak: Leak, open_login: OpenLogin) -> None: ...


# Smaller capabilities, of the clouds whose machines have an address to admit and an identity.


@runtime_checkable
class FollowsCaller(Protocol):
    """A cluster's SSH ingress rule that can follow the caller's address (cluster/ingress.py)."""

    def follow_caller(self, cluster: str, cidr: str) -> str | None:
        """Before connecting: admit SSH from `cidr`; what changed, in words, or None."""
        ...


@runtime_checkable
class MarksAlive(Protocol):
    """Machines whose tags (labels) can be renewed in place: the liveness mark (TAG_ALIVE)."""

    def mark_alive(self, ids: Sequence[str], at: float) -> None:
        """Set TAG_ALIVE to `at` (epoch seconds) on these machines; gone ones are skipped."""
        ...


@runtime_checkable
class MarksItself(Protocol):
    """Machines whose own identity may renew their liveness mark: the on-node watchdog does, while
    the node works, with no CLI holding it (docs/watchdog.md, the mark)."""

    def mark_action(self, instance: Instance) -> dict[str, Any] | None:
        """The watchdog's call that sets TAG_ALIVE on `instance` from the machine itself (kind
        `http-mark`), or None where that machine has no identity that may."""
        ...


@runtime_checkable
class ListsEnded(Protocol):
    """Clouds that still report machines after they ended (EC2 describes a terminated instance for
    about an hour): a launch whose create answer was lost is billed from what they say."""

    def list_ended(self, cluster: str) -> list[Instance]:
        """The cluster's tagged machines that ended (terminated or shutting down), with their times."""
        ...


@runtime_checkable
class SaysVmIdentity(Protocol):
    """Machines with credentials of their own that `plan` describes."""

    def vm_identity(self, watchdog_deletes: bool, buckets: bool = False) -> str:
        """What code on a VM of this config could do with the VM's own credentials (`buckets`: the
        recipe names buckets its nodes read or write with that identity)."""
        ...


@runtime_checkable
class SaysBucketIdentity(Protocol):
    """Machines that read and write buckets with an identity of their own (buckets/steps.py)."""

    def bucket_identity(self, cluster: str) -> str: ...


def supports(backend: object, capability: type) -> bool:
    """Whether `backend` (a provider, or a provider class) implements `capability`, one of the
    capability Protocols above. The one way core code asks what a backend can do."""
    if isinstance(backend, type):
        return issubclass(backend, capability)
    return isinstance(backend, capability)


def can_stop(backend: object, spot: bool) -> bool:
    """Whether `backend` can stop a cluster's machines (spot ones: `spot`) and start them again."""
    if not supports(backend, StopsMachines):
        return False
    return not spot or bool(backend.traits.stops_spot)  # type: ignore[attr-defined]


class _GivenMachines:
    """Given hosts seen through CreatesMachines, so that lifecycle's one flow (launch, observe,
    terminate) serves them too: "launching" takes the hosts, they are always running as far as a
    backend knows (whether one answers is the connection's business), nothing of ours is listed
    by tag, and terminating or releasing touches nothing (lifecycle ended our work on them)."""

    def __init__(self, backend: GivenHosts) -> None:
        self.backend = backend

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        return self.backend.given_nodes(spec, count)

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        return [Instance(id=i, cluster="", state=InstanceState.RUNNING) for i in ids]

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        return []

    def terminate(self, ids: Sequence[str]) -> None:
        return None

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        return []

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        return []


def machines(backend: object) -> CreatesMachines:
    """What lifecycle and gc create, observe and destroy a cluster's machines through: the backend
    itself, or its given hosts (GivenHosts) as machines nobody creates or destroys."""
    if supports(backend, CreatesMachines):
        return backend  # type: ignore[return-value]
    if supports(backend, GivenHosts):
        return _GivenMachines(backend)  # type: ignore[arg-type]
    raise TypeError(f"{type(backend).__name__} neither creates machines nor is given hosts")


_LAUNCHED_ATTR = "cloudtrain_launched_ids"


def note_launched(exc: BaseException, instances: Sequence[Instance]) -> None:
    """A launch cut short (Ctrl-C, a timeout) whose instances the provider found and ended itself:
    attach them, as last seen before they went (with their launch time: once deleted, some clouds
    no longer say it), to the exception on its way out, so that the caller's cleanup observes
    them and the ledger bills their seconds. The exception stays what it was (a KeyboardInterrupt
    must stay one)."""
    if instances:
        setattr(exc, _LAUNCHED_ATTR, tuple(getattr(exc, _LAUNCHED_ATTR, ())) + tuple(instances))


def launched_by(exc: BaseException) -> tuple[Instance, ...]:
    return tuple(getattr(exc, _LAUNCHED_ATTR, ()))


def owner_id(config: Any = None) -> str:
    """Who launched a resource, in a form every cloud accepts as a tag/label value: the config's
    `owner` (the given config, else the user's), else $CLOUDTRAIN_OWNER, else the login name. Never
    the hostname: that made each machine (a laptop, every CI runner) a different owner, so `gc` on
    one was blind to what another leaked. `gc --all-owners` lists every owner's."""
    if config is None:
        from cloudtrain.config import load_config

        config = load_config()
    configured = getattr(config, "owner", None)
    from cloudtrain.config import ALL_OWNERS

    if configured and configured != ALL_OWNERS:
        return str(configured)
    if os.environ.get("CLOUDTRAIN_OWNER"):
        return sanitize_owner(os.environ["CLOUDTRAIN_OWNER"])
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return sanitize_owner(user)


def sanitize_owner(raw: str) -> str:
    text = re.sub(r"[^a-z0-9_-]", "-", raw.lower()).strip("-_")[:63]
    return text or "unknown"


def listing_owner(config: Any) -> str | None:
    """The owner a provider lists and cleans up for: this user's, or None for every owner
    (`gc --all-owners`, which sets config.owner to config.ALL_OWNERS in memory)."""
    from cloudtrain.config import ALL_OWNERS

    return None if getattr(config, "owner", None) == ALL_OWNERS else owner_id(config)


def sdk_installed(*modules: str) -> bool:
    """Whether a cloud's SDK modules can be imported, asked without importing them: providers
    import their SDK on first use (a verb that never calls the cloud must not pay seconds for it),
    yet a missing SDK should be said when the provider is made, not in the middle of a call."""
    from importlib.util import find_spec

    for module in modules:
        try:
            if find_spec(module) is None:
                return False
        except ModuleNotFoundError:  # a parent package is missing
            return False
    return True
