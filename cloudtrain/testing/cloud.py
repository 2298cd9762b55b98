"""One fixture per cloud: your recipes, run by the real `cloudtrain` CLI, against fakes, offline.

    def test_training_runs_on_aws(aws_cloud):
        result = aws_cloud.run(aws_cloud.recipe("recipes/train.yaml"))
        assert result.ok, result.output
        assert (result.run_dir / "outputs" / "model.json").exists()
        assert aws_cloud.leftovers() == []

Every `<cloud>_cloud` fixture (`local_cloud`, `ssh_cloud`, `aws_cloud`, `gcp_cloud`,
`azure_cloud`) returns a `FakeCloud` with the same shape, and
`fake_cloud("aws")` returns the one named, so one test can be parametrized over clouds. Each
sets up everything a run needs and nothing else, for this test only:

- its own CLOUDTRAIN_HOME, HOME and config file (CLOUDTRAIN_CONFIG), all under the test's temp
  dir: nothing is read from or written to your real home, `~/.ssh` included;
- a config with short SSH windows (connect timeout 5 s, retries 30 s, not 300), `ssh.add_include:
  false`, `runs_dir` in the temp dir, `confirm: false` (no price prompt: a fake bills nobody), plus what the cloud needs (for AWS: the caller CIDR, the
  ProxyCommand that routes the fake public IPs to VMs, the region);
- a unique cluster name (`cloud.cluster`) so tests sharing a session-wide fake never see each
  other's instances;
- for the remote clouds, real OpenSSH sshd VMs on loopback (see sshd.py).

The environment (`cloud.env`) is applied to os.environ for the test, so a `cloudtrain` you start
yourself sees the same fake; `cloud.cli(...)` and `cloud.run(...)` start it for you.

Adding a cloud's fixture: subclass `FakeCloud` (set `name` and `machine_fields`, implement
`recipe_resources()`, and `fail()` / `leftovers()` / `close()` where the cloud has them), build it
in a fixture named `<cloud>_cloud` from `tmp_path`, `monkeypatch`, `request` and the cloud's fake
server, and use `CloudMachines` to boot a VM per instance the fake creates. See aws.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cloudtrain.testing import forkcli
from cloudtrain.testing.faults import Gate, kill_cli_at
from cloudtrain.testing.sshd import SshdFactory, SshdVM

# The shape of every fixture's config; clouds add their own sections on top.
BASE_SSH_CONFIG = {"connect_timeout_s": 5, "connect_retries_s": 30, "add_include": False}


def cluster_name(hint: str = "t") -> str:
    """A valid, unique cluster name that says where it came from: `<hint>-<6 hex>` (max 40)."""
    stem = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")
    stem = re.sub(r"^(test-)+", "", stem)[:26].strip("-") or "t"
    if not stem[0].isalpha():
        stem = "t" + stem
    return f"{stem}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class CliResult:
    """One `cloudtrain` invocation: argv, exit code and output, with the run's files at hand."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        """Command, exit code and the tail of both streams: made for `assert result.ok, result.output`."""
        return (
            f"$ cloudtrain {' '.join(self.args)}\n[exit {self.returncode}]\n"
            f"--- stdout (last 4000 chars)\n{self.stdout[-4000:]}\n--- stderr (last 4000 chars)\n{self.stderr[-4000:]}"
        )

    @property
    def run_dir(self) -> Path | None:
        """The run directory `cloudtrain run` printed on its last line (None if there is none)."""
        lines = [line for line in self.stdout.strip().splitlines() if line.strip()]
        if not lines:
            return None
        path = Path(lines[-1].strip())
        return path if path.is_dir() else None

    @property
    def run_json(self) -> dict[str, Any]:
        """The run's run.json (status, cluster, provider, timings, exit code, cost)."""
        if self.run_dir is None:
            raise AssertionError(f"no run directory in the output\n{self.output}")
        return json.loads((self.run_dir / "run.json").read_text())

    def __str__(self) -> str:
        return self.output


class FakeCloud:
    """What every `<cloud>_cloud` fixture returns. Attributes:

    name        "local", "ssh", "aws" (and "gcp", "azure")
    cluster     a cluster name unique to this test (recipe() and run() use it)
    env         the variables this cloud set for the test (already in os.environ)
    config      the cloudtrain config written to `config_path` (change it with configure())
    root        this cloud's temp dir; home (CLOUDTRAIN_HOME), user_home (HOME), runs_dir in it
    """

    name: ClassVar[str] = ""
    # resources fields recipe() keeps from a source recipe written for this same cloud
    machine_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        root: Path,
        monkeypatch: pytest.MonkeyPatch,
        *,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        hint: str = "t",
    ) -> None:
        self.root = root
        self.home = root / "cloudtrain-home"
        self.user_home = root / "home"
        self.runs_dir = root / "runs"
        self.config_path = root / "config.yaml"
        for directory in (self.root, self.home, self.user_home):
            directory.mkdir(parents=True, exist_ok=True)
        self.clusters: list[str] = []
        self._hint = hint
        self.cluster = self.new_cluster()
        self._monkeypatch = monkeypatch
        # confirm: false - a fake cloud bills nobody, and a CI job has no one to answer a prompt.
        self.config: dict[str, Any] = _merge({"runs_dir": str(self.runs_dir), "confirm": False,
                                              "ssh": dict(BASE_SSH_CONFIG)}, config or {})
        self.env: dict[str, str] = {
            "CLOUDTRAIN_HOME": str(self.home),
            "CLOUDTRAIN_CONFIG": str(self.config_path),
            "HOME": str(self.user_home),
            # A watchdog started in a test never installs itself into the developer's crontab or systemd.
            "CLOUDTRAIN_WATCHDOG_PERSIST": "none",
            **(env or {}),
        }
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        self._write_config()

    # ------------------------------------------------------------------ what a cloud provides

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        """The `resources:` mapping that runs a recipe on this fake (for `num_nodes` nodes), with
        `overrides` applied on top."""
        raise NotImplementedError

    def fail(self, kind: str, **where: Any) -> Any:
        """Inject a fault the cloud's API answers: "capacity", "quota" or "auth" (see each cloud)."""
        raise NotImplementedError(f"the {self.name} fake has no API faults; use the tcp_proxy fixture for links")

    def leftovers(self) -> list[str]:
        """What this test made that still exists, one line each: clusters cloudtrain still tracks,
        plus whatever the cloud still holds (instances, keys, firewalls) or left on VMs."""
        return [f"cluster {c.name} ({c.status}) still in cloudtrain's state" for c in self._tracked()]

    def close(self) -> None:
        """Teardown: end what the test left running (called by the fixture)."""

    def age_marks(self, cluster: str | None = None, seconds_ago: float = 3 * 3600) -> None:
        """Time passes with no cloudtrain command holding CLUSTER (default: this test's): its
        machines' liveness marks (cluster/liveness.py) are made `seconds_ago` old, through the
        cloud's API, so that `gc` from another state takes them for the leak they now are."""
        import time

        from cloudtrain.config import load_config
        from cloudtrain.providers import get_provider
        from cloudtrain.providers.base import MarksAlive, supports

        provider = get_provider(self.name, load_config(self.config_path))
        if supports(provider, MarksAlive):
            ids = [i.id for i in provider.list_tagged(cluster or self.cluster)]  # type: ignore[attr-defined]
            provider.mark_alive(ids, time.time() - seconds_ago)

    # ------------------------------------------------------------------ the same for every cloud

    def new_cluster(self, hint: str | None = None) -> str:
        """Another unique cluster name for this test."""
        name = cluster_name(hint or self._hint)
        self.clusters.append(name)
        return name

    def configure(self, **sections: Any) -> dict[str, Any]:
        """Merge `sections` into the config and rewrite it: `configure(ssh={"connect_retries_s": 5})`."""
        self.config = _merge(self.config, sections)
        self._write_config()
        return self.config

    def recipe(
        self,
        source: str | Path | Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        resources: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Path:
        """Your recipe, pointed at this fake: a copy in the test's temp dir. Returns its path.

        - `resources` is replaced by `recipe_resources()`. The fields that mean the same on every
          cloud (`spot`, `disk_gb`, `accelerators`, `allow_more_accelerators`, `cpus`, `memory`,
          `max_hourly_usd`, `allow_cpu_fallback`) are kept whatever cloud the source names, where
          this cloud takes them (local and ssh have no spot, disk or GPU type); the placement
          fields (`machine_fields`: region, zone, instance_type) only from a source written for
          this same cloud; never `image`, `hosts` or `slurm`. Then `resources=` overrides apply;
        - `name` is the test's cluster name (or `name=`);
        - a relative `workdir` and local `data[].source` are made absolute against the source's
          folder, so the copy syncs the same files (bucket URLs stay as written);
        - `fields` (top-level recipe keys: envs, run, num_nodes, ...) replace the source's.
        `source` may be a path, a mapping, or None for a recipe made only of `fields` (for those
        two, relative paths are taken from the current directory).
        """
        import yaml

        if source is None:
            data: dict[str, Any] = {}
            base = Path.cwd()
        elif isinstance(source, Mapping):
            data = json.loads(json.dumps(dict(source)))
            base = Path.cwd()
        else:
            path = Path(source).expanduser().resolve()
            data = yaml.safe_load(path.read_text()) or {}
            base = path.parent
        data.update(fields)
        data["name"] = name or self.cluster
        if data["name"] not in self.clusters:
            self.clusters.append(data["name"])
        original = data.get("resources") or {}
        kept = {k: original[k] for k in self.machine_fields if k in original} if original.get("cloud") == self.name else {}
        # What a field of Resources (cloudtrain/recipe) means on every cloud: kept from any source, so
        # a spot recipe written for AWS is a spot recipe on the GCP fake too. A cloud without
        # placement fields takes only those preflight lets through (slurm: accelerators, as --gres).
        portable = ["spot", "disk_gb", "accelerators", "allow_more_accelerators", "cpus", "memory",
                    "max_hourly_usd", "allow_cpu_fallback"]
        from cloudtrain.preflight import CLOUD_ONLY_FIELDS
        from cloudtrain.providers import available, traits

        if self.name in available() and not traits(self.name).cloud_fields:
            honoured = traits(self.name).honours_fields
            portable = [k for k in portable if k != "spot" and (k not in CLOUD_ONLY_FIELDS or k in honoured)]
        kept.update({k: original[k] for k in portable if k in original})
        if "accelerators" not in {**kept, **(resources or {})}:
            kept.pop("allow_more_accelerators", None)  # means nothing without them (refused alone)
        data["resources"] = {**self.recipe_resources(int(data.get("num_nodes") or 1), **kept), **(resources or {})}
        if data.get("workdir") is not None:
            data["workdir"] = str((base / str(data["workdir"])).resolve())
        for item in data.get("data") or []:
            # A bucket URL (s3://, gs://, az://) stays as written: only local paths are made absolute.
            if isinstance(item, dict) and item.get("source") and "://" not in str(item["source"]):
                item["source"] = str((base / str(item["source"])).resolve())
        out = self.root / "recipes" / f"{data['name']}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(data, sort_keys=False))
        return out

    def cli(self, *args: str, cwd: str | Path | None = None, timeout: float = 600, input: str | None = None) -> CliResult:
        """Run `cloudtrain ARGS...` as a subprocess, as a user would, in this cloud's environment
        (cwd: the cloud's temp dir unless given)."""
        env = dict(os.environ)
        env.update(self.env)
        proc = forkcli.cli([str(a) for a in args], env=env, cwd=str(cwd or self.root), input=input,
                           timeout=timeout, default_sigint=True)
        return CliResult(tuple(map(str, args)), proc.returncode, proc.stdout, proc.stderr)

    def run(self, recipe: str | Path, *args: str, cluster: str | None = None, timeout: float = 900,
            cwd: str | Path | None = None) -> CliResult:
        """`cloudtrain run RECIPE --cluster <cluster> --runs-dir <runs_dir> ARGS...`; the result's
        `run_dir` is the run directory it printed."""
        return self.cli("run", str(recipe), "--cluster", cluster or self.cluster, "--runs-dir", str(self.runs_dir),
                        *args, timeout=timeout, cwd=cwd)

    def up(self, recipe: str | Path, *args: str, cluster: str | None = None) -> CliResult:
        return self.cli("up", str(recipe), "--cluster", cluster or self.cluster, *args)

    def kill_cli_at(self, gate: Gate, *args: str) -> None:
        """`cloudtrain ARGS...` in this cloud's environment, SIGKILLed while `gate` holds one of its
        requests (see faults.kill_cli_at)."""
        kill_cli_at(gate, [str(a) for a in args], {**os.environ, **self.env})

    def down(self, *clusters: str) -> CliResult:
        return self.cli("down", *(clusters or (self.cluster,)))

    # ------------------------------------------------------------------ internals

    def _tracked(self) -> list[Any]:
        """Clusters in this test's state database."""
        db = self.home / "state.db"
        if not db.exists():
            return []
        from cloudtrain.state import StateStore

        store = StateStore(db)
        try:
            return store.list_clusters()
        finally:
            store.close()

    def _down_tracked(self, timeout: float = 60) -> None:
        """`down --forget` every cluster still in state (best effort): ends what they run."""
        for record in self._tracked():
            try:
                self.cli("down", "--forget", record.name, timeout=timeout)
            except subprocess.TimeoutExpired:
                continue

    def _write_config(self) -> None:
        import yaml

        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} cluster={self.cluster} root={self.root}>"


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


# ---------------------------------------------------------------------- machines behind a fake cloud


class CloudMachines:
    """The machines behind a fake cloud's instances: one sshd VM per instance id, booted when the
    fake creates the instance, reached at whatever address the fake hands out.

    A fake cloud calls `boot(id, keys)` when it creates an instance (keys: the public keys the
    cloud would install, as cloud-init does), `address(id, ip)` whenever it reports an address,
    `power_off(id)` / `power_on(id)` on stop/start/delete. cloudtrain reaches the VMs with
    `proxy_command` in its config, so the fake address never receives a packet. Thread-safe: fake
    servers call it from their request threads.
    """

    def __init__(self, factory: SshdFactory) -> None:
        self.factory = factory
        self._vms: dict[str, SshdVM] = {}
        self._lock = threading.RLock()
        self._booting = 0

    def hold_boots(self, count: int = 1) -> None:
        """The next `count` machines stay "booting": the cloud says running, but their sshd is not
        up (connections refused), as a VM whose OS has not started sshd yet, until `power_on`."""
        with self._lock:
            self._booting = count

    @property
    def user(self) -> str:
        """The login user the VMs accept: register images / set admin users with it."""
        return self.factory.user

    @property
    def proxy_command(self) -> str:
        return self.factory.proxy_command

    def boot(self, instance_id: str, public_keys: Sequence[str] = ()) -> SshdVM:
        with self._lock:
            vm = self._vms.get(instance_id)
            if vm is None:
                # Unique per instance id: ids that differ only early on (an Azure VM of the same
                # name in another region's resource group) must not share a VM's home directory.
                digest = hashlib.sha256(instance_id.encode()).hexdigest()[:8]
                name = re.sub(r"[^A-Za-z0-9._-]+", "_", instance_id)[-51:] + "-" + digest
                vm = self.factory.start(name=name, authorized_keys=[k for k in public_keys if k])
                self._vms[instance_id] = vm
                if self._booting > 0:
                    self._booting -= 1
                    vm.stop()
            return vm

    def address(self, instance_id: str, address: str | None) -> None:
        with self._lock:
            vm = self._vms.get(instance_id)
            if vm is not None and address:
                self.factory.route(address, vm)

    def power_off(self, instance_id: str) -> None:
        with self._lock:
            vm = self._vms.get(instance_id)
        if vm is not None and vm.running:
            vm.stop()

    def power_on(self, instance_id: str) -> None:
        with self._lock:
            vm = self._vms.get(instance_id)
        if vm is not None and not vm.running:
            vm.start()

    def vm(self, instance_id: str) -> SshdVM:
        """The VM behind an instance (KeyError if the fake never created it)."""
        with self._lock:
            return self._vms[instance_id]

    def __contains__(self, instance_id: object) -> bool:
        with self._lock:
            return instance_id in self._vms

    def __iter__(self) -> Iterator[tuple[str, SshdVM]]:
        with self._lock:
            return iter(list(self._vms.items()))


# ---------------------------------------------------------------------- local and ssh


class LocalCloud(FakeCloud):
    """cloud: local. Nodes are directories under this test's CLOUDTRAIN_HOME; jobs run here."""

    name = "local"

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        return {"cloud": "local", **overrides}

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        nodes = self.home / "local"
        if nodes.is_dir():
            found += [f"local node directory {p}" for p in sorted(nodes.iterdir())]
        return found

    def close(self) -> None:
        self._down_tracked()


class SshCloud(FakeCloud):
    """cloud: ssh. Your "existing machines" are sshd VMs on loopback (one to start with; more are
    started when a recipe asks for more nodes). `vms` lists them; `key` is the private key they
    accept."""

    name = "ssh"

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, factory: SshdFactory, **kwargs: Any) -> None:
        self.factory = factory
        self.vms: list[SshdVM] = []
        super().__init__(root, monkeypatch, **kwargs)
        self.add_vm()

    @property
    def key(self) -> Path:
        return self.factory.client_key.private_path

    def add_vm(self) -> SshdVM:
        vm = self.factory.start()
        self.vms.append(vm)
        return vm

    def recipe_resources(self, num_nodes: int = 1, **overrides: Any) -> dict[str, Any]:
        while len(self.vms) < num_nodes:
            self.add_vm()
        hosts = [{"address": vm.host, "port": vm.port, "user": vm.user, "key": str(self.key)} for vm in self.vms[:num_nodes]]
        return {"cloud": "ssh", "hosts": hosts, **overrides}

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        for vm in self.vms:
            ours = vm.home_dir / ".cloudtrain"
            if ours.is_dir():
                # venv/ is shared by every cluster's bundled job and kept by `down` on purpose.
                found += [f"{p.name}/ left on {vm.name} ({ours})" for p in sorted(ours.iterdir())
                          if p.is_dir() and p.name != "venv"]
        return found


# ---------------------------------------------------------------------- fixtures


def cluster_hint(request: pytest.FixtureRequest) -> str:
    """The test's name, for `cluster_name()`: clusters say which test made them."""
    return request.node.name.split("[")[0]


@pytest.fixture
def local_cloud(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                request: pytest.FixtureRequest) -> Iterator[LocalCloud]:
    """`cloud: local` for this test: its own CLOUDTRAIN_HOME, HOME and config, a unique
    `cluster`. Jobs run on this machine as processes; clusters the test leaves in state are taken
    down (`down --forget`) at teardown so none of their jobs outlive it."""
    cloud = LocalCloud(tmp_path_factory.mktemp("local-cloud"), monkeypatch, hint=cluster_hint(request))
    yield cloud
    cloud.close()


@pytest.fixture
def ssh_cloud(sshd_vm_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[SshCloud]:
    """`cloud: ssh` for this test: one sshd VM on loopback to start with (`ssh_cloud.vms`, more on
    demand), `recipe_resources()` naming them as `hosts` with the key they accept, plus its own
    CLOUDTRAIN_HOME, HOME and config and a unique `cluster`. VMs are stopped at teardown, with
    every job they ran."""
    cloud = SshCloud(tmp_path_factory.mktemp("ssh-cloud"), monkeypatch, sshd_vm_factory, hint=cluster_hint(request))
    yield cloud
    cloud.close()


@pytest.fixture
def fake_cloud(request: pytest.FixtureRequest) -> Callable[[str], FakeCloud]:
    """`fake_cloud(name)` -> the `<name>_cloud` fixture's FakeCloud ("local", "ssh", "aws", ...),
    for tests parametrized over clouds:

        @pytest.mark.parametrize("name", ["local", "ssh", "aws"])
        def test_train(fake_cloud, name):
            cloud = fake_cloud(name)
            assert cloud.run(cloud.recipe("recipes/train.yaml")).ok
    """

    def get(name: str) -> FakeCloud:
        try:
            return request.getfixturevalue(f"{name}_cloud")
        except pytest.FixtureLookupError:
            raise LookupError(f"no fake for cloud {name!r}: no fixture named {name}_cloud") from None

    return get


@contextmanager
def cloud_outside_pytest(root: Path, server: Any, clear: Sequence[str], make: Callable[..., Any],
                         hint: str) -> Iterator[Any]:
    """A `<cloud>_cloud` for a script (benchmarks/): `make(root, monkeypatch, server, machines,
    hint=...)` with `server`'s environment set and `clear`'s variables removed; on the way out the
    cluster goes down and the VMs and `server` stop, as the fixtures' teardown does."""
    factory = SshdFactory(root / "vms")
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in clear:
                mp.delenv(name, raising=False)
            for name, value in server.env().items():
                mp.setenv(name, value)
            cloud = make(root / "cloud", mp, server, CloudMachines(factory), hint=hint)
            try:
                yield cloud
            finally:
                cloud.down()
                cloud.close()
    finally:
        factory.close()
        server.stop()
