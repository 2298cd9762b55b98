"""Bringing a run's logs and results home: across dropped links, verified, never half-reported.

Used by `run` (after the job) and by `cloudtrain collect` (again, any time the cluster exists).
Logs come first (they explain everything else), then results. A transfer that breaks is started
again on a fresh connection until it succeeds or `ssh.connect_retries_s` has passed; what arrives
is checked against a listing made on the node (every regular file, with its size). Extraction is
staged, so a broken attempt leaves the run directory as it was.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError, RemoteError
from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import JobState
from cloudtrain.state import ClusterStatus, RunStatus
from cloudtrain.remote.archive import Refused, list_files

if TYPE_CHECKING:
    from cloudtrain.cluster.nodes import Node

log = logging.getLogger(__name__)
# A listing that disagrees with what arrived is retried this often (files still changing).
_MISMATCH_ATTEMPTS = 3


@dataclass(frozen=True)
class Collected:
    files: tuple[str, ...] = ()  # written into the run directory: results, then logs
    refused: tuple[Refused, ...] = ()  # unsafe members the node offered, with reasons
    attempts: int = 0
    error: str | None = None  # why not everything is home; None when it all is, verified
    missing_logs: tuple[str, ...] = field(default_factory=tuple)
    # `results:` paths under which node 0 had nothing this run wrote (a typo: `outputz`), in order
    empty_paths: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.error is None


def job_ids(run_id: str) -> tuple[tuple[str, str], ...]:
    """(job id, log file name) of the jobs a run starts on every node."""
    return ((f"{run_id}-run", "job.log"), (f"{run_id}-setup", "setup.log"))


def collect(nodes: Sequence[Node], run_id: str, result_paths: Sequence[str], run_dir: Path,
            window_s: float, warn: Callable[[str], None], results: bool = True,
            gone: Callable[[], str | None] | None = None) -> Collected:
    """Fetch logs from every node and results from rank 0 into run_dir. Never raises for the link.
    `gone`: why the nodes are known to be gone (a recovering run's cloud watcher), or None: a
    broken transfer is then not retried until the window ends, since nothing will answer."""
    deadline = time.monotonic() + window_s
    log_files: list[str] = []
    result_files: list[str] = []
    errors: list[str] = []
    attempts = 0
    refused: tuple[Refused, ...] = ()
    empty: tuple[str, ...] = ()
    early: dict[str, bytes | None] | None = None
    if results and result_paths:
        # Rank 0's logs are asked together with its results: one round trip for both over the node
        # helper (answers come in order). Should that fail, the logs are fetched again below.
        asked = _start_logs(nodes[0], run_id)
        try:
            marker = _results_begin(nodes[0], run_id)
            (names, refused), tries = _retrying(
                lambda: _fetch_verified(nodes[0], result_paths, run_dir, marker), deadline, warn,
                "copying the results", gone)
            attempts += tries
            result_files = list(names)
            empty = empty_paths(result_paths, result_files)
        except CloudtrainError as exc:
            errors.append(exc.one_line())
        if asked is not None:
            try:
                early = asked()
                attempts += 1
            except RemoteError as exc:
                log.debug("rank 0's logs with the results: %s; fetching them again", exc.one_line())
    for node in nodes:
        # Every log of the run and its state in one command: one round trip per node.
        if node.rank == 0 and early is not None:
            logs = early
        else:
            try:
                logs, tries = _retrying(lambda n=node: _read_logs(n, run_id), deadline, warn, "fetching the logs",
                                        gone)
            except CloudtrainError as exc:
                for _job_id, name in job_ids(run_id):
                    errors.append(f"{name if node.rank == 0 else f'node-{node.rank}-{name}'}: {exc.one_line()}")
                continue
            attempts += tries
        for job_id, name in job_ids(run_id):
            target = run_dir / (name if node.rank == 0 else f"node-{node.rank}-{name}")
            data = logs[job_id]
            if data is not None:
                _write_atomically(target, data)
                log_files.append(target.name)
    error = "; ".join(errors) if errors else None
    return Collected(tuple(result_files + log_files), refused, attempts, error, empty_paths=empty)


def empty_warning(path: str) -> str:
    """What `run` and `collect` say of a result path under which node 0 had nothing this run wrote."""
    return f"results: {path}: nothing this run wrote there on node 0 (a typo in `results:`?)"


def empty_paths(result_paths: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
    """The result paths that none of the fetched files lies under (names relative to the workdir)."""
    fetched = [name.removeprefix("./") for name in names]
    empty = []
    for path in result_paths:
        base = path.removeprefix("./").rstrip("/")
        if base in ("", ".") or any(name == base or name.startswith(base + "/") for name in fetched):
            continue
        empty.append(path)
    return tuple(empty)


class _Mismatch(RemoteError):
    """What arrived differs from the node's listing (a file still changing, or a cut transfer)."""


def _results_begin(node: Node, run_id: str) -> str:
    """The file on the node whose time this run's results are newer than: its job's start
    (templates/runner.sh writes started_at as the job starts). The workdir is shared by every run
    of the cluster and sync never deletes, so without it a run would collect an earlier run's
    files (and a sweep trial that wrote no metric would be scored by the last one's). Results are
    what the job wrote; files a `setup` wrote there are not collected. A job that never started
    has no results."""
    (run_job, _), _setup = job_ids(run_id)
    return f"{node.layout.job_dir(run_job)}/started_at"


def _fetch_verified(node: Node, paths: Sequence[str], run_dir: Path,
                    newer_than: str | None = None) -> tuple[list[str], tuple[Refused, ...]]:
    t = node.transport
    verified = getattr(t, "get_tree_listed", None)
    if verified is not None:
        # The listing rides along with the tar stream (asked together: one round trip).
        expected, got = verified(node.layout.workdir, paths, run_dir, newer_than)
    else:
        expected = list_files(t, node.layout.workdir, paths, newer_than)
        got = t.get_tree(node.layout.workdir, paths, run_dir, newer_than)
    refused = {r.member for r in got.refused}
    wrong = sorted(name for name, size in expected.items() if name not in refused and got.sizes.get(name) != size)
    if wrong:
        raise _Mismatch(
            f"{len(wrong)} of {len(expected)} result file(s) did not arrive whole (e.g. {wrong[0]!r})",
            hint="they are still on the node",
        )
    return list(got.names), got.refused


def _retrying(fn: Callable, deadline: float, warn: Callable[[str], None], doing: str,  # noqa: ANN001
              gone: Callable[[], str | None] | None = None) -> tuple:
    """Call fn until it succeeds; retry link failures until the deadline (or until the node is
    known gone), mismatches a few times."""
    from cloudtrain.remote.channel import ConnectionLostError, SSHConnectError

    attempt, mismatches, delay = 0, 0, 0.5
    while True:
        attempt += 1
        try:
            return fn(), attempt
        except (ConnectionLostError, SSHConnectError) as exc:
            why = gone() if gone is not None else None
            if why is not None:
                raise RemoteError(f"{doing}: {exc.message}; the node is gone ({why})") from exc
            if time.monotonic() + delay > deadline:
                raise
            warn(f"{doing}: {exc.message}; trying again (attempt {attempt + 1})")
        except _Mismatch as exc:
            mismatches += 1
            if mismatches >= _MISMATCH_ATTEMPTS or time.monotonic() > deadline:
                raise
            warn(f"{doing}: {exc.message}; trying again")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _read_logs(node: Node, run_id: str) -> dict[str, bytes | None]:
    """Each job's whole log; None for a job that never started on this node."""
    return _as_logs(jobs.read_logs(node.transport, node.layout, [job_id for job_id, _ in job_ids(run_id)]))


def _start_logs(node: Node, run_id: str) -> Callable[[], dict[str, bytes | None]] | None:
    """_read_logs asked now, answered by the returned call; None if it could not even be asked."""
    try:
        finish = jobs.start_read_logs(node.transport, node.layout, [job_id for job_id, _ in job_ids(run_id)])
    except RemoteError as exc:
        log.debug("asking for the logs: %s", exc.one_line())
        return None
    return lambda: _as_logs(finish())


def _as_logs(found: dict[str, tuple[jobs.JobStatus, bytes]]) -> dict[str, bytes | None]:
    return {job_id: (None if state.state == JobState.PENDING and not data else data)
            for job_id, (state, data) in found.items()}


def _write_atomically(target: Path, data: bytes) -> None:
    tmp = target.with_name(f".{target.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def collect_again(lc, name: str, run_id: str | None, warn: Callable[[str], None]):  # noqa: ANN001, ANN201
    """`cloudtrain collect NAME [RUN]`: fetch a run's logs and results again into its run directory.

    Idempotent: files are replaced by fresh copies. Results are fetched only when no later run
    on the cluster has replaced them in the shared workdir; logs are per job and always fetched.
    Returns (run.json as updated, what this collect brought).
    """
    import json as _json

    from cloudtrain.errors import UsageError
    from cloudtrain.cluster.nodes import close_all, connect
    from cloudtrain.run.record import RunJson

    cluster = lc.get(name)
    runs = lc.store.list_runs(cluster=name, limit=1000)
    if run_id is None:
        if not runs:
            raise UsageError(f"cluster {name!r} has no runs to collect", hint="`cloudtrain run RECIPE --cluster NAME`")
        run = runs[0]
    else:
        run = next((r for r in runs if r.id == run_id), None)
        if run is None:
            from cloudtrain.yamlfile import did_you_mean

            hint = did_you_mean(run_id, [r.id for r in runs]) or f"see `cloudtrain status {name}`"
            raise UsageError(f"no run {run_id!r} on cluster {name!r}", hint=hint)
    if cluster.record.status == ClusterStatus.STOPPED:
        raise UsageError(f"cluster {name!r} is stopped", hint=f"`cloudtrain start {name}` first")
    if cluster.record.status in (ClusterStatus.TERMINATED, ClusterStatus.PROVISIONING, ClusterStatus.LAUNCH_FAILED):
        raise UsageError(f"cluster {name!r} is {cluster.record.status}: its nodes are not there to collect from",
                         hint=f"`cloudtrain status --refresh {name}`")
    if run.status == RunStatus.RUNNING and run.driver_alive():
        raise UsageError(f"run {run.id} is still running; `cloudtrain run` collects when it ends",
                         hint=f"`cloudtrain logs {name} -f` follows it")
    later = [r for r in runs if r.started_at > run.started_at]
    run_dir = Path(run.run_dir or "")
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = _json.loads(run.result_paths) if run.result_paths else []
    if later and paths:
        warn(f"results of {run.id} were replaced on the node by the later run {later[-1].id}: fetching its logs only")
    nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
    try:
        got = collect(nodes, run.id, paths, run_dir, window_s=lc.config.ssh.connect_retries_s, warn=warn,
                      results=not later)
    finally:
        close_all(nodes)
    try:
        record = RunJson.read(run_dir)
    except (OSError, ValueError, TypeError):
        record = None
    if record is not None:
        results = tuple(sorted(set(record.results) | set(got.files)))
        status = record.status
        error = record.error
        if got.complete and not later and record.exit_code == 0 and (record.error or "").startswith("collect failed"):
            status, error = RunStatus.SUCCEEDED, None
        # What this collect found under each result path replaces what the run knew (nothing, when
        # its own collect did not finish); logs only (a later run replaced the results) leave it.
        empty = got.empty_paths if got.complete and not later and paths else record.empty_result_paths
        record = record.with_collect(results=results, refused=tuple((x.member, x.reason) for x in got.refused),
                                     collect_error=got.error, collect_attempts=record.collect_attempts + got.attempts,
                                     status=status, error=error, empty_result_paths=empty)
        record.write(run_dir)
        lc.store.update_run(run.id, status=status, error=error)
    return run, got
