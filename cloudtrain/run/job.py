"""A job on every node of a cluster: its environment, the submit, waiting for it, ending it."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from cloudtrain.cluster.nodes import Node, on_all
from cloudtrain.errors import JobFailedError, RemoteError
from cloudtrain.events import Reporter
from cloudtrain.recipe import Recipe
from cloudtrain.remote import jobs
from cloudtrain.remote.local import LocalTransport
from cloudtrain.run import multinode
from cloudtrain.run.follow import POLL_S, follow, pause, status_retrying
from cloudtrain.remote.jobs import JobState
from cloudtrain.run.stop import StopToken
from cloudtrain.state import JobRecord, StateStore


def run_job(store: StateStore, reporter: Reporter, nodes: Sequence[Node], run_id: str, job_id: str, script: str,
            recipe: Recipe, what: str, started: list[str], stop: StopToken | None = None,
            on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Start `script` as job `job_id` on every node, stream rank 0's log, wait for all; raise
    JobFailedError naming the first node that did not succeed. `started` gets the job id before
    the submit: a job whose start cannot be confirmed must still be ended by the caller. `stop`:
    the attempt's stop token (run/stop.py); the follow's and the wait's pauses end when it is set.
    `on_event`: told each progress event of the job (the run's controller, run/controller.py)."""
    now = time.time()
    store.insert_job(JobRecord(
        id=job_id, cluster=nodes[0].record.cluster, run_id=run_id, job_dir=nodes[0].layout.job_dir(job_id),
        status=JobState.RUNNING, command=what, submitted_at=now, started_at=now, ended_at=None, exit_code=None,
    ))
    started.append(job_id)
    # Every node must see the same TF_CONFIG: build all envs here, not inside the parallel submit.
    ports = _worker_ports(nodes)
    master_port = _free_port() if _loopback(nodes) else multinode.MASTER_PORT
    envs = {n.rank: job_env(nodes, n, run_id, recipe, ports, job_id, master_port) for n in nodes}
    script = multinode.hostfile_prelude([n.address for n in nodes], recipe.resources.accelerator_count) + script
    submitted = None
    if len(nodes) == 1:
        # The start and the follow of its log in one round trip (the node runs them in order).
        submitted = jobs.start_submit(nodes[0].transport, nodes[0].layout, job_id, script, envs[nodes[0].rank])
    else:
        on_all(list(nodes), lambda n: jobs.submit(n.transport, n.layout, job_id, script, envs[n.rank]))
    final = follow(nodes[0], job_id, 0, reporter, others=nodes[1:],
                   on_worker_failure=lambda: kill_everywhere(nodes, job_id, reporter), submitted=submitted,
                   stop=stop, on_event=on_event)
    statuses = [final] + [_wait_finished(n, job_id, reporter, stop=stop) for n in nodes[1:]]
    worst = next((s for s in statuses if s.state != JobState.SUCCEEDED), final)
    store.update_job(job_id, status=worst.state, exit_code=worst.exit_code, ended_at=time.time())
    for rank, st in enumerate(statuses):
        if st.state != JobState.SUCCEEDED:
            code = st.exit_code if st.exit_code is not None else 1
            if st.state == JobState.KILLED:
                # Ended from outside, not by itself: `cloudtrain cancel` or `down` from another
                # terminal, or a scheduler's cancel or preemption (Slurm).
                raise JobFailedError(f"{what} on node {rank} was cancelled (killed from outside: `cloudtrain cancel`, "
                                     f"`down`, or the scheduler; exit code {code})", code, cancelled=True)
            raise JobFailedError(f"{what} on node {rank} {st.state} (exit code {code})", code)


def job_env(nodes: Sequence[Node], node: Node, run_id: str, recipe: Recipe, ports: Sequence[int],
            job_id: str | None = None, master_port: int = multinode.MASTER_PORT) -> dict[str, str]:
    env = dict(recipe.envs)
    ips = [n.address for n in nodes]
    local = isinstance(node.transport, LocalTransport)
    env.update({
        "CLOUDTRAIN_RUN_ID": run_id,
        "CLOUDTRAIN_CLUSTER": node.record.cluster,
        "CLOUDTRAIN_NODE_RANK": str(node.rank),
        "CLOUDTRAIN_NUM_NODES": str(len(nodes)),
        "CLOUDTRAIN_NODE_IPS": ",".join(ips),
        "CLOUDTRAIN_RUNTIME": node.layout.runtime,
        "CLOUDTRAIN_PYTHON": node.python or (sys.executable if local else "python3"),
    })
    # MASTER_ADDR, WORLD_SIZE, NODE_RANK, ... and the MPI hostfile (run/multinode.py)
    env.update(multinode.conventions(ips, node.rank, recipe.resources.accelerator_count, master_port,
                                     f"{node.layout.job_dir(job_id)}/hostfile" if job_id else None))
    if recipe.job is not None and len(nodes) > 1:
        env["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"{ip}:{port}" for ip, port in zip(ips, ports)]},
            "task": {"type": "worker", "index": node.rank},
        })
    return env


def kill_everywhere(nodes: Sequence[Node], job_id: str, reporter: Reporter) -> None:
    """End the job and everything it started on each node; a node that cannot be reached is reported."""
    for node in nodes:
        try:
            jobs.kill(node.transport, node.layout, job_id)
        except RemoteError as exc:
            reporter.warn(f"could not stop the job on node {node.rank}: {exc.one_line()}")


def end_jobs(store: StateStore, reporter: Reporter, nodes: Sequence[Node], job_ids: Sequence[str]) -> None:
    """End every listed job on every node, and record how each ended."""
    for job_id in job_ids:
        kill_everywhere(nodes, job_id, reporter)
        try:
            final = jobs.status(nodes[0].transport, nodes[0].layout, job_id)
        except RemoteError as exc:
            reporter.warn(f"could not read the state of job {job_id}: {exc.one_line()}")
            continue
        store.update_job(job_id, status=final.state, exit_code=final.exit_code, ended_at=final.ended_at or time.time())


def _loopback(nodes: Sequence[Node]) -> bool:
    return all(n.address.startswith("127.") for n in nodes)


def _worker_ports(nodes: Sequence[Node]) -> list[int]:
    # Nodes on one address (local, or several sshd on one host) need distinct free ports.
    if _loopback(nodes):
        return [_free_port() for _ in nodes]
    return [29500 + n.rank for n in nodes]


def _wait_finished(node: Node, job_id: str, reporter: Reporter, timeout_s: float = 600.0,
                   stop: StopToken | None = None) -> jobs.JobStatus:
    """Rank 0 finished; the others end moments later (or hang on a collective: then time out). A
    stopped attempt waits no longer: the caller ends its jobs (pipeline's end_jobs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = status_retrying(node, job_id, stop)
        if status.finished:
            return status
        if time.monotonic() > deadline:
            kill_everywhere([node], job_id, reporter)
            return status_retrying(node, job_id, stop)
        if pause(stop, POLL_S) and stop is not None:
            stop.check()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
