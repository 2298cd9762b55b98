"""Keeping job rows true: the node is the authority on a job's state, state.db only remembers it.

Every CLI path that shows or acts on a job (`status NAME`, `status --refresh`, `logs`, `cancel`,
`run`'s busy check) asks the node for the jobs state.db still calls running. Plain `status`
stays fast: it reads local nodes' job files directly and never opens SSH.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.remote.jobs import OPEN_STATES, JobState
from cloudtrain.state import JobRecord, StateStore

if TYPE_CHECKING:
    from cloudtrain.cluster.nodes import Node


def refresh_jobs(store: StateStore, cluster: str, nodes: Sequence[Node]) -> list[JobRecord]:
    """Ask rank 0 about every job of `cluster` that state calls open; return the cluster's jobs."""
    from cloudtrain.remote import jobs

    if nodes:
        head = nodes[0]
        for job in store.list_jobs(cluster):
            if job.status not in OPEN_STATES:
                continue
            status = jobs.status(head.transport, head.layout, job.id)
            if status.state not in OPEN_STATES:
                store.update_job(job.id, status=status.state, exit_code=status.exit_code,
                                 ended_at=status.ended_at or time.time())
    return store.list_jobs(cluster)


def peek_local(job: JobRecord) -> JobRecord:
    """A job on a node that is a directory on this machine, read from its files without starting a
    shell (for plain `status`); other jobs are returned as state knows them.

    The node's own rule (cloudtrain/node/jobs.py read_job, what `runner.sh status` says): exit_code
    present means over; a supervisor that is gone without one means lost, "gone" judged by its
    recorded identity (boot id, pid, start time), so a pid reused after a reboot is not taken for the
    job. A job whose directory is gone is lost too; one not started yet stays as state has it.
    """
    if job.status not in OPEN_STATES or not _on_this_machine(job):
        return job
    from cloudtrain.node.jobs import read_job

    if not Path(job.job_dir).is_dir():
        return _with(job, JobState.LOST, None, None)
    seen = read_job(job.job_dir)
    if seen.state.open:
        return job
    return _with(job, JobState(seen.state.value), seen.exit_code, seen.ended_at)


def _on_this_machine(job: JobRecord) -> bool:
    """Nodes that are directories here live under cloudtrain's home; any other path is a remote
    node's, and its files must be asked for over SSH (a local path of the same name proves nothing)."""
    from cloudtrain import paths

    return Path(job.job_dir).resolve().is_relative_to(paths.home().resolve())


def _with(job: JobRecord, state: str, code: int | None, ended: float | None) -> JobRecord:
    from dataclasses import replace

    return replace(job, status=state, exit_code=code, ended_at=ended or job.ended_at or time.time())
