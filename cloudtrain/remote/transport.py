"""The Transport contract (run a command, move trees) and its local implementation.

Remote commands are argv lists; a transport quotes them for its channel. Only the recipe's own
`setup` and `run` are shell, and they reach a node as a file, never spliced into a command line.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from cloudtrain.errors import RemoteCommandError, RemoteError


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SyncStats:
    files_total: int
    files_sent: int
    bytes_sent: int
    method: str


@runtime_checkable
class Transport(Protocol):
    """How lifecycle talks to one node. Implementations: LocalTransport, SSHTransport."""

    @property
    def label(self) -> str:
        """Human name of the node for messages, e.g. 'ubuntu@54.1.2.3'."""
        ...

    @property
    def home(self) -> str:
        """Absolute home directory on the node; cloudtrain keeps its files under it."""
        ...

    def run(
        self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None, check: bool = True
    ) -> CommandResult: ...

    def put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> None: ...

    def put_tree(self, local: Path, remote_dir: str, *, ignore: Callable[[str], bool] | None = None) -> SyncStats: ...

    def get_tree(self, remote_dir: str, paths: Sequence[str], local: Path) -> list[str]:
        """Copy `paths` (relative to remote_dir) into `local`, safely; return the names written."""
        ...

    def close(self) -> None: ...


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
        self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None, check: bool = True
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv), input=input, capture_output=True, timeout=timeout, cwd=self._home, check=False
            )
        except FileNotFoundError as exc:
            raise RemoteError(f"{self.label}: command not found: {argv[0]}") from exc
        except subprocess.TimeoutExpired as exc:
            raise RemoteError(f"{self.label}: {argv[0]} timed out after {timeout}s") from exc
        result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise RemoteCommandError(list(argv), proc.returncode, proc.stderr.decode(errors="replace"))
        return result

    def put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        target = Path(remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(target)

    def put_tree(self, local: Path, remote_dir: str, *, ignore: Callable[[str], bool] | None = None) -> SyncStats:
        from cloudtrain.remote.sync import local_mirror

        return local_mirror(local, Path(remote_dir), ignore=ignore)

    def get_tree(self, remote_dir: str, paths: Sequence[str], local: Path) -> list[str]:
        from cloudtrain.remote.archive import fetch_as_tar

        return fetch_as_tar(self, remote_dir, paths, local)

    def close(self) -> None:
        return None


def which(name: str) -> str | None:
    return shutil.which(name)
