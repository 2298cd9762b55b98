"""The `local` provider: a node is a directory on this machine under $CLOUDTRAIN_HOME/local.

It follows the same contract as a cloud, so the whole pipeline (state, runtime, sync, collect,
teardown) is exercised without an account. Instance metadata (tags, state) lives in a JSON file in
the node directory, which is what `list_tagged` scans, like a cloud API listing by tag.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudtrain import paths
from cloudtrain.config import Config
from cloudtrain.providers.base import (
    ClusterResource,
    TAG_CLUSTER,
    TAG_INCARNATION,
    Traits,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
)

_META = "instance.json"
# A node directory being deleted is renamed to this prefix first; listings skip it.
_GRAVE_PREFIX = ".deleting-"
# How long a delete keeps going while a writer that held the directory open finishes.
_REMOVE_WITHIN_S = 10.0


class LocalProvider:
    name = "local"
    traits = Traits(remote=False, priced=False)

    def __init__(self, base: Path | None = None) -> None:
        self.base = base or paths.home() / "local"

    # Nothing here is regional, and nothing is created besides the nodes themselves.
    default_region = None

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        return []

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        return []

    def check_credentials(self) -> CredentialStatus:
        return CredentialStatus("local", True, f"runs on this machine under {self.base}")

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        instances = []
        for rank in range(count):
            instance_id = f"local-{spec.cluster}-{rank}"
            node_dir = self._dir(instance_id)
            node_dir.mkdir(parents=True, exist_ok=True)
            meta = {"id": instance_id, "state": InstanceState.RUNNING.value, "tags": spec.all_tags(),
                    "launched_at": time.time()}
            self._write_meta(node_dir, meta)
            instances.append(self._instance(node_dir, meta))
        return instances

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found = []
        for instance_id in ids:
            node_dir = self._dir(instance_id)
            meta = self._read_meta(node_dir)
            found.append(
                self._instance(node_dir, meta)
                if meta
                else Instance(id=instance_id, cluster="", state=InstanceState.TERMINATED)
            )
        return found

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        if not self.base.is_dir():
            return []
        found = []
        for node_dir in sorted(self.base.iterdir()):
            if node_dir.name.startswith(_GRAVE_PREFIX):
                continue
            meta = self._read_meta(node_dir)
            if meta and (cluster is None or meta["tags"].get(TAG_CLUSTER) == cluster):
                found.append(self._instance(node_dir, meta))
        return found

    def stop(self, ids: Sequence[str]) -> None:
        for instance_id in ids:
            node_dir = self._dir(instance_id)
            meta = self._read_meta(node_dir)
            if meta:
                # Said before the jobs are ended, as a cloud says `stopping` before the OS goes down:
                # whoever sees a job die meanwhile can tell the machine went, not the job.
                meta["state"] = InstanceState.STOPPING.value
                self._write_meta(node_dir, meta)
                # A stopped machine runs nothing: end every job the node still has.
                _kill_jobs(node_dir)
                meta["state"] = InstanceState.STOPPED.value
                self._write_meta(node_dir, meta)

    def start(self, ids: Sequence[str]) -> None:
        for instance_id in ids:
            node_dir = self._dir(instance_id)
            meta = self._read_meta(node_dir)
            if meta:
                meta["state"] = InstanceState.RUNNING.value
                self._write_meta(node_dir, meta)

    def terminate(self, ids: Sequence[str]) -> None:
        for instance_id in ids:
            node_dir = self._dir(instance_id)
            meta = self._read_meta(node_dir)
            if meta:
                # Marked first (EC2's shutting-down also reads as terminated): a job killed by this
                # is seen as its machine going away, not as the job failing.
                meta["state"] = InstanceState.TERMINATED.value
                self._write_meta(node_dir, meta)
            if node_dir.exists():
                _kill_jobs(node_dir)
                _remove_node_dir(node_dir)

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        """This machine is never powered off: the watchdog does what `cloudtrain stop` / `down`
        do to a local node (end its jobs; mark it stopped, or remove its directory), through
        `python -m cloudtrain.providers.local`, and then ends itself."""
        verb = "terminate" if down else "stop"
        return {"kind": "exec", "effect": "delete" if down else "stop", "exit_after": True,
                "argv": [sys.executable, "-m", "cloudtrain.providers.local", verb, "--base", str(self.base), instance.id]}

    def _dir(self, instance_id: str) -> Path:
        return self.base / instance_id

    def _instance(self, node_dir: Path, meta: dict) -> Instance:
        return Instance(
            id=meta["id"],
            cluster=meta["tags"].get(TAG_CLUSTER, ""),
            incarnation=meta["tags"].get(TAG_INCARNATION),
            state=InstanceState(meta["state"]),
            instance_type="local",
            region="local",
            public_ip="127.0.0.1",
            private_ip="127.0.0.1",
            launched_at=meta.get("launched_at"),
            home=str(node_dir),
        )

    @staticmethod
    def _read_meta(node_dir: Path) -> dict | None:
        try:
            return json.loads((node_dir / _META).read_text())
        except FileNotFoundError:
            return None

    @staticmethod
    def _write_meta(node_dir: Path, meta: dict) -> None:
        tmp = node_dir / f".{_META}.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, node_dir / _META)


def _remove_node_dir(node_dir: Path) -> None:
    """Delete a node directory that others may still be writing into; a node already gone is success.

    Moved aside first: whoever still writes by path (the CLI pulling a checkpoint or writing a job
    file, the node's watchdog logging its last tick) then misses it instead of putting files back into
    a directory being deleted, which made rmtree fail with "Directory not empty". A writer holding a
    directory open can still add a file, so the delete is repeated until nothing comes back.
    """
    grave = node_dir.with_name(f"{_GRAVE_PREFIX}{node_dir.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(node_dir, grave)
    except FileNotFoundError:
        return  # deleted by someone else (a watchdog and `down` may race): gone is success
    deadline = time.monotonic() + _REMOVE_WITHIN_S
    while True:
        try:
            shutil.rmtree(grave)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _kill_jobs(node_dir: Path) -> None:
    """End every job under this node, and everything each job started, through the runner.

    The runner knows a job's whole session (process groups and orphans included), and it is the
    same code `down` and `cancel` use on remote nodes.
    """
    runner = paths.templates_dir() / "runner.sh"
    for jobs_dir in sorted(node_dir.glob(".cloudtrain/*/jobs")):
        subprocess.run(["sh", str(runner), "kill-all", str(jobs_dir)], capture_output=True, check=False, timeout=120)


def make_provider(config: Config) -> LocalProvider:
    return LocalProvider()
