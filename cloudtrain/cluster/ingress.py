"""Following the caller's address: a cluster's SSH ingress was written for the address it was
launched from; a laptop that moves (home, office, a hotspot) would then find its own VMs
unreachable while they bill on. Before connecting, a provider that keeps such a rule
(`follow_caller(cluster, cidr)`: GCP's firewall rule, Azure's NSG) brings it to the caller's
address now, and says so in one line."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cloudtrain.config import Config
from cloudtrain.errors import ConfigError
from cloudtrain.providers.base import FollowsCaller, Provider, supports
from cloudtrain.state.records import NodeRecord

log = logging.getLogger("cloudtrain.ingress")


def follow_caller(records: Sequence[NodeRecord], provider: Provider, config: Config) -> None:
    if not supports(provider, FollowsCaller) or not records:
        return
    follow = provider.follow_caller  # type: ignore[attr-defined]
    cidr = config.ssh.allowed_cidr
    if cidr is None:
        from cloudtrain.netaddr import caller_cidr

        try:
            cidr = caller_cidr()
        except ConfigError as exc:
            # Not knowing our address must not keep anyone from a node the rule may still admit.
            log.info("cannot check the cluster's SSH rule: %s", exc.one_line())
            return
    cluster = records[0].cluster
    before = follow(cluster, cidr)
    if before is not None:
        log.warning("your address changed: SSH to cluster %s now admitted from %s (was %s)", cluster, cidr, before)
