"""The error hierarchy. Library code raises these; only the CLI turns them into exit codes.

Each error renders as one line: where it happened, what was expected, and (when we can) a hint.
"""

from __future__ import annotations

from dataclasses import dataclass


class CloudtrainError(Exception):
    """Root of every error cloudtrain raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(CloudtrainError):
    """Bad input from the user: recipe, flags, config. Exit code 2 like Click's own usage errors."""

    exit_code = 2


class RecipeError(UsageError):
    """A recipe that cannot be loaded or does not validate."""


class ConfigError(UsageError):
    """A config file that cannot be loaded or does not validate."""


class NotAvailableError(UsageError):
    """A valid recipe asks for something this build cannot do yet (never silently ignored)."""


class ClusterNotFoundError(UsageError):
    """The named cluster is not in state."""


class Declined(CloudtrainError):
    """The user answered no when asked to approve spending (nothing was created)."""


class CredentialsError(CloudtrainError):
    """A cloud's credentials are missing or rejected."""

    exit_code = 2


class ProviderError(CloudtrainError):
    """A provider call failed (API error, capacity, quota)."""


class CapacityError(ProviderError):
    """No capacity (or quota) where the provider looked.

    `scope` says how far the refusal reaches, so lifecycle knows which placements to skip:
    "zone" (try the next zone), "region" (quota: skip the region's other zones), "cloud"
    (a cloud-wide quota such as GCP's GPUS_ALL_REGIONS: skip the cloud).
    """

    def __init__(self, message: str, *, hint: str | None = None, scope: str = "zone") -> None:
        super().__init__(message, hint=hint)
        self.scope = scope


@dataclass(frozen=True)
class LostLaunch:
    """Where a lost launch was, for the run's record of its attempts (its state row is gone)."""

    cloud: str
    region: str | None
    zone: str | None
    instance_type: str | None
    spot: bool
    hourly_price: float
    incarnation: str | None  # its billing intervals stay in the ledger under this uid


class LaunchLostError(ProviderError):
    """The cloud ended a machine of a launch before it was up (a spot machine reclaimed while it
    started, a pending instance the cloud terminated): a loss, not a bad request. Lifecycle has
    already cleaned up what the launch made; a recovering run (run/recover.py) relaunches elsewhere."""

    phase_note = "the machine was lost while it started"

    def __init__(self, message: str, lost: LostLaunch, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.lost = lost


class RemoteError(CloudtrainError):
    """A command or transfer on a node failed."""


class RemoteCommandError(RemoteError):
    """A remote command exited non-zero when success was required."""

    def __init__(self, argv: list[str], exit_code: int, stderr: str) -> None:
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no stderr"
        super().__init__(f"command {argv[0]!r} failed with exit code {exit_code}: {tail}")
        self.argv = argv
        self.returncode = exit_code
        self.stderr = stderr


class BootstrapError(RemoteError):
    """A node could not be made ready (templates/bootstrap.sh failed). The message ends with the
    failing step's last lines; `log` is the node's whole bootstrap log, for the run directory."""

    def __init__(self, message: str, *, hint: str | None = None, log: str = "") -> None:
        super().__init__(message, hint=hint)
        self.log = log


class UnsafeArchiveError(RemoteError):
    """An archive from a node tried to write outside its destination."""


class JobFailedError(CloudtrainError):
    """The user's job (or setup) exited non-zero."""

    def __init__(self, message: str, job_exit_code: int, cancelled: bool = False) -> None:
        super().__init__(message)
        self.job_exit_code = job_exit_code
        self.cancelled = cancelled  # ended by `cloudtrain cancel` (runner.sh kill), not by itself


class Interrupted(CloudtrainError):
    """The user pressed Ctrl-C or the process got SIGTERM; cleanup has run."""

    exit_code = 130


class ClusterBusyError(UsageError):
    """Another live run is using the cluster; nothing of it was touched."""
