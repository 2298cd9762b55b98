"""`cloudtrain collect NAME [RUN] --from-bucket`: bring a run's uploaded results home from its bucket.

Runs templates/bucket_copy.py on this machine with your own configured store credentials (the
nodes used theirs to upload), into the run directory, where `collect` would put them: the upload
holds the result paths relative to the workdir, so the layout is the same. Incremental like the
nodes' copy: a second fetch brings only what changed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cloudtrain import paths
from cloudtrain.buckets.steps import COPY_SCRIPT, node_env
from cloudtrain.errors import RemoteError, UsageError
from cloudtrain.state import StateStore

STATE_FILE = ".bucket-collect.json"


def fetch_uploaded(store: StateStore, name: str, run_id: str | None, say: Callable[[str], None]) -> Path:
    """Copy RUN's (default: the cluster's latest run's) upload into its run directory; returns it."""
    from cloudtrain.run.record import RunJson

    runs = store.list_runs(cluster=name, limit=1000)
    run = runs[0] if (runs and run_id is None) else next((r for r in runs if r.id == run_id), None)
    if run is None:
        raise UsageError(f"no run {run_id!r} on cluster {name!r}" if run_id else f"cluster {name!r} has no runs",
                         hint=f"see `cloudtrain status {name}`")
    run_dir = Path(run.run_dir or "")
    try:
        url = RunJson.read(run_dir).upload
    except (OSError, ValueError) as exc:
        raise UsageError(f"run {run.id}: cannot read {run_dir}/run.json: {exc}") from None
    if not url:
        raise UsageError(f"run {run.id} uploaded nothing: its recipe has no upload:",
                         hint=f"`cloudtrain collect {name} {run.id}` fetches from the node")
    if importlib.util.find_spec("obstore") is None:
        raise UsageError("collect --from-bucket copies with obstore, which is not installed here",
                         hint="pip install 'cloudtrain[buckets]'")
    env = {**os.environ, **node_env("configured", "your configured store credentials")}
    say(f"collect {url} -> {run_dir} with your configured store credentials")
    proc = subprocess.Popen([sys.executable, str(paths.templates_dir() / COPY_SCRIPT), "get", url, str(run_dir),
                             "--state", str(run_dir / STATE_FILE)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        say(line.rstrip("\n"))
    error = proc.stderr.read() if proc.stderr is not None else ""
    if proc.wait() != 0:
        raise RemoteError(error.strip().splitlines()[-1] if error.strip() else f"bucket copy exit {proc.returncode}")
    return run_dir
