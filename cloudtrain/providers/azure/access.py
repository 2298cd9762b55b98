"""Whether the launching credentials may grant the VMs' identities their role, asked before a launch.

A VM's watchdog acts on its own VM (deallocate, delete) with its managed identity, which needs a
role on the cluster's group; granting it needs `Microsoft.Authorization/roleAssignments/write`,
which Owner and User Access Administrator have and Contributor, the role most launch credentials
hold, does not (its notActions exclude `Microsoft.Authorization/*/Write`). Without this check a
Contributor's `up` with autostop built the whole cluster, failed to grant the role, and tore it
all down again. ARM answers "what may I do here" per resource group (Permissions - List For
Resource Group): the effective actions and notActions of every role the caller holds there.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

GRANT_ACTION = "Microsoft.Authorization/roleAssignments/write"
GRANT_HINT = ("the VM's identity gets a role on the cluster's resource group so its watchdog can stop or delete it; "
              "granting it needs Microsoft.Authorization/roleAssignments/write: Owner or User Access Administrator "
              "on the subscription (Contributor lacks it); or launch without autostop and budget")


def _matches(patterns: Iterable[str], action: str) -> bool:
    """Azure action patterns: `*` wildcards, case-insensitive."""
    return any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in patterns)


def allows(permissions: Iterable[Any], action: str) -> bool:
    """Whether any permission entry (its `actions` minus its `not_actions`) grants `action`."""
    for entry in permissions:
        actions = list(getattr(entry, "actions", None) or [])
        not_actions = list(getattr(entry, "not_actions", None) or [])
        if _matches(actions, action) and not _matches(not_actions, action):
            return True
    return False
