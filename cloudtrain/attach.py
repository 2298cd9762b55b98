"""Attaching to a running cluster: `exec` a command as a detached job, and print or follow logs."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from cloudtrain.errors import UsageError
from cloudtrain.events import NullReporter, Reporter
from cloudtrain.execution import Executor
from cloudtrain.lifecycle import Lifecycle
from cloudtrain.nodes import close_all, connect, on_all
from cloudtrain.remote import jobs
from cloudtrain.state import JobRecord


def exec_command(lc: Lifecycle, reporter: Reporter, name: str, script: str, detach: bool) -> tuple[str, jobs.JobStatus]:
    """Run a shell command on rank 0 of an existing cluster as a detached job; follow it unless asked not to."""
    cluster = lc.get(name)
    if cluster.record.status != "up":
        raise UsageError(f"cluster {name!r} is {cluster.record.status}", hint=f"`cloudtrain start {name}` first")
    executor = Executor(lc, reporter)
    nodes = connect(list(cluster.nodes[:1]), cluster.provider, lc.config)
    try:
        node = nodes[0]
        on_all(nodes, lambda n: n.transport.run(["mkdir", "-p", n.layout.workdir]))
        jobs.install_runtime(node.transport, node.layout)
        job_id = f"exec-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        now = time.time()
        lc.store.insert_job(JobRecord(
            id=job_id, cluster=name, run_id=None, job_dir=node.layout.job_dir(job_id), status="running",
            command=script, submitted_at=now, started_at=now, ended_at=None, exit_code=None,
        ))
        env = {"CLOUDTRAIN_CLUSTER": name, "CLOUDTRAIN_NODE_RANK": "0", "CLOUDTRAIN_NUM_NODES": str(len(cluster.nodes))}
        jobs.submit(node.transport, node.layout, job_id, script + "\n", env)
        if detach:
            return job_id, jobs.status(node.transport, node.layout, job_id)
        try:
            final = executor.follow(node, job_id, 0, raw=lambda line: reporter.log_line(line))
        except KeyboardInterrupt:
            reporter.warn(f"stopped following; job {job_id} keeps running (`cloudtrain logs {name} {job_id} -f`)")
            raise
        lc.store.update_job(job_id, status=final.state, exit_code=final.exit_code, ended_at=time.time())
        return job_id, final
    finally:
        close_all(nodes)


def print_logs(lc: Lifecycle, name: str, job_id: str | None, follow: bool, resume: bool,
               write: Callable[[str], None] | None = None) -> jobs.JobStatus:
    """Print a job's log from the start (or, with resume, from where the last `logs` stopped)."""
    if lc.store.get_cluster(name) is None:
        runs = [r for r in lc.store.list_runs(cluster=name, limit=1) if r.run_dir]
        if runs:
            # The cluster is down, but its last run brought the log home.
            raise UsageError(f"cluster {name!r} is down", hint=f"its last run's log is {runs[0].run_dir}/job.log")
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
    store = lc.store
    offset = store.get_log_cursor(job_id) if resume else 0
    # Flushed per line: a follower piped into grep or a file sees lines as they come.
    emit = write or (lambda line: print(line, flush=True))
    nodes = connect(list(cluster.nodes[:1]), cluster.provider, lc.config)
    printed = [offset]
    try:
        return Executor(lc, NullReporter()).follow(
            nodes[0], job_id, offset, raw=emit, on_offset=lambda o: printed.__setitem__(0, o), until_finished=follow
        )
    finally:
        # Saved once, on the way out (also on Ctrl-C): the offset just past the last printed line.
        store.set_log_cursor(job_id, printed[0])
        close_all(nodes)
