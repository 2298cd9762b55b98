"""A state for the report, made through the state API and the ledger's own reconcile (as a verb's
observations would make it): clusters on three clouds and two owners, runs with run directories
and metrics.json (two of the bundled job, on CPU and on GPU), and a sweep with its VMs billed.

Also used by benchmarks/report_size.py (10,000 runs) and for docs/img/report.png.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.cluster.reconcile import Observation, Pricing, Source, reconcile
from cloudtrain.cost import billing_minimum_s, disk_hourly
from cloudtrain.providers.base import Instance
from cloudtrain.providers.base import InstanceState as S
from cloudtrain.state import ClusterStatus, RunRecord, StateStore, SweepRecord, SweepTrialRow, SweepVmRow
from cloudtrain.sweep.model import Costs, Limits
from cloudtrain.sweep.spec import SweepSpec

H = 3600.0
SWEEP_ID = "sw1234"


@dataclass(frozen=True)
class Fixture:
    now: float
    runs_dir: Path
    running_usd_h: float  # what bills now, per hour (the clusters still up or stopped)


def cluster(store: StateStore, name: str, cloud: str, hourly: float, owner: str, nodes: int = 1,
            at: float = 0.0, recipe: str | None = None) -> None:
    store.upsert_cluster(name=name, provider=cloud, status=ClusterStatus.PROVISIONING, num_nodes=nodes,
                         hourly_price=hourly * nodes, owner=owner, created_at=at, instance_type=f"{cloud}-gpu-1",
                         recipe_path=recipe)


def observe(store: StateStore, name: str, states: dict[str, S], at: float) -> None:
    """What a verb would feed the ledger at `at`: observations, reconciled and applied."""
    record = store.get_cluster(name)
    assert record is not None and record.uid is not None
    cloud = record.provider
    pricing = Pricing(running=record.hourly_price / record.num_nodes, disk=disk_hourly(cloud),
                      min_s=billing_minimum_s(cloud))
    observations = [Observation(Instance(i, name, s), at, Source.VERB) for i, s in states.items()]
    t = reconcile(record, store.get_nodes(name), store.open_billing(record.uid), observations, pricing,
                  complete=True, launch_done=True, at=at)
    store.apply(name, t, record.uid, cloud)


def _run_dir(runs_dir: Path, run_id: str, metrics: dict, record: dict) -> Path:
    path = runs_dir / run_id
    (path / "outputs").mkdir(parents=True)
    (path / "outputs" / "metrics.json").write_text(json.dumps(metrics))
    (path / "run.json").write_text(json.dumps(record))
    return path


def _run(store: StateStore, runs_dir: Path, run_id: str, cluster_name: str, cloud: str, start: float, end: float,
         cost: float, metrics: dict, status: str = "succeeded") -> None:
    path = _run_dir(runs_dir, run_id, metrics, {"run_id": run_id, "status": status, "cost_usd": cost,
                                                "hourly_price_usd": cost / max((end - start) / H, 1e-9),
                                                "wall_time_s": end - start})
    store.insert_run(RunRecord(id=run_id, cluster=cluster_name, recipe_path=None, recipe_digest=None,
                               run_dir=str(path), status=status, exit_code=0 if status == "succeeded" else 1,
                               provider=cloud, instance_type=None, hourly_price=cost / max((end - start) / H, 1e-9),
                               cost_usd=cost, started_at=start, ended_at=end))


def bundled_metrics(gpu: bool) -> dict:
    """What the bundled job writes to metrics.json (cloudtrain/jobs/mnist_cnn.py), CPU or one GPU."""
    return {"device": "GPU" if gpu else "CPU", "gpu_names": ["NVIDIA L4"] if gpu else [], "strategy": "default",
            "replicas": 1, "global_batch_size": 128, "epochs": 2, "epoch_times_s": [9.0, 8.0] if gpu else [61.0, 60.0],
            "sec_per_batch": 0.019 if gpu else 0.13, "images_per_sec": 6700.0 if gpu else 980.0,
            "test_accuracy": 0.9891 if gpu else 0.9887, "wall_time_s": 31.0 if gpu else 125.0,
            "train_time_s": 17.0 if gpu else 121.0}


def build(store: StateStore, runs_dir: Path, now: float, extra_runs: int = 0) -> Fixture:
    """Everything relative to `now`: three days of history and something billing at `now`."""
    day0 = now - 3 * 86400
    # Ana's cluster: an hour two days ago, then down (its row gone, its ledger kept).
    cluster(store, "train-a", "aws", 1.2, "ana", at=day0)
    observe(store, "train-a", {"i-a1": S.RUNNING}, day0 + 2 * H)
    observe(store, "train-a", {"i-a1": S.TERMINATED}, day0 + 3 * H)
    store.delete_cluster("train-a")
    # Ben's GCE cluster: two nodes, running since yesterday.
    cluster(store, "gpu-b", "gcp", 0.9, "ben", nodes=2, at=now - 30 * H)
    observe(store, "gpu-b", {"b-0": S.RUNNING, "b-1": S.RUNNING}, now - 26 * H)
    # Ana's Azure cluster: ran 3 h, stopped since (its disk still bills).
    cluster(store, "big-c", "azure", 3.4, "ana", at=now - 52 * H)
    observe(store, "big-c", {"c-0": S.RUNNING}, now - 50 * H)
    observe(store, "big-c", {"c-0": S.STOPPED}, now - 47 * H)
    store.set_cluster_status("big-c", ClusterStatus.STOPPED)
    # Runs: two of the bundled job (CPU, GPU), two of a user's script, one that failed.
    _run(store, runs_dir, "run-cpu", "local", "local", day0 + H, day0 + H + 125, 0.0, bundled_metrics(False))
    _run(store, runs_dir, "run-gpu", "train-a", "aws", day0 + 2 * H, day0 + 2 * H + 31, 0.0103, bundled_metrics(True))
    _run(store, runs_dir, "run-tune-1", "gpu-b", "gcp", now - 20 * H, now - 19 * H, 1.8,
         {"val_loss": 0.31, "val_accuracy": 0.902, "epochs": 10})
    _run(store, runs_dir, "run-tune-2", "gpu-b", "gcp", now - 10 * H, now - 8 * H, 3.6,
         {"val_loss": 0.27, "val_accuracy": 0.915, "epochs": 20})
    _run(store, runs_dir, "run-bad", "big-c", "azure", now - 50 * H, now - 49.5 * H, 1.7, {}, status="failed")
    rng = random.Random(7)
    for k in range(extra_runs):
        start = day0 + rng.uniform(0, 3 * 86400 - 2 * H)
        _run(store, runs_dir, f"run-{k:05d}", "gpu-b", "gcp", start, start + rng.uniform(60, H),
             round(rng.uniform(0.01, 2), 4), {"val_loss": round(rng.uniform(0.2, 0.6), 4),
                                              "val_accuracy": round(rng.uniform(0.8, 0.95), 4)})
    _sweep(store, runs_dir, now)
    return Fixture(now, runs_dir, 2 * 0.9 + 2 * disk_hourly("gcp") + disk_hourly("azure"))


def _sweep(store: StateStore, runs_dir: Path, now: float) -> None:
    start = now - 6 * H
    costs = Costs(budget_usd=5.0, hourly_usd=0.75, boot_s=120, prep_s=60, deadline_s=1800, post_s=60, release_s=60,
                  min_s=60)
    spec = SweepSpec(costs, Limits(max_trials=6, max_parallel=2), "random", "val_accuracy", "max", "val_accuracy",
                     ("lr", "batch_size"), ("lr",), None, False)
    store.insert_sweep(SweepRecord(id=SWEEP_ID, name="mnist-sweep", recipe_path="recipes/sweep.yaml",
                                   recipe_digest="d", status="done", pid=None, results_dir=str(runs_dir / "sweep"),
                                   spec=spec.to_json(), created_at=start, updated_at=now - 3 * H,
                                   ended_at=now - 3 * H, ended_reason="max_trials"))
    trials = [SweepTrialRow(SWEEP_ID, n, json.dumps({"lr": lr, "batch_size": bs}), "succeeded", 1, 0, value, None,
                            start + n * 600, start + n * 600 + 1500)
              for n, (lr, bs, value) in enumerate([(0.1, 64, 0.91), (0.01, 128, 0.955), (0.001, 64, 0.972),
                                                   (0.03, 256, 0.94), (0.003, 128, 0.968), (0.3, 64, 0.71)])]
    vms = [SweepVmRow(SWEEP_ID, f"v{slot}", slot, "gone", 0.75, start + slot * 60, start + 4 * H, start + 300,
                      None, start + (2.5 + slot * 0.5) * H, None, None, 3, None) for slot in (0, 1)]
    store.save_sweep_records(SWEEP_ID, trials, [], vms)
    for slot in (0, 1):
        name = f"sw-{SWEEP_ID}-{slot}"
        cluster(store, name, "aws", 0.75, "ana", at=start + slot * 60)
        observe(store, name, {f"i-sw{slot}": S.RUNNING}, start + slot * 60)
        observe(store, name, {f"i-sw{slot}": S.TERMINATED}, start + (2.5 + slot * 0.5) * H)
        store.delete_cluster(name)
