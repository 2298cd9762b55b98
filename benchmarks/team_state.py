"""`status` and `cost` with 1,000 clusters and 10,000 runs, on SQLite and on PostgreSQL, in one run.

The same rows are written to this machine's SQLite file and to a PostgreSQL database (a server of
its own, started as the tests start it: cloudtrain/testing/postgres.py, Debian's `postgresql`), then
each verb's cold start is timed (median of 5), as a user runs it.

Goal (issue 37): PostgreSQL <= 1.5x SQLite, both <= 300 ms on the 2-core dev machine.

Measured 2026-11-28 on that machine while five other workers used it (so every number is high):
status 631 ms SQLite / 2536 ms PostgreSQL (4.0x), cost 2881 / 3112 ms (1.08x). Not met for
`status`: importing psycopg alone took ~1.0 s there (an empty-state `status` was 0.36 s on SQLite,
1.35 s on PostgreSQL; opening the store, i.e. connect + version check, another ~0.25 s); the
queries themselves take ~0.13 s in process on either engine. `cost` is dominated by its own work.

    .venv/bin/python benchmarks/team_state.py
"""

from __future__ import annotations

import os
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


def median_s(args: list[str], env: dict[str, str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cloudtrain", *args], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
        results = {}
        for engine, engine_env in (("sqlite", env), ("postgres", {**env, "CLOUDTRAIN_STATE_URL": url})):
            for verb in (["status"], ["cost"]):
                results[(engine, verb[0])] = median_s(verb, engine_env)
        print(f"{CLUSTERS} clusters, {RUNS} runs; median of 5 cold starts")
        print(f"{'verb':8} {'sqlite':>8} {'postgres':>9} {'ratio':>6}")
        for verb in ("status", "cost"):
            lite, pg = results[("sqlite", verb)], results[("postgres", verb)]
            print(f"{verb:8} {lite * 1000:6.0f}ms {pg * 1000:7.0f}ms {pg / lite:6.2f}")
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
