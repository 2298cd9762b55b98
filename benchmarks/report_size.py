"""`cloudtrain report` on 10,000 runs: render time (median of 3, after one warm-up) and file size,
from the test fixture state (tests/report/fixture.py) in a scratch home.

Targets (issue 40): <= 2 s and <= 5 MB. Prints both; exits 1 when either is missed.

    .venv/bin/python benchmarks/report_size.py [--runs 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ct-report-bench-") as scratch:
        os.environ["CLOUDTRAIN_HOME"] = str(Path(scratch) / "home")
        from cloudtrain.report import write_report
        from cloudtrain.state import StateStore
        from tests.report.fixture import build

        store = StateStore()
        started = time.perf_counter()
        build(store, Path(scratch) / "runs", time.time(), extra_runs=args.runs)
        print(f"fixture: {args.runs + 5:,} runs in {time.perf_counter() - started:.1f} s")
        out = Path(scratch) / "report.html"
        write_report(store, out, 0.0, time.time())  # warm-up: imports, the OS's file cache
        times = []
        for _ in range(3):
            started = time.perf_counter()
            write_report(store, out, 0.0, time.time())
            times.append(time.perf_counter() - started)
        size = out.stat().st_size
        median = statistics.median(times)
        print(f"render: median {median:.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}), target <= 2 s")
        print(f"size: {size / 1e6:.2f} MB, target <= 5 MB")
        store.close()
    return 0 if median <= 2.0 and size <= 5_000_000 else 1


if __name__ == "__main__":
    sys.exit(main())
