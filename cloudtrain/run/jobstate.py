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

    Mirrors `runner.sh status`: exit_code present means over; a supervisor that is gone without
    one means lost, "gone" judged by its recorded identity (boot id, pid, start time: procid), so a
    pid reused after a reboot is not taken for the job.
    """
    if job.status not in OPEN_STATES or not _on_this_machine(job):
        return job
    job_dir = Path(job.job_dir)
    ended = _ended(job, job_dir)
    if ended is not None:
        return ended
    pid_text = _read(job_dir / "pid")
    if pid_text is None or not pid_text.isdigit():
        return job if job_dir.exists() else _with(job, JobState.LOST, None, None)
    from cloudtrain import procid

    if not procid.alive(_read(job_dir / "identity"), int(pid_text)):
        # The supervisor writes exit_code, then exits: one that ended since the first look left it.
        return _ended(job, job_dir) or _with(job, JobState.LOST, None, None)
    return job


def _ended(job: JobRecord, job_dir: Path) -> JobRecord | None:
    """The job as its exit_code says it ended; None while there is none."""
    code_text = _read(job_dir / "exit_code")
    if code_text is None or not code_text.lstrip("-").isdigit():
        return None
    code = int(code_text)
    if code == 0:
        state = JobState.SUCCEEDED
    elif (job_dir / "cancelled").exists() or code == 143:
        state = JobState.KILLED
    else:
        state = JobState.FAILED
    ended = _read(job_dir / "ended_at")
    return _with(job, state, code, float(ended) if ended and ended.isdigit() else None)


def _on_this_machine(job: JobRecord) -> bool:
    """Nodes that are directories here live under cloudtrain's home; any other path is a remote
    node's, and its files must be asked for over SSH (a local path of the same name proves nothing)."""
    from cloudtrain import paths

    return Path(job.job_dir).resolve().is_relative_to(paths.home().resolve())


def _with(job: JobRecord, state: str, code: int | None, ended: float | None) -> JobRecord:
    from dataclasses import replace

    return replace(job, status=state, exit_code=code, ended_at=ended or job.ended_at or time.time())


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
