"""The on-node watchdog (cloudtrain/node, shipped as one zipapp) from this side: its config, starting it, its log.

A watchdog runs on every node of a cluster whose recipe sets `autostop` or `budget` (started by
`up`, and by `run` when it readies the nodes), or after `cloudtrain autostop`. It needs nothing from
this machine afterwards: the laptop can be closed. Its config, ~/.cloudtrain/<cluster>/watchdog.json
on the node, is rewritten here and reread by the watchdog on every tick (its fields, one by one:
cloudtrain/node/protocol.py CONFIG_FIELDS; what this side puts in them):

    tick_s       seconds between decisions (15; CLOUDTRAIN_WATCHDOG_TICK_S overrides, for tests)
    autostop     {idle_s, down, wait_for} or null (idle_s: idle_minutes x 60;
                 CLOUDTRAIN_WATCHDOG_IDLE_S overrides, for tests)
    budget       {limit_s, used_s, epoch, why} or null: a hard limit on running time
    lease        {until, why, sent_at} or null: a sweep VM's hard deadline (unix time by which the
                 node must have called its delete; `until` already has the release time and a
                 safety margin taken off). A node with a lease is only ever deleted. Written by
                 the sweep backend (`set_lease`); `up`, `run` and `autostop` keep it
    action       what the provider says the node must do to stop or delete itself
                 (Provider.watchdog_action), cached on the node per instance and effect
    interruption the cloud whose interruption notice the node watches for (a run with `recover:`),
                 or null (docs/recovery.md)
    mark         the node's own call renewing its liveness mark while it works (Provider.mark_action
                 of MarksItself), cached like the action per `mark_key` (the instance); {"kind":
                 "none", "why"} where the machine has no identity that may; absent on other clouds
    mark_every_s its renewal (liveness.MARK_EVERY_S; CLOUDTRAIN_WATCHDOG_MARK_S overrides, for tests)
    busy_jobs    patterns of the job ids that are busy whatever the GPUs do (setup, bucket copies)
    count_ssh, ssh_port, shutdown_command, metadata_url, ca_file, persist  (see docs/watchdog.md)

Writing it costs one round trip per node when the node already holds an action for the same
instance and effect (a warm `run` asks the cloud nothing); otherwise the provider is asked (AWS:
one attribute call) and the config sent again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cloudtrain.budget import budget_limit
from cloudtrain.errors import NotAvailableError, RemoteError, UsageError
from cloudtrain.node.protocol import (
    CONFIG_NAME,
    DEFAULT_TICK_S,
    LOG_NAME,
    PROGRAM_NAME,
    WAIT_FOR,
    action_key,
    config_fields,
)

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Cluster, Lifecycle
    from cloudtrain.config import Config
    from cloudtrain.cluster.nodes import Node
    from cloudtrain.events import Reporter
    from cloudtrain.recipe import Budget, Recipe
    from cloudtrain.state import StateStore

# Test-only knobs, read when a config is written (docs/watchdog.md): they let a test run the real
# watchdog in seconds against fakes. Never needed on a real cloud.
ENV_TICK_S = "CLOUDTRAIN_WATCHDOG_TICK_S"
ENV_IDLE_S = "CLOUDTRAIN_WATCHDOG_IDLE_S"
ENV_SHUTDOWN = "CLOUDTRAIN_WATCHDOG_SHUTDOWN"  # shell words replacing the OS shutdown command
ENV_METADATA_URL = "CLOUDTRAIN_WATCHDOG_METADATA_URL"  # replaces the metadata server in token URLs
ENV_CA_FILE = "CLOUDTRAIN_WATCHDOG_CA_FILE"  # CA bundle for the watchdog's HTTPS calls
ENV_PERSIST = "CLOUDTRAIN_WATCHDOG_PERSIST"  # auto | none (none: no systemd unit or crontab line)
ENV_MARK_S = "CLOUDTRAIN_WATCHDOG_MARK_S"  # the liveness mark's renewal, replacing 300 s
ENV_GPU_SAMPLE_S = "CLOUDTRAIN_WATCHDOG_GPU_SAMPLE_S"  # GPU sampling, replacing 10 s
# Jobs that count as busy whatever the GPUs do (autostop.gpu_util_below): a recipe's setup (run's
# `<run>-setup`, setup_once's `setup-...`) and the bucket copies (buckets/steps.py: `<run>-data`,
# `<run>-upload`). fnmatch patterns on the job's id (tests/watchdog/test_gpu_rule.py pins them).
BUSY_JOBS = ("*-setup", "setup-*", "*-data", "*-upload")

# Runs on the node with its python3: installs the node program, watchdog.pyz (only when its bytes
# changed; 0600 in a 0700 directory), and calls its install.ensure() with the config, in one round
# trip. stdin: {"program": base64 of the zipapp (cloudtrain/node/bundle.py), "config": {...}, "secrets"}.
_BOOT = """\
import base64, json, os, sys
program, config = sys.argv[1], sys.argv[2]
payload = json.load(sys.stdin)
data = base64.b64decode(payload["program"])
try:
    with open(program, "rb") as handle:
        old = handle.read()
except OSError:
    old = None
if old != data:
    os.makedirs(os.path.dirname(program), mode=0o700, exist_ok=True)
    fd = os.open(program + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(program + ".tmp", program)
sys.path.insert(0, program)
from cloudtrain.node.install import ensure
print(json.dumps(ensure(config, payload["config"], sys.executable, program, payload.get("secrets"))))
"""


@dataclass(frozen=True)
class Settings:
    """What the watchdog enforces, independent of the node it runs on."""

    autostop: dict[str, Any] | None  # {"idle_s", "down", "wait_for", "gpu_util_below"}
    budget: dict[str, Any] | None  # {"limit_s", "used_s", "epoch", "why"}
    keep: tuple[str, ...] = ()  # config keys this write leaves as the node has them
    lease: dict[str, Any] | None = None  # {"until", "why"} (sent with "sent_at")
    interruption: str | None = None  # the cloud whose interruption notice it watches for (run/recover.py)
    # The webhook targets the node tells itself (notify/node.NodeTarget); None: kept as the node has them.
    notify: tuple[Any, ...] | None = None

    @property
    def down(self) -> bool:
        # A lease ends the machine for good: its action is the delete (the watchdog's too, for a
        # lease kept from an earlier write).
        return bool(self.autostop and self.autostop.get("down")) or self.lease is not None

    @property
    def enforces(self) -> bool:
        return self.autostop is not None or self.budget is not None or self.lease is not None

    def describe(self) -> str:
        parts = []
        if self.autostop:
            idle = float(self.autostop["idle_s"])
            when = f"{idle / 60:g} min" if idle >= 60 and idle % 60 == 0 else f"{idle:g}s"
            waits = {"jobs_and_ssh": "jobs and SSH sessions", "jobs": "jobs", "none": "nothing"}
            gpu = self.autostop.get("gpu_util_below")
            parts.append(f"autostop after {when} idle ({'delete' if self.down else 'stop'}; "
                         f"waits for {waits[self.autostop['wait_for']]}"
                         + (f"; a job counts while a GPU is at {gpu:g}% or more" if gpu is not None else "")
                         + (f"; deleted {days} day(s) after the stop by `cloudtrain gc --expired`"
                            if (days := self.autostop.get("delete_after_stopped_days")) and not self.down else "")
                         + ")")
        else:
            parts.append("autostop off")
        if self.budget:
            parts.append(f"budget: stops after {self.budget['limit_s'] / 3600:.4g} h of running time "
                         f"({self.budget['why']})")
        if self.lease:
            until = time.strftime("%H:%M:%S", time.localtime(float(self.lease["until"])))
            parts.append(f"lease: deletes itself at {until} ({self.lease['why']})")
        return ", ".join(parts)


@dataclass(frozen=True)
class NodeResult:
    rank: int
    status: str  # written | unchanged
    running: bool
    started: bool
    hook: str  # how it survives a reboot: systemd ..., cron @reboot, or none (why)
    effect: str | None
    sent: tuple[dict[str, Any], ...] = ()  # the node's sent-log (notify/node.reconcile records it)


# ---------------------------------------------------------------------------------------- settings


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise UsageError(f"{name} must be > 0 seconds, got {raw}")
    return value


def autostop_settings(idle_minutes: float, down: bool, wait_for: str,
                      gpu_util_below: float | None = None,
                      delete_after_stopped_days: int | None = None) -> dict[str, Any]:
    if wait_for not in WAIT_FOR:
        raise UsageError(f"autostop wait_for must be one of {', '.join(WAIT_FOR)}, got {wait_for!r}")
    idle_s = _env_float(ENV_IDLE_S) or idle_minutes * 60.0
    out: dict[str, Any] = {"idle_s": idle_s, "down": bool(down), "wait_for": wait_for}
    if gpu_util_below is not None:
        out["gpu_util_below"] = float(gpu_util_below)
    if delete_after_stopped_days is not None:
        # The node tags the machine before it stops it (cloudtrain/node/actions.py tag_expiry).
        out["delete_after_stopped_days"] = int(delete_after_stopped_days)
    return out


def running_seconds(store: StateStore, cluster: str, now: float | None = None) -> float:
    """How long this incarnation of the cluster has billed compute, per node (the longest node):
    what the budget has used so far. A predecessor of the same name counts for nothing."""
    end = time.time() if now is None else now
    record = store.get_cluster(cluster)
    if record is None:
        return 0.0
    per_node: dict[str, float] = {}
    for item in store.billing(cluster, incarnation=record.uid):
        if item.kind == "running":
            stop = item.ended_at if item.ended_at is not None else end
            per_node[item.instance_id] = per_node.get(item.instance_id, 0.0) + max(0.0, stop - item.started_at)
    if per_node:
        return max(per_node.values())
    return max(0.0, end - record.created_at)


def settings_from_recipe(recipe: Recipe, store: StateStore, cluster: str, cluster_hourly: float) -> Settings:
    autostop = None
    if recipe.autostop is not None:
        autostop = autostop_settings(recipe.autostop.idle_minutes, recipe.autostop.down, recipe.autostop.wait_for,
                                     recipe.autostop.gpu_util_below, recipe.autostop.delete_after_stopped_days)
    budget = None
    limit = budget_limit(recipe.budget, cluster_hourly)
    if limit is not None:
        limit_s, why = limit
        epoch = hashlib.sha256(f"{limit_s:.3f}|{why}".encode()).hexdigest()[:16]
        budget = {"limit_s": round(limit_s, 3), "used_s": round(running_seconds(store, cluster), 3),
                  "epoch": epoch, "why": why}
    # A sweep's lease on this node is the sweep's to set: a warm `run` of a trial keeps it.
    return Settings(autostop, budget, keep=("lease",))


def _test_overrides() -> dict[str, Any]:
    extra: dict[str, Any] = {}
    shutdown = os.environ.get(ENV_SHUTDOWN)
    if shutdown:
        extra["shutdown_command"] = shlex.split(shutdown)
    for key, env in (("metadata_url", ENV_METADATA_URL), ("ca_file", ENV_CA_FILE)):
        if os.environ.get(env):
            extra[key] = os.environ[env]
    gpu_sample_s = _env_float(ENV_GPU_SAMPLE_S)
    if gpu_sample_s is not None:
        extra["gpu_sample_s"] = gpu_sample_s
    persist = os.environ.get(ENV_PERSIST, "auto")
    if persist not in ("auto", "none"):
        raise UsageError(f"{ENV_PERSIST} must be auto or none, got {persist!r}")
    extra["persist"] = persist
    return extra


def node_config(cluster: Cluster, node: Node, settings: Settings, action: Mapping[str, Any] | None,
                mark: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from cloudtrain.cluster.liveness import MARK_EVERY_S
    from cloudtrain.providers.base import MarksItself, supports

    config: dict[str, Any] = {
        "version": 1,
        "cluster": cluster.record.name,
        # The incarnation: names this life of the cluster in the node's events (a preemption's id).
        "incarnation": cluster.record.uid,
        "instance_id": node.record.instance_id,
        "rank": node.rank,
        "tick_s": _env_float(ENV_TICK_S) or DEFAULT_TICK_S,
        "autostop": settings.autostop,
        "budget": settings.budget,
        "lease": {**settings.lease, "sent_at": time.time()} if settings.lease is not None else None,
        "action": dict(action) if action is not None else None,
        "action_key": action_key(node.record.instance_id, settings.down),
        "interruption": settings.interruption,
        # The node renews its own liveness mark where its machine has an identity (MarksItself).
        "mark": dict(mark) if mark is not None else None,
        "mark_key": node.record.instance_id if supports(cluster.provider, MarksItself) else None,
        "mark_every_s": _env_float(ENV_MARK_S) or MARK_EVERY_S,
        "busy_jobs": list(BUSY_JOBS),
        # On machines reached over SSH a session of the user counts as activity; here it cannot.
        "count_ssh": cluster.provider.traits.remote,
        "ssh_port": None,
        "written_at": time.time(),
        **_test_overrides(),
    }
    if settings.notify is not None:
        from cloudtrain.notify.node import node_config as notify_config

        config["notify"] = notify_config(cluster.provider.name, list(settings.notify))
    keep = settings.keep + (("notify",) if settings.notify is None else ())
    if keep:
        config["keep"] = list(keep)
    return config_fields(config)


# ---------------------------------------------------------------------------------------- on the nodes


def config_path(node: Node) -> str:
    return f"{node.layout.root}/{CONFIG_NAME}"


def program_path(node: Node) -> str:
    return f"{node.layout.runtime}/{PROGRAM_NAME}"


def program_text() -> str:
    """The node program (cloudtrain/node as a zipapp), base64 for the installer's JSON stdin."""
    import base64

    from cloudtrain.node import bundle

    return base64.b64encode(bundle.program()).decode("ascii")


def _python(cluster: Cluster, node: Node) -> str:
    if not cluster.provider.traits.remote:
        return sys.executable  # the node is this machine
    return node.python or "python3"


def _send(cluster: Cluster, node: Node, config: dict[str, Any], settings: Settings) -> dict[str, Any]:
    from cloudtrain.notify.node import node_secrets

    # The targets' secrets travel on stdin only, and land in 0600 files (never the config or argv).
    payload = json.dumps({"program": program_text(), "config": config,
                          "secrets": node_secrets(list(settings.notify or ()))})
    result = node.transport.run([_python(cluster, node), "-c", _BOOT, program_path(node), config_path(node)],
                                input=payload.encode(), timeout=120, what="starting the watchdog")
    for line in reversed(result.text.strip().splitlines()):
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(answer, dict):
            return answer
    raise RemoteError(f"{node.transport.label}: the watchdog's ensure printed {result.text[-300:]!r}")


def ensure_on_node(cluster: Cluster, node: Node, settings: Settings, eager_action: bool = False) -> NodeResult:
    """Write the node's watchdog config and make sure the watchdog runs: one round trip when the
    node already holds the action for this instance and effect, else the provider is asked."""
    from cloudtrain.cluster.nodes import instance_of

    def action(down: bool) -> dict[str, Any]:
        return dict(cluster.provider.watchdog_action(instance_of(node.record), down))

    first = action(settings.down) if eager_action else None
    mark = mark_action(cluster, node) if eager_action else None
    answer = _send(cluster, node, node_config(cluster, node, settings, first, mark), settings)
    if answer.get("status") == "need-action":
        # The node says which effect it needs: a lease kept there needs the delete.
        first = action(bool(answer.get("down", settings.down)))
        mark = mark_action(cluster, node)
        answer = _send(cluster, node, node_config(cluster, node, settings, first, mark), settings)
    if answer.get("status") == "refused":
        # The node cannot act on itself (no passwordless sudo for the power-off): refused at `up`,
        # never a silent autostop or budget that would not fire.
        raise NotAvailableError(f"{node.transport.label}: autostop and budget cannot act: {answer.get('why')}",
                                hint="give the login user passwordless sudo, or drop autostop/budget")
    if answer.get("status") not in ("written", "unchanged"):
        raise RemoteError(f"{node.transport.label}: the watchdog's ensure answered {answer!r}")
    if settings.enforces and not answer.get("running"):
        raise RemoteError(f"{node.transport.label}: the watchdog did not start (see {node.layout.root}/{LOG_NAME})")
    return NodeResult(node.rank, str(answer["status"]), bool(answer.get("running")), bool(answer.get("started")),
                      str(answer.get("hook") or "none"), (first or {}).get("effect"),
                      tuple(e for e in answer.get("sent") or () if isinstance(e, dict)))


def mark_action(cluster: Cluster, node: Node) -> dict[str, Any] | None:
    """The node's own liveness-mark call (MarksItself), {"kind": "none", "why"} where the provider
    says its machine has no identity that may, or None on clouds whose nodes never mark (AWS)."""
    from cloudtrain.cluster.nodes import instance_of
    from cloudtrain.providers.base import MarksItself, supports

    provider = cluster.provider
    if not supports(provider, MarksItself):
        return None
    found = provider.mark_action(instance_of(node.record))  # type: ignore[attr-defined]
    return dict(found) if found is not None else {
        "kind": "none", "why": "its machine runs with no identity that may label it; the CLI's marks only"}


def ensure_on_nodes(cluster: Cluster, nodes: Sequence[Node], settings: Settings,
                    eager_action: bool = False) -> list[NodeResult]:
    from cloudtrain.cluster.nodes import on_all

    return on_all(list(nodes), lambda n: ensure_on_node(cluster, n, settings, eager_action),
                  label=lambda n: f"node {n.rank} ({n.record.instance_id})")


def report(reporter: Reporter, settings: Settings, results: Sequence[NodeResult]) -> None:
    started = [r for r in results if r.started]
    reporter.info(f"watchdog: {settings.describe()} on {len(results)} node(s)")
    hooks = sorted({r.hook for r in started})
    for hook in hooks:
        if "persist: none" in hook:
            continue  # persistence turned off on purpose (CLOUDTRAIN_WATCHDOG_PERSIST=none): nothing to warn of
        if hook.startswith("none"):
            reporter.warn(f"watchdog started detached (setsid), {hook}: it does not survive a reboot of the node")
        else:
            reporter.info(f"watchdog survives reboots through {hook}")


def start_from_recipe(store: StateStore, cluster: Cluster, nodes: Sequence[Node], recipe: Recipe,
                      reporter: Reporter, created: bool, config: Config | None = None) -> list[NodeResult]:
    """`up` / `run`: the recipe's autostop and budget, enforced on every node from now on. A new
    cluster asks the provider for the action right away (its launch set the cloud side up). The
    config's and recipe's webhook targets that want the node's events go with it (notify/node.py)."""
    settings = settings_from_recipe(recipe, store, cluster.record.name, cluster.record.hourly_price)
    settings = replace(settings, notify=tuple(_node_targets(config, recipe, cluster, reporter)))
    if recipe.recovery is not None and cluster.provider.traits.remote:
        # A recovering run: the node also watches for its cloud's interruption notice.
        settings = replace(settings, interruption=cluster.provider.name)
    results = ensure_on_nodes(cluster, nodes, settings, eager_action=created)
    reconcile_sent(store, results, reporter)
    if any(r.status == "written" for r in results):
        report(reporter, settings, results)
        store.add_event(cluster.record.name, "watchdog", settings.describe())
    return results


def set_autostop(lc: Lifecycle, name: str, idle_minutes: float | None, down: bool, wait_for: str, cancel: bool,
                 reporter: Reporter, gpu_util_below: float | None = None,
                 delete_after_stopped_days: int | None = None) -> tuple[Settings, list[NodeResult]]:
    """`cloudtrain autostop`: change (or cancel) autostop on a running cluster, live. The budget
    the recipe set stays as the nodes have it; the new autostop replaces the old one whole (a GPU
    threshold or a delete-after the command does not give is off)."""
    from cloudtrain.cluster.nodes import close_all, connect
    from cloudtrain.preflight import autostop_problem

    cluster = lc.get(name)
    problem = autostop_problem(cluster.provider.name, "autostop")  # what stops itself may delete itself
    if problem is not None:
        from cloudtrain.errors import NotAvailableError

        raise NotAvailableError(problem[1], hint=problem[2])
    from cloudtrain.state import ClusterStatus

    if cluster.record.status != ClusterStatus.UP:
        raise UsageError(f"cluster {name!r} is {cluster.record.status}: its watchdog cannot be reached",
                         hint=f"`cloudtrain start {name}` first" if cluster.record.status == ClusterStatus.STOPPED
                         else f"`cloudtrain status {name} --refresh`")
    autostop = None if cancel else autostop_settings(float(idle_minutes or 0), down, wait_for, gpu_util_below,
                                                     delete_after_stopped_days)
    settings = Settings(autostop, None, keep=("budget", "lease"))
    nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
    try:
        results = ensure_on_nodes(cluster, nodes, settings)
    finally:
        close_all(nodes)
    lc.store.add_event(name, "autostop", settings.describe() or "autostop off")
    reconcile_sent(lc.store, results, reporter)
    return settings, results


def _node_targets(config: Config | None, recipe: Recipe, cluster: Cluster, reporter: Reporter) -> list[Any]:
    from pathlib import Path

    from cloudtrain.notify.node import node_targets
    from cloudtrain.notify.targets import bind

    found = bind(list(getattr(config, "notify", None) or ()), "config")
    where = cluster.record.recipe_path
    found += bind(list(recipe.notify or ()), "recipe", Path(where) if where else None)
    unique = {b.ref.key(): b for b in found}
    return node_targets(unique.values(), reporter.warn)


def reconcile_sent(store: StateStore, results: Sequence[NodeResult], reporter: Reporter | None = None) -> int:
    """What the nodes' watchdogs sent themselves, into this machine's outbox (never sent again)."""
    from cloudtrain.notify.node import reconcile

    try:
        return sum(reconcile(store, r.sent) for r in results if r.sent)
    except Exception as exc:  # noqa: BLE001 - a notification record never fails the command
        if reporter is not None:
            reporter.warn(f"notify: could not record the node's events: {type(exc).__name__}: {exc}")
        return 0


def lease_until(lease_end: float, release_s: float) -> float:
    """When the node must call its delete for the machine to be gone by `lease_end`: release_s
    before it (what the sweep reserves for a release), less a safety margin for the config's transit
    and the loop's wake-up (10% of release_s, at most 30 s)."""
    return lease_end - release_s - min(LEASE_MARGIN_MAX_S, LEASE_MARGIN_SHARE * release_s)


LEASE_MARGIN_SHARE = 0.1
LEASE_MARGIN_MAX_S = 30.0


def set_lease(cluster: Cluster, nodes: Sequence[Node], until: float, why: str) -> list[NodeResult]:
    """A sweep VM's hard deadline on every node (one round trip per node; the provider is asked for
    the delete action only when a node has none yet). Autostop and budget stay as the nodes have them."""
    settings = Settings(None, None, keep=("autostop", "budget"), lease={"until": round(until, 3), "why": why})
    return ensure_on_nodes(cluster, nodes, settings)


def read_logs(lc: Lifecycle, name: str) -> list[tuple[int, str | None]]:
    """Each node's watchdog.log: (rank, text), text None where no watchdog ever ran."""
    from cloudtrain.cluster.nodes import close_all, connect

    cluster = lc.get(name)
    from cloudtrain.state import ClusterStatus

    if cluster.record.status == ClusterStatus.STOPPED and cluster.provider.traits.remote:
        # (A node on this machine is a directory: readable stopped or not.)
        raise UsageError(f"cluster {name!r} is stopped; the watchdog's log is on its disk",
                         hint=f"`cloudtrain start {name}`, then `cloudtrain logs {name} --watchdog`")
    nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
    try:
        out = []
        for node in nodes:
            log = f"{node.layout.root}/{LOG_NAME}"
            result = node.transport.run(["sh", "-c", '[ -f "$1" ] || exit 3; cat "$1"', "sh", log], check=False,
                                        what="reading the watchdog log")
            out.append((node.rank, None if result.exit_code == 3 else result.text))
        return out
    finally:
        close_all(nodes)


def print_logs(lc: Lifecycle, name: str, write: Callable[[str], None]) -> None:
    logs = read_logs(lc, name)
    several = len(logs) > 1
    for rank, text in logs:
        prefix = f"node {rank}: " if several else ""
        if text is None:
            write(f"{prefix}no watchdog has run on this node (the recipe sets no autostop or budget; "
                  f"`cloudtrain autostop {name} -i MIN` starts one)")
            continue
        for line in text.splitlines():
            write(prefix + line)
