"""Node-side bucket download throughput: cloudtrain's copy (templates/bucket_copy.py, obstore) vs
`aws s3 cp --recursive` (the AWS CLI, the cloud's own tool), against the same moto S3 server, in
one run, with the ratio printed. Target: >= 1.0x (issue 28).

Two datasets, because object stores are slow per request and fast per byte: many small files
(where per-request overhead and concurrency decide) and fewer large ones (where bytes do). Each
tool copies each dataset into a fresh directory, alternately, `--repeat` times; medians reported.
Both run as subprocesses with the same user keys; moto serves from this process.

    .venv/bin/python benchmarks/bucket_copy.py [--small 2000] [--large 40] [--repeat 3]

Needs the AWS CLI (`pip install awscli`) and obstore (the [buckets] extra).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cloudtrain.testing.aws import FAKE_KEY_ID, FAKE_SECRET, MotoServer  # noqa: E402
from cloudtrain.testing.buckets import S3Authorizer, S3Buckets  # noqa: E402
from cloudtrain.testing.metadata import MetadataServer  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=2000, help="files of the small-file dataset (100 KB each)")
    parser.add_argument("--large", type=int, default=40, help="files of the large-file dataset (8 MB each)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    aws = shutil.which("aws") or str(Path(sys.executable).parent / "aws")
    if not Path(aws).exists():
        raise SystemExit("the AWS CLI is not installed: pip install awscli")
    server = MotoServer().start()
    metadata = MetadataServer().start()
    try:
        assert server.faults is not None
        buckets = S3Buckets(server, metadata, S3Authorizer(server.faults.app))
        buckets.create("bench-data")
        datasets = {
            "small": ("bench-data", "small", args.small, args.small * 100_000),
            "large": ("bench-data", "large", args.large, args.large * 8_000_000),
        }
        for bucket, prefix, files, total in datasets.values():
            buckets.fill(bucket, prefix, files=files, total_bytes=total)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
                    "AWS_DEFAULT_REGION": "us-east-1", "CLOUDTRAIN_S3_ENDPOINT": server.url,
                    "CLOUDTRAIN_BUCKET_IDENTITY": "configured"})
        copy = str(REPO / "templates" / "bucket_copy.py")
        print(f"moto S3 at {server.url}; {os.cpu_count()} cores; median of {args.repeat}")
        # `aws s3 cp` checks sizes only on download; cloudtrain's default also checks MD5 (costs CPU).
        print(f"{'dataset':8} {'files':>6} {'MB':>5} {'aws s3 cp':>11} {'ct sizes':>11} {'ratio':>6} "
              f"{'ct +MD5':>11} {'ratio':>6}")
        same, md5 = [], []
        for name, (bucket, prefix, files, total) in datasets.items():
            times: dict[str, list[float]] = {"aws": [], "size": [], "md5": []}
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as work:
                    url = f"s3://{bucket}/{prefix}"
                    times["aws"].append(timed([aws, "s3", "cp", "--recursive", "--quiet", "--endpoint-url",
                                               server.url, url, f"{work}/aws"], env))
                    for verify in ("size", "md5"):
                        times[verify].append(timed([sys.executable, copy, "get", url, f"{work}/{verify}", "--state",
                                                    f"{work}/{verify}.json"], {**env, "CLOUDTRAIN_BUCKET_VERIFY": verify}))
            t = {k: statistics.median(v) for k, v in times.items()}
            same.append(t["aws"] / t["size"])
            md5.append(t["aws"] / t["md5"])
            rate = {k: f"{total / 1e6 / v:6.1f} MB/s" for k, v in t.items()}
            print(f"{name:8} {files:>6} {total / 1e6:>5.0f} {rate['aws']:>11} {rate['size']:>11} {same[-1]:>5.2f}x "
                  f"{rate['md5']:>11} {md5[-1]:>5.2f}x")
        print(f"cloudtrain / aws s3 cp, same checks (sizes): {min(same):.2f}x at worst (target >= 1.0x); "
              f"with MD5 as well: {min(md5):.2f}x")
    finally:
        metadata.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
