"""The edit-run loop at a distance: `cloudtrain run` (warm, cold) vs the same work by hand.

One run, one STOCK sshd (benchmarks/stock_sshd.py: the distribution's sshd_config, UsePAM and a
login shell per session, as on a VM; not the test kit's cheap sessions), reached through a TCP
proxy that adds --rtt-ms of round-trip time (cloudtrain.testing.tcpproxy). A 50-file workdir and a
trivial job (`mkdir -p out && echo done > out/ok.txt`); one file edited before each iteration.
Each figure is the median of --repeat wall times, per RTT; the variants take turns within each
repetition, so a busy machine slows them alike:

  by hand   rsync the workdir up, ssh the command, rsync out/ back (three OpenSSH processes)
  warm      `cloudtrain run --keep` on a cluster that is already up
  warm, one channel per command   the same with the node helper off (CLOUDTRAIN_SSH_HELPER=0)
  cold      `cloudtrain run --down` with a new cluster name each time (up on the ssh host, down after)
  exec      `cloudtrain exec NAME -- JOB` after the edit, and with the workdir unchanged; its ratio is
            to `rsync + ssh` by hand (the same without the results' copy back)
  exec, unchanged, no reuse   the same with connection reuse off (CLOUDTRAIN_SSH_PERSIST_S=0): every
            command connects itself, as before remote/mux.py

Connection reuse (ssh.persist_s, on by default) applies to every cloudtrain row except the cold
runs: the node's mux, left by the previous command, serves warm runs and exec. By hand is plain
OpenSSH without ControlMaster (what the issue compares with).

Round trips: the sequential request -> answer turns cloudtrain made after connecting, COUNTED by
the transport (cloudtrain/remote/roundtrips.py, read from CLOUDTRAIN_ROUNDTRIPS_LOG), summed over
the invocation's connections; the median over the repetitions.

Targets (issue 25): warm <= 1.0x by hand at 50 and 150 ms RTT, cold <= 1.5x.

    .venv/bin/python benchmarks/run_loop.py [--repeat 5] [--rtt-ms 0,50,150] [--no-cold]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

TARGETS = {"warm": 1.0, "cold": 1.5}
# The by-hand figure each row is compared with (default: "by hand").
BASES = {"exec, one file edited": "rsync + ssh", "exec, unchanged": "rsync + ssh",
         "exec, unchanged, no reuse": "rsync + ssh"}
JOB = "mkdir -p out && echo done > out/ok.txt"
ROUNDTRIPS_ENV = "CLOUDTRAIN_ROUNDTRIPS_LOG"
PERSIST_ENV = "CLOUDTRAIN_SSH_PERSIST_S"


def timed(argv: list[str], env: dict[str, str], cwd: Path, trips: Path | None = None) -> tuple[float, int | None]:
    """Wall time of a CLI invocation and the round trips its transports counted."""
    if trips is not None:
        trips.write_text("")
        env = {**env, ROUNDTRIPS_ENV: str(trips)}
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    if trips is None:
        return elapsed, None
    reports = [json.loads(line) for line in trips.read_text().splitlines() if line.strip()]
    return elapsed, sum(r["round_trips"] for r in reports)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rtt-ms", default="0,50,150", help="comma-separated round-trip times to add (ms)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold runs")
    parser.add_argument("--no-channels", action="store_true", help="skip the one-channel-per-command variant")
    parser.add_argument("--no-exec", action="store_true", help="skip the exec variants")
    args = parser.parse_args()
    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(repo / "benchmarks"))
    from stock_sshd import StockSshd

    from cloudtrain.testing.tcpproxy import TcpProxy

    rows: list[tuple[float, str, float, int | None]] = []
    with tempfile.TemporaryDirectory(prefix="ct-runloop-") as tmp:
        root = Path(tmp)
        key = root / "client_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        vm = StockSshd(root / "vm", key.with_suffix(".pub").read_text()).start()
        try:
            work = root / "project" / "code"
            work.mkdir(parents=True)
            for i in range(50):
                (work / f"module_{i}.py").write_text(f"VALUE = {i}\n")
            home = root / "home"
            (home / ".ct").mkdir(parents=True)
            (home / ".ct" / "config.yaml").write_text("ssh: {add_include: false}\n")
            env = {**os.environ, "HOME": str(home), "CLOUDTRAIN_HOME": str(home / ".ct")}
            trips = root / "roundtrips.jsonl"
            cli = [sys.executable, "-m", "cloudtrain"]
            runs = str(root / "runs")

            def touch(i: int) -> None:
                (work / "module_0.py").write_text(f"VALUE = {i}\n")

            for rtt in rtts:
                proxy = TcpProxy(vm.port, rtt_ms=rtt)
                try:
                    recipe = root / "project" / f"loop-{int(rtt)}.yaml"
                    recipe.write_text(textwrap.dedent(f"""\
                        name: loop-{int(rtt)}
                        workdir: code
                        resources:
                          cloud: ssh
                          hosts: [{{address: 127.0.0.1, port: {proxy.port}, user: {vm.user}, key: "{key}"}}]
                        results: [out]
                        run: "{JOB}"
                    """))
                    ssh = ["ssh", "-p", str(proxy.port), "-i", str(key), "-o", "BatchMode=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={root / 'known_hosts'}",
                           "-o", "LogLevel=ERROR"]
                    target = f"{vm.user}@127.0.0.1"
                    remote = f"{vm.home}/byhand"
                    back = root / "back"

                    def by_hand(i: int) -> tuple[float, int | None]:
                        touch(i)
                        started = time.perf_counter()
                        e = shlex.join(ssh)
                        subprocess.run(["rsync", "-a", "-e", e, f"{work}/", f"{target}:{remote}/"], check=True)
                        subprocess.run([*ssh, target, f"cd {shlex.quote(remote)} && {JOB}"], check=True)
                        subprocess.run(["rsync", "-a", "-e", e, f"{target}:{remote}/out/", f"{back}/"], check=True)
                        return time.perf_counter() - started, None

                    def rsync_ssh(i: int) -> tuple[float, int | None]:
                        touch(i)
                        started = time.perf_counter()
                        subprocess.run(["rsync", "-a", "-e", shlex.join(ssh), f"{work}/", f"{target}:{remote}/"],
                                       check=True)
                        subprocess.run([*ssh, target, f"cd {shlex.quote(remote)} && {JOB}"], check=True)
                        return time.perf_counter() - started, None

                    def exec_(i: int, edit: bool, extra: dict[str, str] | None = None) -> tuple[float, int | None]:
                        if edit:
                            touch(10_000 + i)  # another size than the runs' edit: a change whatever the clock
                        return timed([*cli, "exec", f"loop-{int(rtt)}", "--", JOB], {**env, **(extra or {})}, root,
                                     trips)

                    def warm(i: int, extra: dict[str, str] | None = None) -> tuple[float, int | None]:
                        touch(i)
                        return timed([*cli, "run", str(recipe), "--keep", "--runs-dir", runs], {**env, **(extra or {})},
                                     root, trips)

                    def cold(i: int) -> tuple[float, int | None]:
                        touch(i)
                        return timed([*cli, "run", str(recipe), "--cluster", f"cold-{int(rtt)}-{i}", "--down",
                                       "--runs-dir", runs], env, root, trips)

                    timed([*cli, "up", str(recipe)], env, root)
                    by_hand(-1)  # warm the page cache and sshd
                    actions: list[tuple[str, Callable[[int], tuple[float, int | None]]]] = [
                        ("by hand", by_hand), ("warm", warm)]
                    if not args.no_channels:
                        actions.append(("warm, one channel per command",
                                        lambda i: warm(i, {"CLOUDTRAIN_SSH_HELPER": "0"})))
                    if not args.no_cold:
                        actions.append(("cold", cold))
                    if not args.no_exec:
                        actions += [("rsync + ssh", rsync_ssh), ("exec, one file edited", lambda i: exec_(i, True)),
                                    ("exec, unchanged", lambda i: exec_(i, False)),
                                    ("exec, unchanged, no reuse", lambda i: exec_(i, False, {PERSIST_ENV: "0"}))]
                    # Interleaved (each repetition runs every variant once): load from elsewhere on a
                    # shared machine then falls on all of them alike.
                    samples: dict[str, list[tuple[float, int | None]]] = {name: [] for name, _ in actions}
                    for i in range(args.repeat):
                        for name, action in actions:
                            samples[name].append(action(i))
                    for name, _ in actions:
                        counted = [n for _, n in samples[name] if n is not None]
                        rows.append((rtt, name, statistics.median(s for s, _ in samples[name]),
                                     int(statistics.median(counted)) if counted else None))
                    timed([*cli, "down", f"loop-{int(rtt)}"], env, root)
                finally:
                    proxy.close()
        finally:
            vm.close()

    print(f"\nedit-run loop through a latency proxy, stock sshd, median of {args.repeat}")
    print(f"the node's home: {vm.disk}\n")
    print(f"{'RTT':>6}  {'what':<31} {'median':>8}  {'ratio':>6}  {'round trips':>11}  target")
    for rtt in rtts:
        for r, name, seconds, trips_n in rows:
            if r != rtt:
                continue
            base = next(s for r2, n, s, _ in rows if r2 == rtt and n == BASES.get(name, "by hand"))
            target = TARGETS.get(name)
            mark = "" if target is None else f"<= {target}x {'ok' if seconds / base <= target else 'MISSED'}"
            counted = "-" if trips_n is None else str(trips_n)
            print(f"{rtt:>4.0f}ms  {name:<31} {seconds:7.2f}s  {seconds / base:5.2f}x  {counted:>11}  {mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
