"""The core of `cloudtrain check`: which clouds this cloudtrain can use right now, and why not.

One `CredentialStatus` per cloud, each a single line a user can act on. Checking a cloud never
creates anything; for AWS it costs one STS GetCallerIdentity call.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudtrain.config import Config
from cloudtrain.errors import CloudtrainError, UsageError
from cloudtrain.providers import KNOWN, available, get_provider
from cloudtrain.providers.base import CredentialStatus
from cloudtrain.yamlfile import did_you_mean

NOT_AVAILABLE = "not available yet in this cloudtrain"
SSH_DETAIL = "uses your SSH agent, keys and ~/.ssh/config for the hosts a recipe lists; nothing to check here"


def check_clouds(config: Config, clouds: Sequence[str] | None = None) -> list[CredentialStatus]:
    """Status of each cloud in `clouds` (default: every cloud cloudtrain knows), in that order."""
    names = list(clouds) if clouds else list(KNOWN)
    for name in names:
        if name not in KNOWN:
            raise UsageError(f"unknown cloud {name!r}", hint=did_you_mean(name, KNOWN) or f"one of {', '.join(KNOWN)}")
    implemented = set(available())
    return [_check_one(name, config, implemented) for name in names]


def _check_one(name: str, config: Config, implemented: set[str]) -> CredentialStatus:
    if name == "ssh":
        # Hosts come from recipes, so there is no account to verify: reachability is `up`'s job.
        # But the SSH library must be there, or every remote cloud fails at the first connect.
        import importlib.util

        if importlib.util.find_spec("paramiko") is None:
            return CredentialStatus("ssh", False, 'paramiko is not installed: pip install "cloudtrain[ssh]"')
        return CredentialStatus("ssh", True, SSH_DETAIL)
    if name not in implemented:
        return CredentialStatus(name, False, NOT_AVAILABLE)
    try:
        return get_provider(name, config).check_credentials()
    except CloudtrainError as exc:
        # e.g. the SDK is not installed, or the configured profile does not exist.
        return CredentialStatus(name, False, exc.one_line())


def usable(statuses: Sequence[CredentialStatus]) -> list[str]:
    return [s.cloud for s in statuses if s.ok]
