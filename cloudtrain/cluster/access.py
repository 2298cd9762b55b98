"""How we get into a cluster's machines and how that ends: its SSH key, the address its firewall
admits, the pinned host keys and the ssh config entry. One owner for the identity a cluster's
machines trust; lifecycle only asks for it at launch and gives it back at `down`."""

from __future__ import annotations

from collections.abc import Iterable

from cloudtrain.config import Config
from cloudtrain.events import Reporter
from cloudtrain.providers.base import GivenHosts, Provider, supports


def grant(name: str, provider: Provider, config: Config, reporter: Reporter) -> tuple[str | None, str | None]:
    """(public key, admitted CIDR) for a new cluster's machines. A machine we create gets this
    cluster's own key and a firewall open to the caller's address only (never 0.0.0.0/0 by
    default); machines that exist already (hosts) keep their own access."""
    allowed_cidr = config.ssh.allowed_cidr
    if not provider.traits.remote or supports(provider, GivenHosts):
        return None, allowed_cidr
    from cloudtrain.remote import keys

    public_key = keys.cluster_key(name).public_openssh
    if allowed_cidr is None:
        from cloudtrain.netaddr import caller_cidr

        allowed_cidr = caller_cidr()
        reporter.info(f"SSH ingress limited to {allowed_cidr} (set ssh.allowed_cidr to change)")
    return public_key, allowed_cidr


def revoke(name: str, provider: Provider, instance_ids: Iterable[str]) -> None:
    """The cluster is gone: forget its machines' pinned host keys, its key, its ssh config entry
    and what we remembered of its SSH rule."""
    if not provider.traits.remote:
        return
    from cloudtrain.cluster.ingress import forget
    from cloudtrain.remote import keys

    forget(name)

    for instance_id in instance_ids:
        keys.KnownHosts().forget(instance_id)
    keys.delete_cluster_key(name)
    keys.remove_ssh_config(name)
