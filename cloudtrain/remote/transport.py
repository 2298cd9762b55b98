"""The Transport contract (run a command, move trees) and the records it returns.

Implementations: remote/local.py (a directory on this machine) and remote/ssh.py (paramiko).

Remote commands are argv lists; a transport quotes them for its channel. Only the recipe's own
`setup` and `run` are shell, and they reach a node as a file, never spliced into a command line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from cloudtrain.errors import RemoteError

if TYPE_CHECKING:
    from cloudtrain.remote.archive import Extracted

# The exit code of a request the node helper skipped: it was sent `only_if` earlier ones exited 0
# (remote/helper.py), and one did not. Nothing of it ran; the sender sends it again when ready.
SKIPPED = -1


class Skipped(RemoteError):
    """A request sent ahead of the checks it depended on was skipped by the node (nothing ran)."""


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
        self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None, check: bool = True,
        what: str | None = None,
    ) -> CommandResult:
        """Run argv on the node. `what` names the operation in errors (default: argv[0])."""
        ...

    def stream(self, argv: Sequence[str], *, what: str | None = None) -> Iterator[bytes]:
        """Run argv and yield its stdout as it comes. A dropped link raises ConnectionLostError;
        a non-zero exit, RemoteCommandError. Closing the iterator early ends the command."""
        ...

    def put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> None: ...

    def put_tree(self, local: Path, remote_dir: str, *, ignore: Callable[[str], bool] | None = None,
                 new_dir: bool = False) -> SyncStats:
        """Make remote_dir hold local's files. `new_dir`: the caller saw remote_dir created empty
        in this command, so everything is sent without asking the node what it has (a round trip)."""
        ...

    def get_tree(self, remote_dir: str, paths: Sequence[str], local: Path,
                 newer_than: str | None = None) -> Extracted:
        """Copy `paths` (relative to remote_dir) into `local`, safely; say what came and what was
        refused. `newer_than` (a file on the node): only files modified after it."""
        ...

    def close(self) -> None: ...
