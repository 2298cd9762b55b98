"""A cluster's resources besides its instances: firewall rules, and disks left loose.

Firewall rules are created before the instances and deleted with the last of them. Compute Engine
firewall rules carry no labels, so ours are found by name (`cloudtrain-*`) and claimed by their
description (`cloudtrain-cluster=<c> cloudtrain-owner=<o>: ...`): a rule whose description names
another cluster or owner is never changed or deleted.

Reading rules and disks and deleting them is REST (api.ComputeApi: `down` and `gc` import no SDK),
so rules and disks are their JSON here; creating and patching a rule (`ensure`, `follow`) keeps
the SDK's Firewall message (see api.py).

Disks: cloudtrain makes only boot disks, labelled like their instance and deleted with it
(autoDelete). One can still outlive its instance (deleted with autoDelete off, by hand or by a
tool; an insert that failed after its disk was made) and stays billed per GB-month. A loose disk is
one carrying both our labels (`cloudtrain-cluster` and this owner's `cloudtrain-owner`) that no
instance uses (`users` empty); only those are listed and deleted.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from cloudtrain.errors import CredentialsError, ProviderError
from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER, ClusterResource
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
                # requestId: a retried insert (a 503 after GCP acted) gets the first operation back.
                pending.append((name, self.api.call(f"creating firewall rule {name}", client.insert_unary,
                                                    request={"project": self.api.project,
                                                             "request_id": str(uuid.uuid4()),
                                                             "firewall_resource": self.api.v1.Firewall(body)})))
                continue
            if build.parse_firewall_description(existing.get("description", "")) != (cluster, owner):
                raise ProviderError(f"firewall rule {name} exists and is not cloudtrain's for cluster {cluster}",
                                    hint="delete it or use another cluster name")
            ranges = list(existing.get("sourceRanges") or [])
            if ranges != list(body.get("source_ranges", ranges)):
                patch = self.api.v1.Firewall(source_ranges=body["source_ranges"])
                pending.append((name, self.api.call(f"updating firewall rule {name}", client.patch_unary,
                                                    project=self.api.project, firewall=name,
                                                    firewall_resource=patch)))
        for name, operation in pending:
            self.api.wait(f"creating firewall rule {name}", operation)

    def follow(self, cluster: str, cidr: str) -> str | None:
        """Bring the cluster's SSH rule to `cidr` (the caller moved: home, office, a hotspot);
        the old source ranges when it changed, else None (already so, or no rule of ours)."""
        name = build.firewall_name(cluster, "ssh")
        rule = self._get(name)
        claimed = build.parse_firewall_description(rule.get("description", "")) if rule is not None else None
        if rule is None or claimed is None or claimed[0] != cluster or (self.owner and claimed[1] != self.owner):
            return None
        before = list(rule.get("sourceRanges") or [])
        if before == [cidr]:
            return None
        operation = self.api.call(f"updating firewall rule {name}", self.api.client("firewalls").patch_unary,
                                  project=self.api.project, firewall=name,
                                  firewall_resource=self.api.v1.Firewall(source_ranges=[cidr]))
        self.api.wait(f"updating firewall rule {name}", operation)
        return ", ".join(before)

    def list(self, cluster: str | None = None) -> list[ClusterResource]:
        rules = self.api.list_json("listing firewall rules", "global/firewalls", filter='name eq "cloudtrain-.*"')
        found = []
        for rule in rules:
            claimed = build.parse_firewall_description(rule.get("description", ""))
            if claimed is None or (cluster is not None and claimed[0] != cluster):
                continue
            if self.owner is not None and claimed[1] != self.owner:
                continue
            found.append(ClusterResource("gcp", claimed[0], "firewall", rule["name"]))
        return found

    def release(self, cluster: str, live: int) -> list[ClusterResource]:
        """Delete the cluster's rules when no instance of it is left (`live`); else keep them, noted."""
        rules = self.list(cluster)
        if live:
            return [ClusterResource(r.cloud, r.cluster, r.kind, r.id, note=f"in use by {live} instance(s)")
                    for r in rules]
        pending = []
        for rule in rules:
            try:
                pending.append((rule.id, self.api.delete_json(f"deleting firewall rule {rule.id}",
                                                              f"global/firewalls/{quote(rule.id, safe='')}")))
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

    def _get(self, name: str) -> dict[str, Any] | None:
        """The rule's JSON (firewalls.get), None when there is none."""
        try:
            return self.api.get_json(f"reading firewall rule {name}", f"global/firewalls/{quote(name, safe='')}")
        except GcpApiError as exc:
            if exc.not_found:
                return None
            raise


# Compute Engine's reason (HTTP 400) when a disk to delete is attached to an instance.
IN_USE = "resourceInUseByAnotherResource"


class Disks:
    """Loose labelled disks (see the module docstring), listed for `gc` with their size."""

    def __init__(self, api: ComputeApi, owner: str | None) -> None:
        self.api = api
        self.owner = owner  # None: every owner's disks (all_owners); the owner label is still required

    def list(self, cluster: str | None = None) -> list[ClusterResource]:
        return [_disk_resource(zone, raw) for zone, raw in self._loose(cluster)]

    def release(self, cluster: str, live: int) -> list[ClusterResource]:
        """Delete the cluster's loose disks when no instance of it is left (`live`): while the cluster
        has instances a launch or a replacement may be about to attach one, so they are kept, noted.
        A disk attached since it was listed is kept (Compute Engine refuses to delete it)."""
        loose = self._loose(cluster)
        if live:
            return [_noted(_disk_resource(zone, raw), f"the cluster still has {live} instance(s)")
                    for zone, raw in loose]
        kept, pending = [], []
        for zone, raw in loose:
            name = raw["name"]
            try:
                pending.append((zone, name, self.api.delete_json(
                    f"deleting disk {name}", f"zones/{quote(zone, safe='')}/disks/{quote(name, safe='')}")))
            except GcpApiError as exc:
                if exc.code == IN_USE:
                    kept.append(_noted(_disk_resource(zone, raw), "attached to an instance since listed"))
                elif not exc.not_found:
                    raise
        for zone, name, operation in pending:
            try:
                self.api.wait(f"deleting disk {name}", operation, zone)
            except GcpApiError as exc:
                if not exc.not_found:
                    raise
        return kept

    def _loose(self, cluster: str | None) -> list[tuple[str, dict[str, Any]]]:
        """(zone, disk JSON) of this owner's labelled disks no instance uses. The filter narrows the
        listing; the labels and `users` are checked here again, since deleting rests on them."""
        want_cluster = build.label_value(cluster) if cluster else None
        terms = [f'(labels.{TAG_CLUSTER} = "{want_cluster}")' if want_cluster else f"(labels.{TAG_CLUSTER}:*)",
                 f'(labels.{TAG_OWNER} = "{self.owner}")' if self.owner else f"(labels.{TAG_OWNER}:*)"]
        found = self.api.aggregated_json("listing disks", "disks", filter=" ".join(terms))
        loose = []
        for zone, raw in found:
            labels = dict(raw.get("labels") or {})
            if not labels.get(TAG_CLUSTER) or not labels.get(TAG_OWNER) or raw.get("users"):
                continue
            if want_cluster and labels[TAG_CLUSTER] != want_cluster:
                continue
            if self.owner and labels[TAG_OWNER] != self.owner:
                continue
            loose.append((zone, raw))
        return sorted(loose, key=lambda found: (found[0], found[1]["name"]))


def _disk_resource(zone: str, raw: dict[str, Any]) -> ClusterResource:
    """Named `<zone>:<name>` like instances (a disk lives in one zone); priced by its size
    (`sizeGb`, an int64: a string in the JSON)."""
    size = raw.get("sizeGb")
    return ClusterResource("gcp", raw["labels"][TAG_CLUSTER], "disk", build.instance_id(zone, raw["name"]),
                           build.region_of(zone), size_gb=float(size) if size and float(size) else None)


def _noted(resource: ClusterResource, note: str) -> ClusterResource:
    """What release_resources returns for a resource it kept: the resource, with why."""
    return dataclasses.replace(resource, note=note)
