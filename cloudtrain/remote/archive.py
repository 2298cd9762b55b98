"""Fetching trees from a node as a tar stream and extracting them without trusting the node.

A compromised or buggy VM must not be able to write outside the run directory: absolute paths,
`..`, links that point outside, hard links to outside files and device/fifo members are refused.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from cloudtrain.errors import UnsafeArchiveError


def fetch_as_tar(transport, remote_dir: str, paths: Sequence[str], local: Path) -> list[str]:  # noqa: ANN001
    """Tar the existing `paths` under remote_dir on the node and extract them safely into local."""
    # Missing result paths are normal (a job that failed early); ask the node which exist first.
    script = 'cd "$1" || exit 3; shift; for p in "$@"; do [ -e "$p" ] && printf "%s\\0" "$p"; done; exit 0'
    listing = transport.run(["sh", "-c", script, "sh", remote_dir, *paths])
    present = [p for p in listing.stdout.decode().split("\0") if p]
    if not present:
        return []
    result = transport.run(["tar", "-C", remote_dir, "-cf", "-", "--", *present])
    return safe_extract(io.BytesIO(result.stdout), local)


def safe_extract(fileobj: IO[bytes], dest: Path) -> list[str]:
    """Extract a tar stream into dest after checking every member; nothing is written if one is bad."""
    dest = dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=fileobj, mode="r:*") as archive:
        members = archive.getmembers()
        for member in members:
            _check_member(member, dest)
        # The 'data' filter re-checks the same rules inside tarfile (defence in depth) and drops
        # setuid bits and ownership from the node.
        archive.extractall(dest, members=members, filter="data")
    return [m.name for m in members]


def _check_member(member: tarfile.TarInfo, dest: Path) -> None:
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"refused archive member {name!r}: absolute path")
    if ".." in Path(name).parts:
        raise UnsafeArchiveError(f"refused archive member {name!r}: '..' in path")
    target = (dest / name).resolve()
    if target != dest and dest not in target.parents:
        raise UnsafeArchiveError(f"refused archive member {name!r}: resolves outside {dest}")
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        raise UnsafeArchiveError(f"refused archive member {name!r}: device or fifo")
    if member.issym():
        link = member.linkname
        resolved = (dest / posixpath.dirname(name) / link) if not link.startswith("/") else Path(link)
        if link.startswith("/") or not _inside(Path(os.path.normpath(resolved)), dest):
            raise UnsafeArchiveError(f"refused archive member {name!r}: symlink to {link!r} points outside")
    if member.islnk():
        link = member.linkname
        if link.startswith("/") or ".." in Path(link).parts or not _inside((dest / link).resolve(), dest):
            raise UnsafeArchiveError(f"refused archive member {name!r}: hard link to {link!r} points outside")


def _inside(path: Path, dest: Path) -> bool:
    return path == dest or dest in path.parents
