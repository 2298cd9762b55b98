"""The one checkpoint carry (issue 36.1): before a job that resumes after its machine was lost,
the checkpoint kept on the laptop goes into the job's CLOUDTRAIN_CHECKPOINT_DIR on every node.

A recovering run's next attempt (run/recover.py `Recovery`) and a sweep trial's retry on a new VM
(run/controller.py `Trial`) both call it from their policy's `before_job`, which the pipeline calls
just before the job: the controller's step, never the reporter's. The copy itself is
run/checkpoints.py `upload`; what it kept and from which attempt is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import CloudtrainError
from cloudtrain.run import checkpoints


def onto(nodes: Sequence[Any], kept: Path, rel: str, warn: Callable[[str], None]) -> int | None:
    """Put the checkpoint kept in `kept` into `rel` (relative to the workdir) on every node, which
    clears what was there. Returns its epoch, or None when there was none to carry or it could not
    be put there: the job then starts over, which is said (`warn`), never fatal."""
    epoch = checkpoints.kept_epoch(kept)
    if epoch is None or not nodes:
        return None
    try:
        checkpoints.upload(nodes, kept, 0, rel=rel)
    except CloudtrainError as exc:
        warn(f"could not upload the checkpoint of epoch {epoch}; the job starts over: {exc.one_line()}")
        return None
    return epoch
