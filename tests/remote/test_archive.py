"""safe_extract refuses hostile tarballs and writes nothing anywhere when it does."""

from __future__ import annotations

import io
import os
import tarfile
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.remote.archive import safe_extract

pytestmark = pytest.mark.quick


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


# issue 29: bounds on what a node's archive may make us write (docs/security.md)
def _gzipped(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def _sparse_member() -> bytes:
    info = tarfile.TarInfo("holes.bin")
    info.type = tarfile.GNUTYPE_SPARSE
    return _tar(_file("ok.txt"), (info, None))


BOUNDS = [
    # (id, archive, settings to lower, the one line it gets)
    ("compressed stream", lambda: _gzipped(_tar(_file("ok.txt"))), {}, "unreadable archive from the node"),
    ("too many members", lambda: _tar(*(_file(f"f{i}") for i in range(4))), {"MAX_MEMBERS": 3},
     "more than 3 members; nothing was extracted"),
    ("past the free disk", lambda: _tar(_file("big.bin", b"x" * 5000)), {"room": 4000},
     "the results need more than the free disk space here"),
]


@pytest.mark.parametrize(("make", "settings", "words"), [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_archive_past_a_bound_is_refused_whole(make: Callable[[], bytes], settings: dict[str, int], words: str,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.remote import archive

    for name, value in settings.items():
        if name == "room":
            free = archive.shutil.disk_usage(tmp_path).free
            monkeypatch.setattr(archive, "DISK_RESERVE_BYTES", free - value)
        else:
            monkeypatch.setattr(archive, name, value)
    dest = tmp_path / "run"
    dest.mkdir()
    (dest / "earlier.txt").write_text("kept")
    with pytest.raises(RemoteError) as info:
        safe_extract(_OneWay(make()), dest)
    assert words in info.value.one_line() and "\n" not in info.value.one_line()
    assert sorted(p.name for p in dest.iterdir()) == ["earlier.txt"]  # nothing written, nothing lost


def test_sparse_member_is_refused_and_the_rest_lands(tmp_path: Path) -> None:
    got = safe_extract(_OneWay(_sparse_member()), tmp_path)
    assert got.names == ("ok.txt",) and [r.member for r in got.refused] == ["holes.bin"]


# (listing bytes, what it says) - names are bytes: any but NUL, a newline included (issue 29, case 3)
LISTINGS = [
    (b"", {}),
    (b"12 out/a.txt\0", {"out/a.txt": 12}),
    (b"3 out/a\nb\0" + b"0 out/with space\0", {"out/a\nb": 3, "out/with space": 0}),
    (b"7 out/\xff\0", {"out/\udcff": 7}),  # not UTF-8: decoded as tar decodes member names
    (b"5 out/whole\0" + b"9 out/cut", {"out/whole": 5}),  # a record without its NUL is not trusted
    (b"x out/bad\0 \0", {}),
]


@pytest.mark.parametrize(("data", "expected"), LISTINGS, ids=range(len(LISTINGS)))
def test_parse_file_listing(data: bytes, expected: dict[str, int]) -> None:
    from cloudtrain.remote.archive import parse_file_listing

    assert parse_file_listing(data) == expected


@pytest.mark.parametrize("gnu_find", [True, False], ids=["gnu-find", "other-find"])
def test_listing_and_tar_agree_on_a_name_with_a_newline(gnu_find: bool, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A job that writes out/a\nb once made every collect report "did not arrive whole".
    from cloudtrain.remote.archive import list_files
    from cloudtrain.remote.local import LocalTransport

    if not gnu_find:  # a find without -printf (busybox, BSD): the portable branch
        fake = tmp_path / "bin"
        fake.mkdir()
        real = subprocess.run(["sh", "-c", "command -v find"], capture_output=True, text=True, check=True).stdout.strip()
        (fake / "find").write_text(f'#!/bin/sh\nfor a do [ "$a" = -printf ] && exit 1; done\nexec {real} "$@"\n')
        (fake / "find").chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    node = LocalTransport(tmp_path / "node")
    out = tmp_path / "node" / "work" / "out"
    out.mkdir(parents=True)
    names = {"a\nb": b"12345", "with space": b"", "\\back": b"x", "tab\there": b"yy", "-dash": b"zzz"}
    for name, data in names.items():
        (out / name).write_bytes(data)
    listed = list_files(node, str(tmp_path / "node" / "work"), ["out", "missing"])
    assert listed == {f"out/{name}": len(data) for name, data in names.items()}
    got = node.get_tree(str(tmp_path / "node" / "work"), ["out"], tmp_path / "run")
    assert {n: s for n, s in got.sizes.items()} == listed
