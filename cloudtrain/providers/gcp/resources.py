"""A cluster's firewall rules: created before its instances, deleted with the last of them.

Compute Engine firewall rules carry no labels, so ours are found by name (`cloudtrain-*`) and
claimed by their description (`cloudtrain-cluster=<c> cloudtrain-owner=<o>: ...`): a rule whose
description names another cluster or owner is never changed or deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cloudtrain.errors import CredentialsError, ProviderError
from cloudtrain.providers.base import ClusterResource
from cloudtrain.providers.gcp import build
from cloudtrain.providers.gcp.api import ComputeApi, GcpApiError, log


class Firewalls:
    def __init__(self, api: ComputeApi, owner: str | None) -> None:
        self.api = api
        self.owner = owner  # None: every owner's rules (all_owners)

    def ensure(self, cluster: str, owner: str, cidr: str, nodes: int) -> None:
        """Create the cluster's rules, or bring existing ones of this cluster to `cidr` (the
        caller's address changed since): SSH stays open to one address only."""
        client = self.api.client("firewalls")
        pending = []
        for name, body in build.firewall_bodies(cluster, owner, cidr, nodes).items():
            existing = self._get(name)
            if existing is None:
                pending.append((name, self.api.call(f"creating firewall rule {name}", client.insert_unary,
                                                    project=self.api.project,
                                                    firewall_resource=self.api.v1.Firewall(body))))
                continue
            if build.parse_firewall_description(existing.description) != (cluster, owner):
                raise ProviderError(f"firewall rule {name} exists and is not cloudtrain's for cluster {cluster}",
                                    hint="delete it or use another cluster name")
            if list(existing.source_ranges) != list(body.get("source_ranges", existing.source_ranges)):
                patch = self.api.v1.Firewall(source_ranges=body["source_ranges"])
                pending.append((name, self.api.call(f"updating firewall rule {name}", client.patch_unary,
                                                    project=self.api.project, firewall=name,
                                                    firewall_resource=patch)))
        for name, operation in pending:
            self.api.wait(f"creating firewall rule {name}", operation)

    def list(self, cluster: str | None = None) -> list[ClusterResource]:
        rules = self.api.list_all("listing firewall rules", self.api.client("firewalls").list,
                                  project=self.api.project, filter='name eq "cloudtrain-.*"')
        found = []
        for rule in rules:
            claimed = build.parse_firewall_description(rule.description)
            if claimed is None or (cluster is not None and claimed[0] != cluster):
                continue
            if self.owner is not None and claimed[1] != self.owner:
                continue
            found.append(ClusterResource("gcp", claimed[0], "firewall", rule.name))
        return found

    def release(self, cluster: str, live: int) -> list[ClusterResource]:
        """Delete the cluster's rules when no instance of it is left (`live`); else keep them, noted."""
        rules = self.list(cluster)
        if live:
            return [ClusterResource(r.cloud, r.cluster, r.kind, r.id, note=f"in use by {live} instance(s)")
                    for r in rules]
        client = self.api.client("firewalls")
        pending = []
        for rule in rules:
            try:
                pending.append((rule.id, self.api.call(f"deleting firewall rule {rule.id}", client.delete_unary,
                                                       project=self.api.project, firewall=rule.id)))
            except GcpApiError as exc:
                if not exc.not_found:
                    raise
        for name, operation in pending:
            try:
                self.api.wait(f"deleting firewall rule {name}", operation)
            except GcpApiError as exc:
                if not exc.not_found:
                    raise
        return []

    def release_quietly(self, cluster: str, live: Callable[[], int]) -> None:
        """On a failure path: a cleanup error is logged, never raised over the original failure."""
        try:
            kept = self.release(cluster, live())
        except (ProviderError, CredentialsError) as exc:
            log.warning("gcp: could not remove the firewall rules of cluster %s: %s; `cloudtrain down %s` "
                        "or `cloudtrain gc` removes them", cluster, exc.one_line(), cluster)
            return
        for rule in kept:
            log.info("gcp: kept firewall rule %s (%s)", rule.id, rule.note)

    def _get(self, name: str) -> Any | None:
        try:
            return self.api.call(f"reading firewall rule {name}", self.api.client("firewalls").get,
                                 project=self.api.project, firewall=name)
        except GcpApiError as exc:
            if exc.not_found:
                return None
            raise
