"""Fetching trees from a node as a tar stream and extracting them without trusting the node.

A compromised or buggy VM must not be able to write outside the run directory: absolute paths,
`..`, links that point outside, hard links to outside files and device/fifo members are refused.
A refused member is skipped and reported with its reason; every other member still lands (one
stray symlink must not cost the user the results of a training run).

Extraction streams (the archive is never held in memory or seeked) into a staging directory
inside the destination; only when the whole stream was read are the staged files moved into
place, so a transfer cut short leaves the destination exactly as it was.

Bounds (issue 29; docs/security.md): the stream must be a plain tar (we ask the node for `tar -cf -`;
a compressed stream, which could unpack to anything, is unreadable), at most MAX_MEMBERS members,
and its files may not take the destination's disk past its last DISK_RESERVE_BYTES. Past a bound the
whole archive is refused (RemoteError, nothing written): the results stay on the node, which
`collect` then keeps, and the user decides.
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
MAX_MEMBERS = 1_000_000
DISK_RESERVE_BYTES = 1 << 30


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


def fetch_as_tar(transport, remote_dir: str, paths: Sequence[str], local: Path,  # noqa: ANN001
                 newer_than: str | None = None) -> Extracted:
    """Tar the existing `paths` under remote_dir on the node and extract them safely into local
    (with `newer_than`: only the files modified after that file, see list_files)."""
    if newer_than is not None:
        result = transport.run(tar_newer_argv(remote_dir, paths, newer_than), what="tar of the results")
        return safe_extract(io.BytesIO(result.stdout), local)
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


# Every regular file under the paths, as "SIZE NAME\0": a name may hold any byte but NUL (a newline
# too), so records are NUL-terminated and the size comes first. GNU find prints both itself; any other
# find gets the size from `ls -lnd` (its fifth field, whatever the name holds) and the name from printf.
# `$2` (when not empty) keeps only files modified after that marker file: what this run's job
# wrote, not an earlier run's leftovers in the shared workdir (a missing marker: nothing).
_LIST_FILES = r"""
cd "$1" || exit 3; marker=$2; shift 2
if [ -n "$marker" ] && [ ! -e "$marker" ]; then exit 0; fi
if find . -maxdepth 0 -printf "" >/dev/null 2>&1; then
  for p in "$@"; do
    [ -e "$p" ] || continue
    if [ -n "$marker" ]; then find "$p" -type f -newer "$marker" -printf "%s %p\0"
    else find "$p" -type f -printf "%s %p\0"; fi
  done
else
  for p in "$@"; do
    [ -e "$p" ] || continue
    if [ -n "$marker" ]; then set -- -newer "$marker"; else set --; fi
    find "$p" -type f "$@" -exec sh -c 'set -f; for f do set -- $(ls -lnd -- "$f"); printf "%s %s\0" "$5" "$f"; done' sh {} +
  done
fi
exit 0
"""

# The same files, and the symbolic links the job made there (each judged on extraction, as any
# member: one pointing out of the results is refused and reported), as a tar stream (GNU and BSD
# tar both read a NUL-separated list with --null -T -).
_TAR_NEWER = r"""
cd "$1" || exit 3; marker=$2; shift 2
[ -e "$marker" ] || marker=
for p in "$@"; do
  [ -e "$p" ] || [ -L "$p" ] || continue
  [ -n "$marker" ] && find "$p" \( -type f -o -type l \) -newer "$marker" -print0
done | tar --null --no-recursion -T - -cf -
"""


def list_files(transport, remote_dir: str, paths: Sequence[str],  # noqa: ANN001
               newer_than: str | None = None) -> dict[str, int]:
    """Regular files under `paths` on the node with their sizes: what a complete copy must hold.
    `newer_than`: a file on the node; only files modified after it count (this run's results)."""
    listing = transport.run(list_files_argv(remote_dir, paths, newer_than), what="listing the results")
    return parse_file_listing(listing.stdout)


def list_files_argv(remote_dir: str, paths: Sequence[str], newer_than: str | None = None) -> list[str]:
    """argv of the listing list_files makes ("SIZE NAME\0" records)."""
    return ["env", "LC_ALL=C", "sh", "-c", _LIST_FILES, "sh", remote_dir, newer_than or "", *paths]


def tar_newer_argv(remote_dir: str, paths: Sequence[str], newer_than: str) -> list[str]:
    """argv of a tar stream of the files under `paths` modified after `newer_than` (see list_files)."""
    return ["env", "LC_ALL=C", "sh", "-c", _TAR_NEWER, "sh", remote_dir, newer_than, *paths]


def parse_file_listing(data: bytes) -> dict[str, int]:
    """"SIZE NAME\0" records -> {name: size}; names decoded as tar member names are (surrogateescape).

    A record without its NUL, or not SIZE NAME, is left out (a cut stream): only whole records count.
    """
    files: dict[str, int] = {}
    for record in data.split(b"\0")[:-1]:  # the last piece has no NUL after it: empty, or cut short
        size, sep, name = record.partition(b" ")
        if sep and name and size.isdigit():
            files[name.decode(errors="surrogateescape")] = int(size)
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
    room = shutil.disk_usage(dest).free - DISK_RESERVE_BYTES
    members = total = 0
    try:
        try:
            with tarfile.open(fileobj=fileobj, mode="r|") as archive:
                for member in archive:
                    members += 1
                    total += member.size if member.isfile() else 0
                    _within_bounds(members, total, room)
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


def _within_bounds(members: int, total: int, room: int) -> None:
    if members > MAX_MEMBERS:
        raise RemoteError(f"the node's archive has more than {MAX_MEMBERS:,} members; nothing was extracted",
                          hint="the results are still on the node")
    if total > room:
        raise RemoteError(
            f"the results need more than the free disk space here (keeping {DISK_RESERVE_BYTES >> 30} GiB free);"
            " nothing was extracted", hint="free some space, then `cloudtrain collect`; the results are still on the node")


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
    if member.issparse():
        raise UnsafeArchiveError("sparse member (we never ask for one)")
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
