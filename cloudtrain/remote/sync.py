"""Moving a local tree to a node."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from cloudtrain.remote.transport import SyncStats


def local_mirror(source: Path, target: Path, *, ignore: Callable[[str], bool] | None = None) -> SyncStats:
    """Copy source into target, sending only files whose size or mtime changed."""
    total = sent = sent_bytes = 0
    target.mkdir(parents=True, exist_ok=True)
    if source.is_file():
        pairs = [(source, target / source.name)]
    else:
        pairs = []
        for dirpath, dirnames, filenames in os.walk(source):
            rel_dir = os.path.relpath(dirpath, source)
            dirnames[:] = [d for d in dirnames if not (ignore and ignore(os.path.normpath(os.path.join(rel_dir, d)) + "/"))]
            for name in filenames:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if ignore and ignore(rel):
                    continue
                pairs.append((Path(dirpath) / name, target / rel))
    for src, dst in pairs:
        total += 1
        st = src.stat()
        try:
            dt = dst.stat()
            if dt.st_size == st.st_size and int(dt.st_mtime) == int(st.st_mtime):
                continue
        except FileNotFoundError:
            pass
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        sent += 1
        sent_bytes += st.st_size
    return SyncStats(files_total=total, files_sent=sent, bytes_sent=sent_bytes, method="local-copy")
