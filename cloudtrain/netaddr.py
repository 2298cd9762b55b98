"""The caller's public address, for cloud firewall rules that admit SSH from this machine only."""

from __future__ import annotations

import ipaddress
import os
import urllib.request

from cloudtrain.errors import ConfigError

# Plain-text "what is my IP" services, tried in order. AWS's own answers from every region.
_ECHO_SERVICES = ("https://checkip.amazonaws.com", "https://api.ipify.org")


def caller_cidr(timeout_s: float = 5.0) -> str:
    """This machine's public IPv4 address as a /32, or a ConfigError telling how to set it by hand."""
    problems = []
    override = os.environ.get("CLOUDTRAIN_IP_ECHO_URL")  # a bastion's or a test's own echo service
    for url in (override,) if override else _ECHO_SERVICES:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (fixed https URLs)
                text = response.read(64).decode("ascii", errors="replace").strip()
            address = ipaddress.ip_address(text)
        except (OSError, ValueError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        if address.version != 4:
            problems.append(f"{url}: got IPv6 {address}")
            continue
        return f"{address}/32"
    raise ConfigError(
        "cannot detect your public IP address for the SSH firewall rule (" + "; ".join(problems) + ")",
        hint="set ssh.allowed_cidr in config.yaml, e.g. 203.0.113.7/32",
    )
