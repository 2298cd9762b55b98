"""LocalTransport.put_file: a secret file is never, not even for an instant, more open than asked."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.remote.local import LocalTransport

pytestmark = pytest.mark.quick


@contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@contextmanager
def watch_modes(directory: Path) -> Iterator[list[tuple[str, str, int]]]:
    """Record the mode of every file in `directory` at each chmod/rename/open the process makes.

    Audit hooks run just before the operation, in the calling thread: a file that is ever
    visible with a wider mode is seen at the next such step (the chmod that would narrow it, or
    the rename that publishes it). Hooks cannot be removed, so this one goes quiet on exit.
    """
    seen: list[tuple[str, str, int]] = []
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if not active[0] or event not in ("open", "os.chmod", "os.rename"):
            return
        active[0] = False  # our own listdir/stat below must not re-enter
        try:
            for entry in os.scandir(directory):
                seen.append((event, entry.name, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)))
        except FileNotFoundError:
            pass  # the directory is not created yet: nothing in it to see
        finally:
            active[0] = True

    sys.addaudithook(hook)
    try:
        yield seen
    finally:
        active[0] = False


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
@pytest.mark.parametrize("mode", [0o600, 0o644, 0o755, 0o400])
def test_file_gets_exactly_the_requested_mode_and_never_a_wider_one(tmp_path: Path, mask: int, mode: int) -> None:
    node = LocalTransport(tmp_path / "node")
    target = tmp_path / "node" / "jobs" / "env.sh"
    (tmp_path / "node" / "jobs").mkdir()
    with umask(mask), watch_modes(target.parent) as seen:
        node.put_file(b"export TOKEN=secret\n", str(target), mode=mode)
    assert target.read_bytes() == b"export TOKEN=secret\n"
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert seen, "the audit hook saw nothing: the check below would prove nothing"
    wider = [(event, name, oct(m)) for event, name, m in seen if m & ~mode]
    assert wider == []
    assert [p.name for p in target.parent.iterdir()] == ["env.sh"]


def test_replacing_a_readable_file_makes_a_new_private_one(tmp_path: Path) -> None:
    node = LocalTransport(tmp_path / "node")
    target = tmp_path / "node" / "env.sh"
    target.write_bytes(b"old\n")
    target.chmod(0o644)
    reader = target.open("rb")  # someone who could read the old file keeps it open
    with umask(0):
        node.put_file(b"export TOKEN=secret\n", str(target), mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_bytes() == b"export TOKEN=secret\n"
    assert reader.read() == b"old\n"  # a new inode: the open handle never sees the secret
    reader.close()


def test_a_stale_temp_file_someone_holds_open_never_receives_the_secret(tmp_path: Path) -> None:
    """A leftover (or planted) temp file next to the target is not reused."""
    node = LocalTransport(tmp_path / "node")
    target = tmp_path / "node" / "env.sh"
    planted = [target.with_name(".env.sh.tmp"), target.with_name(".ct-put.tmp")]
    handles = []
    for path in planted:
        path.write_bytes(b"")
        path.chmod(0o666)
        handles.append(path.open("rb"))
    node.put_file(b"export TOKEN=secret\n", str(target), mode=0o600)
    assert all(h.read() == b"" for h in handles)
    for handle in handles:
        handle.close()
    assert target.read_bytes() == b"export TOKEN=secret\n"


def test_relative_path_and_new_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    node = LocalTransport(tmp_path / "node")
    node.put_file(b"x", "node/a/b/c.txt", mode=0o640)
    assert (tmp_path / "node" / "a" / "b" / "c.txt").read_bytes() == b"x"
    assert stat.S_IMODE((tmp_path / "node" / "a" / "b" / "c.txt").stat().st_mode) == 0o640


def test_a_failed_write_is_one_clear_error_and_leaves_nothing_behind(tmp_path: Path) -> None:
    node = LocalTransport(tmp_path / "node")
    target = tmp_path / "node" / "sub" / "env.sh"
    target.mkdir(parents=True)  # a directory where the file should go: the final rename fails
    with pytest.raises(RemoteError) as caught:
        node.put_file(b"data", str(target), mode=0o600)
    assert str(target) in caught.value.message
    assert [p.name for p in target.parent.iterdir()] == ["env.sh"]
    assert target.is_dir() and not any(target.iterdir())
