"""A job's latest checkpoint, kept on the laptop so that a retry after a preemption resumes from it.

One implementation for sweeps (a trial's attempts) and for `run` with `recover:` (run/recover.py,
the run's attempts): only the node directory differs (`node_dir(trial)` / `run_node_dir(run_id)`).

While an attempt runs, each per-epoch progress line (`{"cloudtrain": "progress", "type": "epoch"}`)
makes a `Puller` copy the attempt's newest checkpoint from the node (rank 0) into
`runs/sweep-<id>/trials/tNNNN-aK/checkpoint/`, in a thread of its own with its own connection (the
job's log is never held up), coalescing epochs that come faster than a copy:

- the bundled job (`job:`): its checkpoint of that epoch (`outputs/checkpoints/ckpt-N.*`, written
  before the progress line is printed, never rewritten) and `outputs/train_state.json`; the
  `checkpoint` index is written here, naming ckpt-N. Each epoch copies one checkpoint.
- a `run:` command: the files of its `CLOUDTRAIN_CHECKPOINT_DIR` that are new, changed size, or small
  (< 64 KiB: index files are rewritten in place); a large file rewritten at the same size is not
  copied again, so write each checkpoint to a new name, and print the progress line after it is
  complete.
Each copy lands in a staging directory and replaces the kept one whole: a copy cut short (the VM
went away) leaves the previous one.

When the scheduler retries a trial whose last attempts were preempted or lost (or never started),
the newest checkpoint they kept is carried into the new attempt's directory and uploaded into its
`CLOUDTRAIN_CHECKPOINT_DIR` on every node just before the job starts (after sync and setup). The
bundled job's script copies it into `outputs/`, where the job resumes from it (`resumed_from_epoch`
in its metrics); a `run:` command reads it itself. CLOUDTRAIN_CHECKPOINT_DIR is relative to the job's
working directory (the synced workdir) and per trial (`.cloudtrain-checkpoints/tNNNN`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cloudtrain.errors import CloudtrainError

log = logging.getLogger(__name__)

CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"
KEPT = "checkpoint"  # under an attempt's directory
INFO = "cloudtrain-checkpoint.json"  # what the kept copy is: epoch, when
SMALL_BYTES = 64 * 1024
CARRY_FROM = frozenset({"preempted", "lost", "not-started"})


def node_dir(trial: int) -> str:
    """The trial's CLOUDTRAIN_CHECKPOINT_DIR, relative to the job's working directory (the workdir)."""
    return f".cloudtrain-checkpoints/t{trial:04d}"


def run_node_dir(run_id: str) -> str:
    """A recovering run's CLOUDTRAIN_CHECKPOINT_DIR: per run, so a reused cluster's earlier run never
    hands its checkpoint to a new one."""
    return f".cloudtrain-checkpoints/{run_id}"


def kept_epoch(kept: Path) -> int | None:
    try:
        return int(json.loads((kept / INFO).read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def carried(attempt_dirs: Callable[[int], Path], attempts: Iterable[Any], trial: int, attempt: int) -> Path | None:
    """The newest checkpoint kept by the trial's attempts just before `attempt`, as long as they
    were preempted, lost or never started (a failed job starts over), or None."""
    states = {a.attempt: str(a.state) for a in attempts if a.trial == trial}
    for earlier in range(attempt - 1, 0, -1):
        if states.get(earlier) not in CARRY_FROM:
            return None
        kept = attempt_dirs(earlier) / KEPT
        if kept_epoch(kept) is not None:
            return kept
    return None


def _replace_dir(staging: Path, kept: Path) -> None:
    old = kept.with_name(kept.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if kept.exists():
        os.replace(kept, old)
    os.replace(staging, kept)
    if old.exists():
        shutil.rmtree(old)


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class Puller:
    """Keeps the newest checkpoint of one running attempt on the laptop (see the module docstring)."""

    def __init__(self, open_node: Callable[[], Any], kept: Path, bundled: bool, trial: int,
                 warn: Callable[[str], None], rel: str | None = None) -> None:
        self.open_node = open_node  # -> (node, close) for rank 0 of the attempt's cluster
        self.kept = kept
        self.bundled = bundled
        self.trial = trial
        self.rel = rel or node_dir(trial)  # CLOUDTRAIN_CHECKPOINT_DIR, relative to the workdir
        self.warn = warn
        self._wanted = 0
        self._done = kept_epoch(kept) or 0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.pulls = 0

    def epoch(self, epoch: int) -> None:
        """The job reported this epoch done (its checkpoint is written)."""
        with self._lock:
            if epoch <= max(self._wanted, self._done) or self._closed.is_set():
                return
            self._wanted = epoch
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"checkpoints trial {self.trial}", daemon=True)
                self._thread.start()
        self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def pull_newest(self, node: Any) -> int | None:
        """After close(), on a node still up (an interruption notice's window): copy its newest
        checkpoint now, whatever epochs were reported. The bundled job's newest `ckpt-N`; a `run:`
        command's checkpoint dir as it is (labelled one past the last reported epoch: a checkpoint
        written on SIGTERM, mid-epoch). Returns the epoch kept, or None when there was nothing newer."""
        from cloudtrain.remote.archive import list_files

        if self.bundled:
            listing = list_files(node.transport, node.layout.workdir, ["outputs/checkpoints"])
            numbers = [int(m.group(1)) for name in listing
                       if (m := re.match(r"outputs/checkpoints/ckpt-(\d+)\.index$", name))]
            epoch = max(numbers, default=0)
            if epoch <= self._done:
                return None
        else:
            if not list_files(node.transport, node.layout.workdir, [self.rel]):
                return None
            epoch = max(self._wanted, self._done) + 1
        self._pull(node, epoch)
        self._done = epoch
        self.pulls += 1
        return epoch

    def _loop(self) -> None:
        node, close = None, None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._closed.is_set():
                    return
                wanted = self._wanted
                if wanted <= self._done:
                    continue
                try:
                    if node is None:
                        node, close = self.open_node()
                    self._pull(node, wanted)
                    self._done = wanted
                    self.pulls += 1
                except CloudtrainError as exc:
                    # The VM may be going away (a preemption): the previous copy stays.
                    log.debug("trial %s: checkpoint of epoch %s not copied: %s", self.trial, wanted, exc.one_line())
                except OSError as exc:
                    self.warn(f"could not keep the checkpoint of epoch {wanted}: {exc}")
        finally:
            if close is not None:
                close()

    def _pull(self, node: Any, epoch: int) -> None:
        from cloudtrain.remote.archive import list_files

        t, workdir = node.transport, node.layout.workdir
        staging = self.kept.with_name(self.kept.name + ".new")
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        if self.bundled:
            listing = list_files(t, workdir, ["outputs/checkpoints"])
            pattern = re.compile(rf"outputs/checkpoints/ckpt-{epoch}\.(index|data-.*)$")
            wanted = {name: size for name, size in listing.items() if pattern.match(name)}
            if not any(name.endswith(".index") for name in wanted):
                raise _Gone(f"no checkpoint of epoch {epoch} on the node (a newer one replaced it)")
            got = t.get_tree(workdir, [*sorted(wanted), "outputs/train_state.json"], staging)
            _check_sizes(wanted, got.sizes)
            if not (staging / "outputs" / "train_state.json").is_file():
                raise _Gone("no train_state.json beside the checkpoint")
            os.replace(staging / "outputs" / "train_state.json", staging / "train_state.json")
            os.replace(staging / "outputs" / "checkpoints", staging / "checkpoints")
            shutil.rmtree(staging / "outputs")
            (staging / "checkpoints" / "checkpoint").write_text(
                f'model_checkpoint_path: "ckpt-{epoch}"\nall_model_checkpoint_paths: "ckpt-{epoch}"\n')
        else:
            rel = self.rel
            listing = list_files(t, workdir, [rel])
            fetch, reuse = [], []
            for name, size in listing.items():
                inside = name[len(rel) + 1:]
                have = self.kept / inside
                if size >= SMALL_BYTES and have.is_file() and have.stat().st_size == size:
                    reuse.append(inside)
                else:
                    fetch.append(name)
            got = t.get_tree(workdir, sorted(fetch), staging) if fetch else None
            _check_sizes({n: listing[n] for n in fetch if n in listing and not _is_small(listing[n])},
                         got.sizes if got else {})
            fetched = staging / rel
            if fetched.exists():
                for path in list(fetched.rglob("*")):
                    if path.is_file():
                        target = staging / path.relative_to(fetched)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(path, target)
                shutil.rmtree(staging / rel.split("/")[0])
            for inside in reuse:
                _link_or_copy(self.kept / inside, staging / inside)
        (staging / INFO).write_text(json.dumps({"epoch": epoch, "pulled_at": time.time()}))
        _replace_dir(staging, self.kept)


class _Gone(CloudtrainError):
    """The checkpoint asked for is not (or no longer) on the node."""


def _is_small(size: int) -> bool:
    return size < SMALL_BYTES


def _check_sizes(expected: dict[str, int], got: dict[str, int]) -> None:
    wrong = [name for name, size in expected.items() if got.get(name) != size]
    if wrong:
        raise _Gone(f"{wrong[0]} did not arrive whole")


def upload(nodes: Iterable[Any], kept: Path, trial: int, rel: str | None = None) -> None:
    """The carried checkpoint into the job's CLOUDTRAIN_CHECKPOINT_DIR (the trial's, or `rel`) on every node."""
    from cloudtrain.cluster.nodes import on_all

    def one(node: Any) -> None:
        target = f"{node.layout.workdir}/{rel or node_dir(trial)}"
        node.transport.run(["sh", "-c", 'rm -rf "$1" && mkdir -p "$1"', "sh", target], what="clearing the checkpoint dir")
        node.transport.put_tree(kept, target, ignore=lambda rel: rel == INFO)

    on_all(list(nodes), one, label=lambda n: f"node {n.rank}")


def epoch_done(event: dict[str, Any]) -> int | None:
    """The epoch a progress event reports done (its checkpoint is written), else None."""
    if event.get("type") != "epoch":
        return None
    epoch = event.get("epoch")
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
