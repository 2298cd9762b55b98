"""A ProxyCommand for tests: relay stdin/stdout to a loopback sshd chosen by the target address.

    python -m cloudtrain.testing.route --to PORT HOST PORT        always 127.0.0.1:PORT
    python -m cloudtrain.testing.route --routes FILE HOST PORT    look HOST up in a JSON map

The map file (or $CLOUDTRAIN_TEST_ROUTES when --routes is absent) looks like
    {"routes": {"54.1.2.3": 40001, "54.1.2.4:22": 40002}, "pool": [40001, 40002], "assigned": {}}
An address in `routes` ("host:port" first, then "host") wins; an unknown address takes the next
VM from `pool` that no address holds yet and keeps it (recorded in `assigned`), so a fake cloud's
random public IPs find VMs without the test knowing them in advance.

Network rules: a fake cloud may put `"ingress": {"54.1.2.3": [rule, ...]}` and `"source": ADDRESS`
(the test's "caller address") in the map; a connection to an address with rules is then admitted
only if the rules admit SOURCE on that port, evaluated as clouds do: lowest priority number first,
deny before allow at one priority, first match wins, nothing matching is denied (GCP's implied
deny, Azure's DenyAllInBound). A rule: {"name", "priority", "action": "allow"|"deny", "sources":
[CIDR, ...], "ports": ["22", "1000-2000"] (empty: every port)}; or a list of such lists, layers that
must each admit (Azure: the subnet's NSG and the NIC's). A refused connection fails as a
dropped packet does, after saying which address was refused (no rule admitted it).

Only ever connects to 127.0.0.1: the fake address itself never receives a packet.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import socket
import sys
import threading
from pathlib import Path

ENV_ROUTES = "CLOUDTRAIN_TEST_ROUTES"


class Refused(LookupError):
    """The address's network rules do not admit the source."""


def admits(rules: list[dict], source: str, port: int) -> dict | None:
    """The rule that admits `source` on `port`, or None (denied, or nothing matched)."""
    address = ipaddress.ip_address(source)

    def covers(rule: dict) -> bool:
        if not any(address in ipaddress.ip_network(c, strict=False) for c in rule.get("sources", [])):
            return False
        ports = rule.get("ports") or []
        for spec in ports:
            low, _, high = str(spec).partition("-")
            if int(low) <= port <= int(high or low):
                return True
        return not ports

    ordered = sorted(rules, key=lambda r: (int(r.get("priority", 1000)), r.get("action") != "deny"))
    first = next((r for r in ordered if covers(r)), None)
    return first if first is not None and first.get("action") == "allow" else None


def resolve(host: str, port: int, routes_file: Path) -> int:
    with open(routes_file, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        data = json.load(handle)
        rules = data.get("ingress", {}).get(host)
        # A list of rules, or of layers (Azure: the subnet's NSG, then the NIC's) that must all admit.
        layers = rules if rules and isinstance(rules[0], list) else [rules] if rules is not None else []
        if any(admits(layer, data.get("source", "127.0.0.1"), port) is None for layer in layers):
            raise Refused(f"Connection timed out (the network rules of {host} do not admit "
                          f"{data.get('source')} on port {port})")
        routes = data.get("routes", {})
        for key in (f"{host}:{port}", host):
            if key in routes:
                return int(routes[key])
        assigned = data.setdefault("assigned", {})
        if host in assigned:
            return int(assigned[host])
        taken = set(assigned.values()) | set(routes.values())
        free = [p for p in data.get("pool", []) if p not in taken]
        if not free:
            raise LookupError(f"no route for {host}:{port} in {routes_file} and no free VM in the pool")
        assigned[host] = free[0]
        handle.seek(0)
        handle.truncate()
        json.dump(data, handle)
        return int(free[0])


def relay(sock: socket.socket) -> None:
    """Copy stdin -> sock and sock -> stdout until the server closes."""

    def upstream() -> None:
        how = socket.SHUT_WR  # the client is done sending; the server's last words still come down
        try:
            while chunk := os.read(0, 1 << 18):
                sock.sendall(chunk)
        except OSError:
            # The client went away mid-stream (ECONNRESET on our stdin) or the server did: nothing
            # more flows either way. Shut both, or the loop below waits on an open connection forever
            # (a leaked relay is an SSH session that keeps a node "in use").
            how = socket.SHUT_RDWR
        try:
            sock.shutdown(how)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while chunk := sock.recv(1 << 18):
            view = memoryview(chunk)
            while view:
                written = os.write(1, view)
                view = view[written:]
    except OSError:
        return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cloudtrain.testing.route", description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=int, help="loopback port to connect to, whatever the host")
    parser.add_argument("--routes", type=Path, help="JSON route map (default $CLOUDTRAIN_TEST_ROUTES)")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)
    try:
        if args.to:
            target = args.to
        else:
            routes = args.routes or (Path(os.environ[ENV_ROUTES]) if os.environ.get(ENV_ROUTES) else None)
            if routes is None:
                print("route: give --to PORT or --routes FILE (or set $CLOUDTRAIN_TEST_ROUTES)", file=sys.stderr)
                return 2
            target = resolve(args.host, args.port, routes)
        sock = socket.create_connection(("127.0.0.1", target), timeout=10)
    except (OSError, LookupError, ValueError) as exc:
        print(f"route: {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 255
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    relay(sock)
    return 0


if __name__ == "__main__":
    # os._exit: the stdin thread may still be blocked in read(); don't wait for it.
    sys.stdout.flush()
    os._exit(main())
