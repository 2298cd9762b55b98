"""The edit-run loop: `cloudtrain run` on a warm and a cold cluster vs the same work by hand.

One run, one loopback sshd VM (cloudtrain.testing.sshd), a 50-file workdir and a trivial job
(`mkdir -p out && echo done > out/ok.txt`). Each figure is the median of --repeat wall times:

  by hand   rsync the workdir up, ssh the command, rsync out/ back (three OpenSSH processes)
  warm      `cloudtrain run --keep` on a cluster that is already up (one file changed each time)
  cold      `cloudtrain run` creating and deleting the cluster each time

Targets (issue 15): warm <= 1.5x by hand, cold <= 2.5x.

    .venv/bin/python benchmarks/run_loop.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TARGETS = {"warm": 1.5, "cold": 2.5}
JOB = "mkdir -p out && echo done > out/ok.txt"


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cloudtrain.testing.sshd import SshdFactory

    with tempfile.TemporaryDirectory(prefix="ct-runloop-") as tmp:
        root = Path(tmp)
        factory = SshdFactory(root / "vms")
        try:
            vm = factory.start()
            work = root / "project" / "code"
            work.mkdir(parents=True)
            for i in range(50):
                (work / f"module_{i}.py").write_text(f"VALUE = {i}\n")
            home = root / "home"
            (home / ".ct").mkdir(parents=True)
            (home / ".ct" / "config.yaml").write_text("ssh: {add_include: false}\n")
            env = {**os.environ, "HOME": str(home), "CLOUDTRAIN_HOME": str(home / ".ct")}
            recipe = root / "project" / "loop.yaml"
            recipe.write_text(textwrap.dedent(f"""\
                name: loop
                workdir: code
                resources:
                  cloud: ssh
                  hosts: [{{address: 127.0.0.1, port: {vm.port}, user: {vm.user}, key: "{factory.client_key.private_path}"}}]
                results: [out]
                run: "{JOB}"
            """))
            ssh = ["ssh", "-p", str(vm.port), "-i", str(factory.client_key.private_path), "-o", "BatchMode=yes",
                   "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={root / 'known_hosts'}",
                   "-o", "LogLevel=ERROR"]
            target = f"{vm.user}@127.0.0.1"
            remote = f"{vm.home}/byhand"
            back = root / "back"

            def touch(i: int) -> None:
                (work / "module_0.py").write_text(f"VALUE = {i}\n")

            def by_hand(i: int) -> float:
                touch(i)
                started = time.perf_counter()
                e = shlex.join(ssh)
                subprocess.run(["rsync", "-a", "-e", e, f"{work}/", f"{target}:{remote}/"], check=True)
                subprocess.run([*ssh, target, f"cd {shlex.quote(remote)} && {JOB}"], check=True)
                subprocess.run(["rsync", "-a", "-e", e, f"{target}:{remote}/out/", f"{back}/"], check=True)
                return time.perf_counter() - started

            cli = [sys.executable, "-m", "cloudtrain"]
            runs = str(root / "runs")
            timed([*cli, "up", str(recipe)], env, root)

            def warm(i: int) -> float:
                touch(i)
                return timed([*cli, "run", str(recipe), "--keep", "--runs-dir", runs], env, root)

            def cold(i: int) -> float:
                touch(i)
                return timed([*cli, "run", str(recipe), "--cluster", f"cold-{i}", "--down", "--runs-dir", runs],
                             env, root)

            by_hand(-1)  # warm the page cache and sshd
            results = {}
            for name, action in (("by hand", by_hand), ("warm", warm), ("cold", cold)):
                results[name] = statistics.median(action(i) for i in range(args.repeat))
            timed([*cli, "down", "loop"], env, root)
        finally:
            factory.close()

    base = results["by hand"]
    print(f"{'what':<10} {'median':>8}  ratio  target")
    for name, seconds in results.items():
        ratio = seconds / base
        target = TARGETS.get(name)
        mark = "" if target is None else f"<= {target}x {'ok' if ratio <= target else 'MISSED'}"
        print(f"{name:<10} {seconds:7.2f}s  {ratio:4.2f}x  {mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
