"""Steady-state training throughput: the bundled job vs. the canonical Keras workflow, in one run.

Baseline: the Keras "simple MNIST convnet" recipe - the same model as the job (built by the job's own
build_model), compiled with Adam and trained with `model.fit` on numpy arrays, batch 128.
Candidate: `python -m cloudtrain.jobs.mnist_cnn --data bundled --batch-size 128` with its placement
logging on (the default), i.e. the custom distributed training loop the CLI ships to VMs.
Both see the same images (the job's bundled training split) and run in fresh processes, alternating,
so neither inherits the other's warm caches. Steady state excludes the first epoch of each run.

    python benchmarks/train_throughput.py [--epochs 6] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cloudtrain.jobs import mnist_cnn  # noqa: E402  (numpy only; TensorFlow is imported lazily)

BATCH = 128


def baseline(epochs: int) -> dict[str, Any]:
    """Runs in its own process: Keras model.fit on numpy arrays, timed per epoch by a callback."""
    import keras

    data = mnist_cnn.load_data("bundled", 0.1, ROOT / "cloudtrain" / "jobs", print)
    x, y = data.x_train.astype("float32"), data.y_train  # the canonical recipe feeds float arrays
    keras.utils.set_random_seed(0)
    model = mnist_cnn.build_model(keras)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            times.append(time.perf_counter() - self.t0)

    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[EpochTimer()])
    steady = times[1:]
    return {"images_per_sec": len(x) * len(steady) / sum(steady), "epoch_times_s": times, "num_train": len(x)}


def run_baseline(epochs: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--_baseline", "--epochs", str(epochs)],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_job(epochs: int, *extra: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "cloudtrain.jobs.mnist_cnn", "--output", tmp, "--data", "bundled",
                        "--epochs", str(epochs), "--batch-size", str(BATCH), *extra],
                       check=True, capture_output=True, text=True, cwd=ROOT)
        metrics = json.loads((Path(tmp) / "metrics.json").read_text())
        placement = json.loads((Path(tmp) / "device_placement.json").read_text())
    return {"images_per_sec": metrics["images_per_sec"], "epoch_times_s": metrics["epoch_times_s"],
            "num_train": metrics["num_train"], "placement_ops": placement.get("ops_total", 0),
            "test_accuracy": metrics["test_accuracy"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--also-without-placement-log", action="store_true",
                   help="also time the job with --no-placement-log, to show the log costs no steady-state time")
    p.add_argument("--_baseline", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._baseline:
        print(json.dumps(baseline(args.epochs)))
        return 0
    base, job, nolog = [], [], []
    for i in range(args.repeats):
        base.append(run_baseline(args.epochs))
        job.append(run_job(args.epochs))
        if args.also_without_placement_log:
            nolog.append(run_job(args.epochs, "--no-placement-log"))
        print(f"round {i + 1}: keras fit {base[-1]['images_per_sec']:.0f} images/s, "
              f"job {job[-1]['images_per_sec']:.0f} images/s"
              + (f", job without placement log {nolog[-1]['images_per_sec']:.0f}" if nolog else ""), flush=True)
    b = statistics.median(r["images_per_sec"] for r in base)
    j = statistics.median(r["images_per_sec"] for r in job)
    print(f"data: bundled training split, {job[0]['num_train']} images; batch {BATCH}; {args.epochs} epochs, "
          f"first excluded; median of {args.repeats}")
    print(f"keras model.fit (baseline):            {b:8.0f} images/s")
    print(f"cloudtrain job, placement log on:       {j:8.0f} images/s "
          f"({job[0]['placement_ops']} placements logged)")
    if nolog:
        print(f"cloudtrain job, placement log off:      "
              f"{statistics.median(r['images_per_sec'] for r in nolog):8.0f} images/s")
    print(f"ratio job/baseline:                     {j / b:8.2f}  (target >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
