"""`status` and `cost` with 1,000 clusters and 10,000 runs, on SQLite and on PostgreSQL, in one run.

The same rows are written to this machine's SQLite file and to a PostgreSQL database (a server of
its own, started as the tests start it: cloudtrain/testing/postgres.py, Debian's `postgresql`), then
each verb's cold start (the real CLI, a subprocess, as a user runs it) is timed 5 times, the two
engines taking turns so that a change in the machine's load hits both alike; the median is shown.
What a PostgreSQL verb pays on top (importing psycopg2) is measured on its own, and the date and
the machine's load are printed with the numbers: on a shared machine they move them a lot.

Goal (issue 37): PostgreSQL <= 1.5x SQLite, both <= 300 ms on the 2-core dev machine.
The latest numbers, and what they are made of, are in docs/teams.md ("Speed").

    .venv/bin/python benchmarks/team_state.py
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTERS, RUNS = 1000, 10_000


def fill(store: object) -> None:
    from cloudtrain.cluster.reconcile import BillingOp, Transition
    from cloudtrain.state import BillKind, ClusterStatus, NodeRecord, RunRecord, StateStore

    assert isinstance(store, StateStore)
    now = time.time()
    for i in range(CLUSTERS):
        name = f"c{i:04d}"
        store.upsert_cluster(name=name, provider="aws", status="provisioning", owner="bench", hourly_price=0.526,
                             instance_type="g4dn.xlarge", region="us-east-1", created_at=now - 86400 + i)
        uid = store.get_cluster(name).uid  # type: ignore[union-attr]
        node = NodeRecord(name, 0, f"i-{i:08x}", "terminated", None, None, "ubuntu", 22, None, None, now - 86400)
        store.apply(name, Transition(nodes=(node,), status=ClusterStatus.TERMINATED, events=(),
                                     billing=(BillingOp(True, node.instance_id, BillKind.RUNNING, now - 86400 + i,
                                                        0.526, 60.0),
                                              BillingOp(False, node.instance_id, BillKind.RUNNING, now - 80000 + i))),
                    uid, "aws")
    with store._write() as db:  # one transaction: the rows, not the writes, are under test
        for j in range(RUNS):
            run = RunRecord(f"r{j:05d}", f"c{j % CLUSTERS:04d}", "/r.yaml", "d", f"/runs/r{j}", "succeeded", 0, "aws",
                            "g4dn.xlarge", 0.526, 0.1, now - 80000 + j, now - 79000 + j)
            cols = ", ".join(run.__dataclass_fields__)
            db.execute(f"INSERT INTO runs ({cols}) VALUES ({', '.join('?' for _ in run.__dataclass_fields__)})",
                       [getattr(run, c) for c in run.__dataclass_fields__])


VERBS = (("status",), ("status", "--all-users"), ("cost",), ("cost", "--all-users"))
REPEATS = 5


def cold_start_s(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one `cloudtrain ARGS`. CPU (user + system, of the child) moves much
    less than wall time with the machine's load, so both are shown."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cloudtrain", *args], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_s(code: str) -> float:
    """Median wall time of a bare interpreter running `code` (the driver import's share)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    from cloudtrain.state import StateStore
    from cloudtrain.testing.postgres import PostgresServer, server_binaries

    bindir = server_binaries()
    if bindir is None:
        sys.exit("PostgreSQL server binaries not installed (apt-get install postgresql)")
    home = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    server = PostgresServer(bindir)
    try:
        server.start()
        url = server.url(server.initialized_database())
        env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
        env.pop("CLOUDTRAIN_STATE_URL", None)
        for where in (home / "state.db", url):
            store = StateStore(where)
            fill(store)
            store.close()
        engines = (("sqlite", env), ("postgres", {**env, "CLOUDTRAIN_STATE_URL": url}))
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs")
        print(f"before: {load()}")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(REPEATS):
            for verb in VERBS:
                for engine, engine_env in engines:
                    times.setdefault((engine, " ".join(verb)), []).append(cold_start_s(list(verb), engine_env))
        bare, driver = import_s("pass"), import_s("import psycopg2, psycopg2.extensions")
        print(f"after:  {load()}")
        print(f"{CLUSTERS} clusters, {RUNS} runs; median of {REPEATS} cold starts, the engines taking turns")
        print(f"{'':20} {'wall time':^25}  {'CPU time':^25}")
        print(f"{'verb':20} {'sqlite':>8} {'postgres':>9} {'ratio':>6}  {'sqlite':>8} {'postgres':>9} {'ratio':>6}  "
              "goal (wall: pg <= 1.5x, both <= 300 ms)")
        for verb in VERBS:
            name = " ".join(verb)
            row = []
            for column in (0, 1):
                lite = statistics.median(t[column] for t in times[("sqlite", name)])
                pg = statistics.median(t[column] for t in times[("postgres", name)])
                row.append((lite, pg))
            (lite, pg), (lite_cpu, pg_cpu) = row
            met = pg <= 1.5 * lite and max(lite, pg) <= 0.3
            print(f"{name:20} {lite * 1000:6.0f}ms {pg * 1000:7.0f}ms {pg / lite:6.2f}  {lite_cpu * 1000:6.0f}ms "
                  f"{pg_cpu * 1000:7.0f}ms {pg_cpu / lite_cpu:6.2f}  {'met' if met else 'not met'}")
        print(f"importing psycopg2: {(driver - bare) * 1000:.0f} ms (a bare interpreter: {bare * 1000:.0f} ms)")
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
