"""LocalTransport: the Transport contract for a node that is a directory on this machine (`local`)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.errors import RemoteCommandError, RemoteError
from cloudtrain.remote.transport import CommandResult, SyncStats

if TYPE_CHECKING:
    from cloudtrain.remote.archive import Extracted


class LocalTransport:
    """A node that is a directory on this machine (the `local` provider)."""

    def __init__(self, home: str | Path) -> None:
        self._home = str(Path(home).resolve())
        Path(self._home).mkdir(parents=True, exist_ok=True)

    @property
    def label(self) -> str:
        return f"local:{self._home}"

    @property
    def home(self) -> str:
        return self._home

    def run(
        self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None, check: bool = True,
        what: str | None = None,
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv), input=input, capture_output=True, timeout=timeout, cwd=self._home, check=False
            )
        except FileNotFoundError as exc:
            raise self._not_found(argv[0]) from exc
        except subprocess.TimeoutExpired as exc:
            raise RemoteError(f"{self.label}: {what or argv[0]} timed out after {timeout}s") from exc
        result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise RemoteCommandError(list(argv), proc.returncode, proc.stderr.decode(errors="replace"))
        return result

    def _not_found(self, command: str) -> RemoteError:
        # Commands run in the node's directory: Python says "no such file" for a missing cwd too.
        if not Path(self._home).is_dir():
            return RemoteError(f"{self.label}: the node's directory is gone",
                               hint="the cluster was taken down (`cloudtrain status` shows what is left)")
        return RemoteError(f"{self.label}: command not found: {command}")

    def stream(self, argv: Sequence[str], *, what: str | None = None) -> Iterator[bytes]:
        try:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self._home)
        except FileNotFoundError as exc:
            raise self._not_found(argv[0]) from exc
        assert proc.stdout is not None and proc.stderr is not None
        try:
            while chunk := proc.stdout.read1(1 << 16):
                yield chunk
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            proc.stdout.close()
            stderr = proc.stderr.read()
            proc.stderr.close()
        if code != 0:
            raise RemoteCommandError(list(argv), code, stderr.decode(errors="replace"))

    def put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        # A new file under a fresh name (never a leftover that someone may hold open), with its
        # final mode from the first instant, renamed over the target: a secret is never readable
        # by others, not even briefly, and readers see the old content or the new one, whole.
        target = Path(remote_path)
        tmp: Path | None = None
        published = False
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp, fd = _create_exclusive(target.parent, mode)
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)  # exactly `mode`: the umask may have narrowed it
                handle.write(data)
            os.replace(tmp, target)
            published = True
        except OSError as exc:
            raise RemoteError(f"{self.label}: cannot write {target}: {exc.strerror or exc}") from None
        finally:
            if tmp is not None and not published:
                tmp.unlink(missing_ok=True)

    def put_tree(self, local: Path, remote_dir: str, *, ignore: Callable[[str], bool] | None = None,
                 new_dir: bool = False) -> SyncStats:
        from cloudtrain.remote.sync import local_mirror  # compares local stats: nothing to skip with new_dir

        return local_mirror(local, Path(remote_dir), ignore=ignore)

    def get_tree(self, remote_dir: str, paths: Sequence[str], local: Path,
                 newer_than: str | None = None) -> Extracted:
        from cloudtrain.remote.archive import fetch_as_tar

        return fetch_as_tar(self, remote_dir, paths, local, newer_than)

    def close(self) -> None:
        return None


def _create_exclusive(directory: Path, mode: int) -> tuple[Path, int]:
    """Create a new file with a random name in `directory`, opened for writing; (path, fd).

    O_EXCL fails on anything already there, a planted symlink included; `mode` applies at creation.
    """
    for _ in range(100):
        path = directory / f".ct-put.{secrets.token_hex(8)}"
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o777)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory} after 100 tries")


