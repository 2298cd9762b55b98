"""Attaching to a running cluster: `exec` a command as a detached job, and print or follow logs."""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.errors import UsageError
from cloudtrain.events import NullReporter, Reporter
from cloudtrain.run.follow import follow as follow_log
from cloudtrain.run.prepare import PendingPrepare, prepare
from cloudtrain.run.prepare import sync as prepare_sync
from cloudtrain.cluster.lifecycle import Cluster, Lifecycle
from cloudtrain.cluster.nodes import Node, close_all, connect, on_all
from cloudtrain.remote import jobs
from cloudtrain.remote.jobs import JobState
from cloudtrain.remote.transport import Skipped
from cloudtrain.state import ClusterStatus, JobRecord, RunRecord

if TYPE_CHECKING:
    from cloudtrain.recipe import LoadedRecipe


def exec_command(lc: Lifecycle, reporter: Reporter, name: str, script: str, detach: bool, *,
                 sync: bool = True, env_overrides: Mapping[str, str] | None = None) -> tuple[str, jobs.JobStatus]:
    """Run a shell command on rank 0 of an existing cluster as a detached job; follow it unless asked not to.

    With `sync`, the workdir of the recipe the cluster was made from is synced first (only changes
    travel), so `exec` sees what you just edited. The job gets the recipe's `envs`, then `env_overrides`.
    """
    cluster = lc.get(name)
    _require_up(cluster)
    loaded = _cluster_recipe(cluster, reporter)
    nodes = connect(list(cluster.nodes[:1]), cluster.provider, lc.config)
    try:
        node = nodes[0]
        from cloudtrain.run import setup_once

        # A node whose setup this machine has not seen done is asked (and set up) before the command.
        setup_unknown = loaded is not None and bool(loaded.recipe.setup) and not setup_once.remembered(
            node, loaded.recipe)
        ahead = (_send_checks(node, loaded) if loaded is not None and sync and not detach and not setup_unknown
                 else None)
        if ahead is not None:
            # The job's start goes with the checks (one round trip, docs/design/sync.md); it runs only if they pass.
            node = replace(node, python=ahead[0].python)
        elif loaded is not None:
            node = prepare(node, loaded.recipe, reporter)
            if sync:
                prepare_sync(node, loaded, reporter)
            if setup_unknown:
                setup_once.ensure(lc.store, reporter, [node], loaded.recipe, name,
                                  "it never ran on this node for this recipe")
        else:
            node.transport.run(["mkdir", "-p", node.layout.workdir], what="creating the workdir")
            jobs.install_runtime(node.transport, node.layout)
        job_id = f"exec-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        now = time.time()
        lc.store.insert_job(JobRecord(
            id=job_id, cluster=name, run_id=None, job_dir=node.layout.job_dir(job_id), status=JobState.RUNNING,
            command=script, submitted_at=now, started_at=now, ended_at=None, exit_code=None,
        ))
        env = dict(loaded.recipe.envs) if loaded is not None else {}
        env.update(env_overrides or {})
        env.update({"CLOUDTRAIN_CLUSTER": name, "CLOUDTRAIN_NODE_RANK": "0",
                    "CLOUDTRAIN_NUM_NODES": str(len(cluster.nodes))})
        if node.python:
            env["CLOUDTRAIN_PYTHON"] = node.python
        # The start goes with what follows it (the follow, or the state): one round trip (remote/jobs.py).
        if ahead is not None:
            node.transport.only_if([check.proc for check in ahead])  # type: ignore[attr-defined]
        submitted = jobs.start_submit(node.transport, node.layout, job_id, script + "\n", env)
        if ahead is not None:
            submitted = _after_checks(node, ahead, reporter, submitted, lambda python: jobs.start_submit(
                node.transport, node.layout, job_id, script + "\n", {**env, "CLOUDTRAIN_PYTHON": python}))
        if detach:
            state = jobs.status(node.transport, node.layout, job_id)
            submitted()
            return job_id, state
        try:
            final = follow_log(node, job_id, 0, reporter, raw=lambda line: reporter.log_line(line), submitted=submitted)
        except KeyboardInterrupt:
            reporter.warn(f"stopped following; job {job_id} keeps running (`cloudtrain logs {name} {job_id} -f`)")
            raise
        lc.store.update_job(job_id, status=final.state, exit_code=final.exit_code, ended_at=time.time())
        return job_id, final
    finally:
        close_all(nodes)


def _send_checks(node: Node, loaded: LoadedRecipe) -> tuple | None:
    """exec's checks, sent now: the node is ready for the recipe with the python this laptop last saw
    (run/prepare.PendingPrepare) and the workdir is unchanged (remote/sync.UnchangedCheck). None where
    they cannot go ahead of the start: no node helper, data to sync, or no ready node remembered."""
    from cloudtrain.remote.ignore import load_ignore
    from cloudtrain.remote.sync import start_unchanged_check

    if loaded.recipe.data or loaded.workdir is None or not jobs.pipelining(node.transport):
        return None
    pending = PendingPrepare(node, loaded.recipe)
    if pending.python is None:
        return None
    pending.send()
    check = start_unchanged_check(node.transport, loaded.workdir, node.layout.workdir, load_ignore(loaded.workdir))
    return None if check is None else (pending, check)


def _after_checks(node: Node, ahead: tuple, reporter: Reporter, submitted: Callable[[], int],
                  again: Callable[[str], Callable[[], int]]) -> Callable[[], object]:
    """The start's answer, read after the checks': what they found missing is done first, and a
    start the node skipped for it is sent again, with the python the node has now (jobs.Resent: the
    follow sent with it was skipped too)."""
    pending, check = ahead

    def answer() -> object:
        node.transport.only_if(())  # type: ignore[attr-defined]
        ready = pending.finish(reporter)
        stats = check.finish()
        reporter.info(f"workdir: sent {stats.files_sent} of {stats.files_total} files ({stats.method})")
        try:
            return submitted()
        except Skipped:
            return jobs.Resent(again(ready.python or ""))

    return answer


def _require_up(cluster: Cluster) -> None:
    """A clear next step for every state a cluster can be in when work is asked of it."""
    name, status = cluster.record.name, cluster.record.status
    if status == ClusterStatus.UP:
        return
    if status == ClusterStatus.STOPPED:
        raise UsageError(f"cluster {name!r} is stopped", hint=f"`cloudtrain start {name}` first")
    raise UsageError(
        f"cluster {name!r} is {status}: its nodes are gone or not usable",
        hint=f"`cloudtrain down {name}`, then `cloudtrain up RECIPE --cluster {name}`",
    )


def _cluster_recipe(cluster: Cluster, reporter: Reporter) -> LoadedRecipe | None:
    """The recipe the cluster was made from, if it is still where it was and still loads."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.recipe import load_recipe

    path = cluster.record.recipe_path
    if not path or not Path(path).is_file():
        return None
    try:
        return load_recipe(path)
    except CloudtrainError as exc:
        reporter.warn(f"not syncing: the cluster's recipe {path} does not load ({exc.one_line()})")
        return None


def print_logs(lc: Lifecycle, name: str, job_id: str | None, follow: bool, resume: bool,
               write: Callable[[str], None] | None = None) -> jobs.JobStatus | None:
    """Print a job's log from the start (or, with resume, from where the last `logs` stopped).

    Returns the job's status, or None when the log came from a run directory (cluster gone).
    """
    emit = write or (lambda line: print(line, flush=True))
    if lc.store.get_cluster(name) is None:
        collected = _collected_log(lc, name, job_id)
        if collected is not None:
            # The cluster is down, but its last run brought the log home.
            for line in collected.read_text(errors="replace").splitlines():
                emit(line)
            return None
    cluster = lc.get(name)
    if job_id is None:
        all_jobs = lc.store.list_jobs(name)
        if not all_jobs:
            raise UsageError(f"cluster {name!r} has no jobs yet", hint=f"`cloudtrain run` or `cloudtrain exec {name} -- CMD`")
        job_id = all_jobs[-1].id
    elif lc.store.get_job(job_id) is None:
        from cloudtrain.yamlfile import did_you_mean

        hint = did_you_mean(job_id, [j.id for j in lc.store.list_jobs(name)]) or "see `cloudtrain status --json`"
        raise UsageError(f"no job {job_id!r} on cluster {name!r}", hint=hint)
    job = lc.store.get_job(job_id)
    assert job is not None
    store = lc.store
    offset = store.get_log_cursor(job_id) if resume else 0
    nodes = _connect_for_log(lc, cluster, job)
    printed = [offset]
    try:
        final = follow_log(
            nodes[0], job_id, offset, NullReporter(), raw=emit, on_offset=lambda o: printed.__setitem__(0, o),
            until_finished=follow
        )
    finally:
        # Saved once, on the way out (also on Ctrl-C): the offset just past the last printed line.
        store.set_log_cursor(job_id, printed[0])
        close_all(nodes)
    if final.finished:
        store.update_job(job_id, status=final.state, exit_code=final.exit_code, ended_at=final.ended_at or time.time())
    return final


def print_watchdog_log(lc: Lifecycle, name: str, write: Callable[[str], None] | None = None) -> None:
    """`logs NAME --watchdog`: every decision the on-node watchdog logged (autostop, budget), per node.

    Reading it opens an SSH session, which counts as activity for `wait_for: jobs_and_ssh`.
    """
    from cloudtrain.run.watchdog import print_logs as print_watchdog

    print_watchdog(lc, name, write or (lambda line: print(line, flush=True)))


def _collected_log(lc: Lifecycle, name: str, job_id: str | None = None) -> Path | None:
    """The job.log a run of the (down) cluster brought home: JOB's run, default the last one; a
    clear error when JOB was none of its runs' jobs, or when that run did not bring its log home."""
    runs = [r for r in lc.store.list_runs(cluster=name, limit=_DOWN_RUNS_SEARCHED) if r.run_dir]
    if not runs:
        return None
    run = runs[0]
    if job_id is not None:
        known = [(r, _job_of(r)) for r in runs]
        run = next((r for r, job in known if job_id in (job, r.id)), None)  # type: ignore[assignment]
        if run is None:
            from cloudtrain.yamlfile import did_you_mean

            jobs_known = [job for _, job in known]
            listed = ", ".join(jobs_known[:5]) + (f" and {len(jobs_known) - 5} more" if len(jobs_known) > 5 else "")
            raise UsageError(f"cluster {name!r} is down and none of its runs had job {job_id!r}",
                             hint=did_you_mean(job_id, jobs_known) or f"its runs' jobs, newest first: {listed}")
    log = Path(run.run_dir) / "job.log"  # type: ignore[arg-type]
    if log.is_file():
        return log
    raise UsageError(
        f"cluster {name!r} is down and its run {run.id} did not bring its log home",
        hint=f"the log was on the node and went with it; {run.run_dir}/run.json says why",
    )


# How far back `logs NAME JOB` looks for JOB among a down cluster's runs.
_DOWN_RUNS_SEARCHED = 200


def _job_of(run: RunRecord) -> str:
    """The job id a run's run.json names (a run's job is `<run id>-run` where run.json is unreadable)."""
    import json

    try:
        recorded = json.loads((Path(run.run_dir) / "run.json").read_text()).get("job_id")  # type: ignore[arg-type]
    except (OSError, ValueError, AttributeError):
        recorded = None
    return recorded if isinstance(recorded, str) and recorded else f"{run.id}-run"


def _connect_for_log(lc: Lifecycle, cluster: Cluster, job: JobRecord) -> list:  # noqa: ANN401
    from cloudtrain.errors import RemoteError

    try:
        return connect(list(cluster.nodes[:1]), cluster.provider, lc.config)
    except RemoteError as exc:
        where = f"{job.job_dir}/log"
        run = f" {job.run_id}" if job.run_id else ""
        raise RemoteError(
            f"cannot reach cluster {cluster.record.name!r} to read job {job.id}: {exc.message}",
            hint=f"the log is on the node at {where}; `cloudtrain collect {cluster.record.name}{run}` "
                 "fetches it once the node is reachable",
        ) from None


def cancel(lc: Lifecycle, name: str, job_id: str | None, all_jobs: bool) -> list[tuple[str, str]]:
    """End a job (default: the cluster's latest open job; all open ones with all_jobs) on every node.

    Returns (job id, final state) for each job that was open. The job's processes and everything
    they started get TERM, then KILL after a grace period (templates/runner.sh).
    """
    from cloudtrain.cluster.lifecycle import end_open_jobs
    from cloudtrain.remote.jobs import OPEN_STATES
    from cloudtrain.run.jobstate import refresh_jobs

    cluster = lc.get(name)
    if job_id is not None and (lc.store.get_job(job_id) is None or lc.store.get_job(job_id).cluster != name):  # type: ignore[union-attr]
        from cloudtrain.yamlfile import did_you_mean

        hint = did_you_mean(job_id, [j.id for j in lc.store.list_jobs(name)]) or "see `cloudtrain status NAME`"
        raise UsageError(f"no job {job_id!r} on cluster {name!r}", hint=hint)
    if cluster.record.status == ClusterStatus.STOPPED:
        end_open_jobs(lc.store, name)
        return []
    nodes = connect(list(cluster.nodes), cluster.provider, lc.config)
    try:
        rows = refresh_jobs(lc.store, name, nodes)
        open_jobs = [j for j in rows if j.status in OPEN_STATES]
        if job_id is not None:
            targets = [j for j in open_jobs if j.id == job_id]
        elif all_jobs:
            targets = open_jobs
        else:
            targets = open_jobs[-1:]
        ended = []
        for job in targets:
            # How it ended comes with the kill: right after it, the run following the job may
            # take the cluster down (a local node's directory is gone then).
            final = on_all(nodes, lambda n, j=job.id: jobs.kill(n.transport, n.layout, j))[0]
            state = final.state if final is not None else JobState.LOST
            lc.store.update_job(job.id, status=state, exit_code=final.exit_code if final else None,
                                ended_at=(final.ended_at if final else None) or time.time())
            ended.append((job.id, state))
        return ended
    finally:
        close_all(nodes)
