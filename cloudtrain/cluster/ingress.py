"""Following the caller's address: a cluster's SSH ingress was written for the address it was
launched from; a laptop that moves (home, office, a hotspot) would then find its own VMs
unreachable while they bill on. Before connecting, a provider that keeps such a rule
(`follow_caller(cluster, cidr)`: GCP's firewall rule, Azure's NSG) brings it to the caller's
address now, and says so in one line.

Asking the cloud costs its SDK (google-cloud-compute imports in 2-4 s, Azure's network SDK and
azure-identity in ~1.5 s), on every `exec` and `logs`. So the answer is remembered, per cluster,
in a small file under the home directory (`ingress/<cluster>.json`: the CIDR the rule was
found or put at, the rank-0 instance it was asked for, when): while the caller's address is that
CIDR, the cluster the same machines and the answer younger than TRUST_S, the cloud is not asked.
The address itself is still found out every time (config `ssh.allowed_cidr`, else the echo
service: no SDK), so a caller that moved is noticed before a connect that would fail. What the
file cannot see, the rule changed behind our back (another machine of the same user, the
console), is caught two ways: the answer is trusted for TRUST_S only, and a connect that fails
after a remembered answer asks the cloud again and, when that moved the rule, connects again
(`Check.after_failure`). Nothing secret is in the file: an address and an instance id.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.config import Config
from cloudtrain.errors import ConfigError
from cloudtrain.providers.base import FollowsCaller, Provider, supports
from cloudtrain.state.records import NodeRecord

log = logging.getLogger("cloudtrain.ingress")

# How long a remembered answer is believed without asking the cloud. Short enough that a rule
# moved by someone else is put back within minutes even if no connect fails; long enough that an
# edit-exec loop asks about once per sitting.
TRUST_S = 600.0


@dataclass(frozen=True)
class Check:
    """What `follow_caller` did before a connect: `remembered` when the cloud was not asked
    (a remembered answer held), so a failed connect should ask it (`after_failure`)."""

    records: tuple[NodeRecord, ...]
    provider: Provider
    cidr: str | None
    remembered: bool

    def after_failure(self) -> bool:
        """The connect failed: ask the cloud now if it was not asked. True when the rule was not
        at the caller's address (it is now), i.e. connecting again may work."""
        if not self.remembered or self.cidr is None:
            return False
        forget(self.records[0].cluster)
        log.info("connect failed after a remembered SSH rule: asking the cloud")
        return _ask(self.records, self.provider, self.cidr, after_failure=True) is not None


def follow_caller(records: Sequence[NodeRecord], provider: Provider, config: Config) -> Check:
    """Bring the cluster's SSH rule to the caller's address unless a remembered answer says it is."""
    records = tuple(records)
    if not supports(provider, FollowsCaller) or not records:
        return Check(records, provider, None, remembered=False)
    cidr = config.ssh.allowed_cidr
    if cidr is None:
        from cloudtrain.netaddr import caller_cidr

        try:
            cidr = caller_cidr()
        except ConfigError as exc:
            # Not knowing our address must not keep anyone from a node the rule may still admit.
            log.info("cannot check the cluster's SSH rule: %s", exc.one_line())
            return Check(records, provider, None, remembered=False)
    if _remembered(records, cidr):
        return Check(records, provider, cidr, remembered=True)
    _ask(records, provider, cidr)
    return Check(records, provider, cidr, remembered=False)


def forget(cluster: str) -> None:
    """The cluster is gone (or its rule in doubt): the next connect asks the cloud."""
    try:
        _path(cluster).unlink()
    except FileNotFoundError:
        pass


def _ask(records: tuple[NodeRecord, ...], provider: Provider, cidr: str, *, after_failure: bool = False) -> str | None:
    """Ask the cloud (the provider's follow_caller), remember the answer; the old ranges if moved."""
    cluster = records[0].cluster
    before = provider.follow_caller(cluster, cidr)  # type: ignore[attr-defined]
    if before is not None and after_failure:
        # Our address is what we remembered: the rule is what changed (another machine, the console).
        log.warning("SSH to cluster %s admitted %s, not you: now admitted from %s", cluster, before, cidr)
    elif before is not None:
        log.warning("your address changed: SSH to cluster %s now admitted from %s (was %s)", cluster, cidr, before)
    _remember(records, cidr)
    return before


def _path(cluster: str) -> Path:
    from cloudtrain.paths import home_path

    return home_path() / "ingress" / f"{cluster}.json"


def _first(records: tuple[NodeRecord, ...]) -> str:
    return min(records, key=lambda r: r.rank).instance_id


def _remembered(records: tuple[NodeRecord, ...], cidr: str) -> bool:
    try:
        saved = json.loads(_path(records[0].cluster).read_text())
        checked_at = float(saved["checked_at"])
        same = saved["cidr"] == cidr and saved["instance"] == _first(records)
    except (OSError, ValueError, KeyError, TypeError):
        return False  # none yet, or unreadable: ask
    return same and 0 <= time.time() - checked_at < TRUST_S


def _remember(records: tuple[NodeRecord, ...], cidr: str) -> None:
    path = _path(records[0].cluster)
    body = json.dumps({"cidr": cidr, "instance": _first(records), "checked_at": time.time()})
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(body)
        partial.replace(path)  # whole or not at all, whoever writes at the same time
    except OSError as exc:
        # Not remembering only costs the next command the cloud's answer again.
        log.info("cannot remember the SSH rule's answer in %s: %s", path, exc)
