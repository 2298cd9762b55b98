"""Fetching trees from a node as a tar stream and extracting them without trusting the node.

A compromised or buggy VM must not be able to write outside the run directory: absolute paths,
`..`, links that point outside, hard links to outside files and device/fifo members are refused.
A refused member is skipped and reported with its reason; every other member still lands (one
stray symlink must not cost the user the results of a training run).

Extraction streams (the archive is never held in memory or seeked) into a staging directory
inside the destination; only when the whole stream was read are the staged files moved into
place, so a transfer cut short leaves the destination exactly as it was.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cloudtrain.errors import RemoteError, UnsafeArchiveError

_STAGING_PREFIX = ".cloudtrain-extract-"


@dataclass(frozen=True)
class Refused:
    member: str
    reason: str


@dataclass(frozen=True)
class Extracted:
    """What an archive brought: member names in archive order, regular-file sizes, refusals."""

    names: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)
    refused: tuple[Refused, ...] = ()


def fetch_as_tar(transport, remote_dir: str, paths: Sequence[str], local: Path) -> Extracted:  # noqa: ANN001
    """Tar the existing `paths` under remote_dir on the node and extract them safely into local."""
    present = list_present(transport, remote_dir, paths)
    if not present:
        return Extracted()
    result = transport.run(["tar", "-C", remote_dir, "-cf", "-", "--", *present], what="tar of the results")
    return safe_extract(io.BytesIO(result.stdout), local)


def list_present(transport, remote_dir: str, paths: Sequence[str]) -> list[str]:  # noqa: ANN001
    """Which of `paths` exist under remote_dir on the node (missing results are normal)."""
    script = 'cd "$1" || exit 3; shift; for p in "$@"; do [ -e "$p" ] && printf "%s\\0" "$p"; done; exit 0'
    listing = transport.run(["sh", "-c", script, "sh", remote_dir, *paths], what="listing the results")
    return [p for p in listing.stdout.decode(errors="surrogateescape").split("\0") if p]


def list_files(transport, remote_dir: str, paths: Sequence[str]) -> dict[str, int]:  # noqa: ANN001
    """Regular files under `paths` on the node with their sizes: what a complete copy must hold."""
    script = (
        'cd "$1" || exit 3; shift; for p in "$@"; do [ -e "$p" ] || continue; '
        'find "$p" -type f -exec ls -lnd -- {} +; done; exit 0'
    )
    listing = transport.run(["env", "LC_ALL=C", "sh", "-c", script, "sh", remote_dir, *paths],
                            what="listing the results")
    files: dict[str, int] = {}
    for line in listing.stdout.decode(errors="surrogateescape").splitlines():
        # mode links uid gid size month day time-or-year name (the name may hold spaces)
        parts = line.split(None, 8)
        if len(parts) == 9 and parts[4].isdigit():
            files[parts[8]] = int(parts[4])
    return files


def safe_extract(fileobj: IO[bytes], dest: Path) -> Extracted:
    """Extract a tar stream into dest, member by member, skipping (and reporting) unsafe ones.

    `fileobj` is read sequentially once, so a network stream works without buffering it whole.
    A stream that cannot be read to its end raises RemoteError and leaves dest untouched.
    """
    dest = dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=dest))
    names: list[str] = []
    sizes: dict[str, int] = {}
    refused: list[Refused] = []
    try:
        try:
            with tarfile.open(fileobj=fileobj, mode="r|*") as archive:
                for member in archive:
                    try:
                        # Checked against the staging root right before extraction, so a link that an
                        # earlier member created on disk is resolved too (symlink-then-write-through).
                        _check_member(member, staging)
                        # The 'data' filter re-checks the same rules inside tarfile (defence in
                        # depth) and drops setuid bits and ownership from the node.
                        archive.extract(member, staging, filter="data")
                    except UnsafeArchiveError as exc:
                        refused.append(Refused(member.name, exc.message))
                        continue
                    except tarfile.FilterError as exc:
                        refused.append(Refused(member.name, str(exc)))
                        continue
                    names.append(member.name)
                    if member.isfile():
                        sizes[member.name] = member.size
        except (tarfile.TarError, KeyError, EOFError) as exc:
            raise RemoteError(f"unreadable archive from the node: {exc or type(exc).__name__}") from None
        _merge_into(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Extracted(tuple(names), sizes, tuple(refused))


def _check_member(member: tarfile.TarInfo, root: Path) -> None:
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError("absolute path")
    if ".." in Path(name).parts:
        raise UnsafeArchiveError("'..' in path")
    target = (root / name).resolve()
    if not _inside(target, root):
        raise UnsafeArchiveError("resolves outside the destination")
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        raise UnsafeArchiveError("device or fifo")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"unsupported type {member.type!r}")
    if member.issym():
        link = member.linkname
        resolved = (root / posixpath.dirname(name) / link).resolve()
        if link.startswith("/") or not _inside(resolved, root):
            raise UnsafeArchiveError(f"symlink to {link!r} points outside")
    if member.islnk():
        link = member.linkname
        if link.startswith("/") or ".." in Path(link).parts or not _inside((root / link).resolve(), root):
            raise UnsafeArchiveError(f"hard link to {link!r} points outside")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _merge_into(staging: Path, dest: Path) -> None:
    """Move everything staged into dest, replacing what is there (a fresh fetch wins)."""
    for dirpath, dirnames, filenames in os.walk(staging):
        rel = os.path.relpath(dirpath, staging)
        target_dir = dest if rel == "." else dest / rel
        # os.walk lists symlinks to directories among dirnames without descending: move them as files.
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in dirnames:
            target = target_dir / name
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
        for name in [*filenames, *links]:
            target = target_dir / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(os.path.join(dirpath, name), target)
