"""The bundled job's quality with its defaults: test accuracy on the 1,000 held-out bundled digits
for several seeds, and the time each took, in one run.

CI trains one seed (tests/jobs/test_mnist_cnn.py::test_quality_with_the_defaults); this measures the
spread over seeds that the README quotes. Exits 1 if the mean is below 0.97.

    python benchmarks/cnn_quality.py [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = 0.97


def train(seed: int, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "cloudtrain.jobs.mnist_cnn", "--data", "bundled", "--seed", str(seed),
                           "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: the job failed ({proc.returncode}): {proc.stderr[-2000:]}")
    metrics: dict = json.loads((out / "metrics.json").read_text())
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    accuracies = []
    with tempfile.TemporaryDirectory(prefix="cnn-quality-") as tmp:
        for seed in args.seeds:
            m = train(seed, Path(tmp) / f"seed{seed}")
            accuracies.append(m["test_accuracy"])
            print(f"seed {seed}: test accuracy {m['test_accuracy']:.3f} on {m['num_test']} digits, "
                  f"trained in {m['train_time_s']:.1f} s ({m['images_per_sec']:.0f} images/s)", flush=True)
    mean = statistics.mean(accuracies)
    print(f"mean test accuracy over seeds {args.seeds}: {mean:.3f} (floor {FLOOR})")
    return 0 if mean >= FLOOR else 1


if __name__ == "__main__":
    sys.exit(main())
