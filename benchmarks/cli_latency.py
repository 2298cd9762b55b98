"""CLI start-up latency: median of 10 cold starts of `cloudtrain --help` and of `cloudtrain status`
with 100 clusters in state, next to `python -c pass` (the floor) in the same run.

Targets on the 2-core dev machine: help <= 0.15 s, status <= 0.30 s.
Also checks that neither path imports a cloud SDK, TensorFlow or paramiko.

    .venv/bin/python benchmarks/cli_latency.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("tensorflow", "boto3", "botocore", "google.cloud", "azure", "paramiko", "pydantic", "rich", "numpy")


def median_seconds(argv: list[str], env: dict[str, str], runs: int = 10) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def imported_modules(args: list[str], env: dict[str, str]) -> set[str]:
    code = (
        "import sys\nfrom cloudtrain.cli.main import main\n"
        f"sys.argv = ['cloudtrain', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return set(proc.stderr.split())


def main() -> None:
    home = tempfile.mkdtemp(prefix="ct-bench-")
    env = {**os.environ, "CLOUDTRAIN_HOME": home}
    from cloudtrain.state import StateStore  # noqa: E402  (after env is ready)

    os.environ["CLOUDTRAIN_HOME"] = home
    store = StateStore()
    for i in range(100):
        store.upsert_cluster(name=f"cluster-{i:03d}", provider="aws", status="up", owner="bench",
                             instance_type="g4dn.xlarge", hourly_price=0.526)
    store.close()

    exe = os.path.join(os.path.dirname(sys.executable), "cloudtrain")
    floor = median_seconds([sys.executable, "-c", "pass"], env)
    help_s = median_seconds([exe, "--help"], env)
    status_s = median_seconds([exe, "status"], env)
    print(f"python -c pass          {floor * 1000:7.1f} ms")
    print(f"cloudtrain --help       {help_s * 1000:7.1f} ms  (target <= 150 ms; {help_s / floor:.1f}x python)")
    print(f"cloudtrain status (100) {status_s * 1000:7.1f} ms  (target <= 300 ms; {status_s / floor:.1f}x python)")
    print("reference, SkyPilot 0.14.1 on this machine: help 1.66 s, status 2.1-2.7 s")
    print(f"ratio vs SkyPilot: help {1.66 / help_s:.1f}x faster, status {2.1 / status_s:.1f}x faster")
    for label, args in (("--help", ["--help"]), ("status", ["status"])):
        heavy = sorted(m for m in imported_modules(args, env) if m.split(".")[0] in {h.split(".")[0] for h in HEAVY})
        print(f"heavy imports on {label}: {', '.join(heavy) if heavy else 'none'}")


if __name__ == "__main__":
    main()
