"""The identity an Azure node reads and writes its buckets with: the cluster's user-assigned managed
identity its VMs act as (made before them: providers/azure/__init__.py), given a Storage Blob Data
role on exactly the recipe's containers (docs/data.md); for VMs of earlier versions, their
system-assigned one.

`Storage Blob Data Reader` on each data container, `Storage Blob Data Contributor` on the upload
container, each assigned at the container's scope
(`<storage account id>/blobServices/default/containers/<name>`), never the account's: the node
reaches nothing else in the account. The account is found by name in the subscription (an
`az://account/...` URL names no resource group); one the subscription lacks is refused before
any billed resource exists.

Role assignments carry no tags, and they outlive the VM whose identity they name (Azure keeps an
assignment of a deleted principal, shown as "Identity not found"), and they live in the storage
account's resource group, not the cluster's: deleting the cluster's group does not remove them.
So each carries its cluster and owner in its `description`, which is how `down` (via
release_resources) and `gc` find them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.buckets.grants import BucketGrant
from cloudtrain.buckets.url import Store
from cloudtrain.errors import CredentialsError, UsageError
from cloudtrain.providers.azure import access
from cloudtrain.providers.azure.api import ArmApi, AzureApiError
from cloudtrain.providers.azure.build import vm_principals

READER_ROLE = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"  # Storage Blob Data Reader: read and list blobs
CONTRIBUTOR_ROLE = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"  # Storage Blob Data Contributor: also write, delete
_DESCRIPTION = re.compile(r"^cloudtrain cluster=(?P<cluster>\S+) owner=(?P<owner>\S+)")
STORAGE_ACCOUNT_TYPE = "Microsoft.Storage/storageAccounts"


@dataclass(frozen=True)
class BlobAssignment:
    """One of our role assignments on a container, as ARM lists it."""

    id: str
    name: str
    scope: str
    role: str  # role definition GUID
    principal: str
    cluster: str
    owner: str


def describe() -> str:
    return "the VM's managed identity (the cluster's, user-assigned; no user credentials on the VM)"


def description(cluster: str, owner: str) -> str:
    return f"cloudtrain cluster={cluster} owner={owner} (the cluster's VMs read or write this container)"


def container_roles(grants: Iterable[BucketGrant]) -> dict[tuple[str, str], str]:
    """(account, container) -> the role the nodes need there: Contributor where anything is
    uploaded, else Reader. Prefixes are not scopes in Azure RBAC: the container is the narrowest."""
    roles: dict[tuple[str, str], str] = {}
    for grant in grants:
        if grant.url.store is not Store.AZURE:
            continue
        key = (grant.url.account, grant.url.bucket)
        if roles.get(key) != CONTRIBUTOR_ROLE:  # Contributor also reads: one assignment covers both
            roles[key] = CONTRIBUTOR_ROLE if grant.write else READER_ROLE
    return roles


def find_accounts(api: ArmApi, accounts: Iterable[str]) -> dict[str, str]:
    """Storage account name -> its resource id, for each named; UsageError (one line) for one the
    subscription does not hold."""
    found: dict[str, str] = {}
    for account in sorted(set(accounts)):
        listed = api.call(f"finding storage account {account}", lambda a=account: list(api.resource.resources.list(
            filter=f"resourceType eq '{STORAGE_ACCOUNT_TYPE}' and name eq '{a}'")))
        match = [r for r in listed if (r.name or "").lower() == account.lower()]
        if not match:
            raise UsageError(f"az://{account}: no storage account {account!r} in subscription "
                             f"{api.require_subscription()}, so the cluster's managed identity cannot be given a role "
                             "on its containers", hint="check the account name, or run in the subscription that "
                                                       "holds the account")
        found[account] = match[0].id
    return found


def require_grant(api: ArmApi, accounts: dict[str, str]) -> None:
    """CredentialsError (one line) unless these credentials may assign roles where each storage
    account is, asked of ARM before any billed resource exists. Asked per resource group (what
    Permissions - List For Resource Group answers): a role held on the account alone is not seen."""
    for account, account_id in sorted(accounts.items()):
        group = account_id.split("/")[4]
        permissions = api.call(f"reading the permissions of these credentials in {group}",
                               lambda g=group: list(api.authorization.permissions.list_for_resource_group(g)))
        if not access.allows(permissions, access.GRANT_ACTION):
            raise CredentialsError(
                f"az://{account}: the cluster's managed identity needs a Storage Blob Data role on the recipe's "
                f"containers, and these credentials may not assign one in resource group {group} "
                f"({access.GRANT_ACTION})",
                hint="Owner, User Access Administrator or Role Based Access Control Administrator on the storage "
                     "account; or read the data from ssh/local nodes with your own credentials")


def container_scope(account_id: str, container: str) -> str:
    return f"{account_id}/blobServices/default/containers/{container}"


def assignment_name(cluster: str, principal: str, scope: str, role: str) -> str:
    """Deterministic, so a retried launch or a second run assigns the same role once."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cloudtrain:{cluster}:{principal}:{scope.lower()}:{role}"))


def ours(api: ArmApi, cluster: str | None = None, owner: str | None = None) -> list[BlobAssignment]:
    """Our container role assignments in the subscription (of `cluster`, of `owner`; None: any)."""
    listed = api.call("listing role assignments",
                      lambda: list(api.authorization.role_assignments.list_for_subscription()))
    found = []
    for item in listed:
        match = _DESCRIPTION.match(getattr(item, "description", None) or "")
        if match is None or "/blobservices/default/containers/" not in (item.scope or "").lower():
            continue
        if (cluster is not None and match["cluster"] != cluster) or (owner is not None and match["owner"] != owner):
            continue
        found.append(BlobAssignment(item.id, item.name, item.scope, (item.role_definition_id or "").rsplit("/", 1)[-1],
                                    item.principal_id or "", match["cluster"], match["owner"]))
    return found


def grant(api: ArmApi, cluster: str, owner: str, principals: Sequence[str], grants: Sequence[BucketGrant]) -> None:
    """Each VM identity gets exactly `grants`' containers: missing assignments are made, ours for
    this cluster that the recipe no longer names are deleted (a reused cluster, another recipe)."""
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    roles = container_roles(grants)
    accounts = find_accounts(api, {a for a, _ in roles}) if roles else {}
    subscription = api.require_subscription()
    wanted: set[str] = set()
    for (account, container), role in sorted(roles.items()):
        scope = container_scope(accounts[account], container)
        for principal in principals:
            name = assignment_name(cluster, principal, scope, role)
            wanted.add(name)
            body = RoleAssignmentCreateParameters(
                role_definition_id=f"/subscriptions/{subscription}/providers/Microsoft.Authorization/"
                                   f"roleDefinitions/{role}",
                principal_id=principal, principal_type="ServicePrincipal", description=description(cluster, owner))
            try:
                api.call(f"giving the VM's identity {_role_words(role)} on az://{account}/{container}",
                         api.authorization.role_assignments.create, scope, name, body)
            except AzureApiError as exc:
                if exc.code != "RoleAssignmentExists":
                    raise
    for stale in ours(api, cluster):
        if stale.name not in wanted:
            _delete(api, stale)


def release(api: ArmApi, cluster: str) -> list[BlobAssignment]:
    """Delete the cluster's container role assignments (whoever's owner tag); returns them."""
    gone = ours(api, cluster)
    for assignment in gone:
        _delete(api, assignment)
    return gone


def _delete(api: ArmApi, assignment: BlobAssignment) -> None:
    try:
        api.call("removing a role assignment", api.authorization.role_assignments.delete, assignment.scope,
                 assignment.name)
    except AzureApiError as exc:
        if exc.status != 404:
            raise


def _role_words(role: str) -> str:
    return "Storage Blob Data Contributor" if role == CONTRIBUTOR_ROLE else "Storage Blob Data Reader"


def principals_of(vms: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(p for vm in vms for p in vm_principals(vm)))  # one cluster identity, many VMs
