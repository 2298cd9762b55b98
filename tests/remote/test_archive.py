"""safe_extract refuses hostile tarballs and writes nothing anywhere when it does."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.remote.archive import safe_extract


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


class _OneWay(io.RawIOBase):
    """A non-seekable stream, like an SSH channel."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        chunk = self._inner.read(min(len(buffer), 1000))
        buffer[: len(chunk)] = chunk
        return len(chunk)


# Every case starts with a harmless file, so "nothing written" also covers members before the bad one.
HOSTILE: dict[str, Callable[[], bytes]] = {
    "dotdot traversal": lambda: _tar(_file("ok.txt"), _file("../evil.txt")),
    "nested traversal": lambda: _tar(_file("ok.txt"), _file("a/../../evil.txt")),
    "absolute path": lambda: _tar(_file("ok.txt"), _file("/tmp/cloudtrain-evil.txt")),
    "symlink escape relative": lambda: _tar(_file("ok.txt"), _special("link", tarfile.SYMTYPE, "../../outside")),
    "symlink escape absolute": lambda: _tar(_file("ok.txt"), _special("link", tarfile.SYMTYPE, "/etc")),
    "symlink then write through": lambda: _tar(
        _file("ok.txt"), _special("up", tarfile.SYMTYPE, ".."), _file("up/evil.txt")
    ),
    "hard link to absolute": lambda: _tar(_file("ok.txt"), _special("hl", tarfile.LNKTYPE, "/etc/passwd")),
    "hard link out": lambda: _tar(_file("ok.txt"), _special("hl", tarfile.LNKTYPE, "../outside.txt")),
    "character device": lambda: _tar(_file("ok.txt"), _special("null", tarfile.CHRTYPE)),
    "block device": lambda: _tar(_file("ok.txt"), _special("sda", tarfile.BLKTYPE)),
    "fifo": lambda: _tar(_file("ok.txt"), _special("pipe", tarfile.FIFOTYPE)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_member_is_refused_and_the_rest_lands(case: str, tmp_path: Path) -> None:
    """One unsafe member is skipped and reported; it must not cost the harmless ones (issue 8.4)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    dest = tmp_path / "run" / "results"
    dest.mkdir(parents=True)
    (dest / "existing.txt").write_text("kept")

    got = safe_extract(_OneWay(HOSTILE[case]()), dest)

    assert got.refused, "the hostile member must be reported"
    assert all(r.reason for r in got.refused)
    assert "ok.txt" in got.names and (dest / "ok.txt").read_text() == "x"
    assert outside.read_text() == "precious"
    assert (dest / "existing.txt").read_text() == "kept"
    assert not Path("/tmp/cloudtrain-evil.txt").exists()
    assert not (tmp_path / "run" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    for path in dest.rglob("*"):
        # Nothing that landed points or leads outside the destination, and nothing is a device.
        assert path.resolve().is_relative_to(dest.resolve()) or not path.is_symlink(), path
        assert path.is_symlink() or path.is_file() or path.is_dir(), path
    assert not [p for p in dest.iterdir() if p.name.startswith(".cloudtrain-extract-")]


def test_truncated_stream_raises_and_leaves_nothing(tmp_path: Path) -> None:
    """A transfer cut short is an error (never a silent partial result) and writes nothing."""
    data = _tar(_file("outputs/a.bin", os.urandom(50_000)), _file("outputs/b.bin", os.urandom(50_000)))
    dest = tmp_path / "results"
    with pytest.raises(RemoteError):
        safe_extract(_OneWay(data[: len(data) // 3]), dest)
    assert list(dest.iterdir()) == []


def test_good_archive_streams_and_replaces_older_results(tmp_path: Path) -> None:
    dest = tmp_path / "results"
    (dest / "outputs").mkdir(parents=True)
    (dest / "outputs" / "metrics.json").write_text("old")
    (dest / "outputs" / "untouched.txt").write_text("stays")
    data = _tar(
        _special("outputs", tarfile.DIRTYPE),
        _file("outputs/metrics.json", b"new"),
        _file("outputs/model/weights.bin", os.urandom(100_000)),
        _special("outputs/latest", tarfile.SYMTYPE, "model/weights.bin"),
        _special("outputs/copy.bin", tarfile.LNKTYPE, "outputs/model/weights.bin"),
    )

    got = safe_extract(_OneWay(data), dest)
    names = got.names

    assert not got.refused
    assert names[0] == "outputs" and "outputs/latest" in names
    assert (dest / "outputs" / "metrics.json").read_text() == "new"
    assert (dest / "outputs" / "untouched.txt").read_text() == "stays"
    assert (dest / "outputs" / "latest").is_symlink()
    assert (dest / "outputs" / "latest").read_bytes() == (dest / "outputs" / "model" / "weights.bin").read_bytes()
    assert (dest / "outputs" / "copy.bin").read_bytes() == (dest / "outputs" / "model" / "weights.bin").read_bytes()
    assert not [p for p in dest.iterdir() if p.name.startswith(".cloudtrain-extract-")]


def test_setuid_bits_and_foreign_owners_are_dropped(tmp_path: Path) -> None:
    info, data = _file("tool", b"#!/bin/sh\n")
    info.mode = 0o4755
    info.uid, info.gid = 4242, 4242
    safe_extract(io.BytesIO(_tar((info, data))), tmp_path)
    st = (tmp_path / "tool").stat()
    assert not st.st_mode & 0o4000
    assert st.st_uid == os.getuid()
