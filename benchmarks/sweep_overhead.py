"""The sweep scheduler's own cost per trial, on a simulated 500-trial sweep (no VM, no training).

Three runs of the same world (cloudtrain/sweep/sim.py: random boot, setup, training, collect and
release times, a controlled clock), each timing only the CLI side, i.e. `Scheduler.step` with
everything it calls:
  core        the scheduler alone (a seeded stand-in sampler, an in-memory journal)
  optuna      + Optuna TPE with its study in a journal file, as `cloudtrain sweep` runs it
  full        + the scheduler's journal in the SQLite state database (what the CLI really does)
Baseline: Optuna's own ask + tell per trial on the same storage (what any Optuna loop pays).
A fourth line times Optuna's SQLite storage, the alternative we did not pick.
Also checked: with a budget that fits every trial, no more VMs boot than max_parallel (warm reuse).

    .venv/bin/python benchmarks/sweep_overhead.py [--trials 500] [--parallel 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloudtrain.sweep.model import Costs, Limits
from cloudtrain.sweep.sim import Scenario, SeededSampler, simulate

BUDGET_MS = 20.0


def sweep_spec(trials: int):
    from cloudtrain.recipe import Sweep

    return Sweep.model_validate({
        "method": "tpe", "max_trials": trials, "budget_usd": 1e6, "metric": "test_accuracy", "goal": "max",
        "parameters": {"lr": {"loguniform": [1e-4, 1e-1]}, "batch_size": [32, 64, 128, 256],
                       "dropout": {"uniform": [0.0, 0.5]}},
        "early_stopping": {"method": "hyperband"}, "seed": 0,
    })


def run(label: str, trials: int, parallel: int, sampler: object | None, journal: object | None) -> dict:
    costs = Costs(budget_usd=1e6, hourly_usd=0.526, boot_s=600, prep_s=300, deadline_s=1800, post_s=120,
                  release_s=120)
    limits = Limits(max_trials=trials, max_parallel=parallel, max_retries=1)
    scenario = Scenario(seed=1, job=(120, 1500), epochs=5, fail_p=0.02)
    t0 = time.perf_counter()
    report = simulate(costs, limits, scenario, sampler=sampler, journal=journal)
    wall = time.perf_counter() - t0
    steps = report.step_seconds
    per_trial_ms = 1000 * sum(steps) / trials
    return {"label": label, "per_trial_ms": per_trial_ms, "steps": len(steps),
            "p99_step_ms": 1000 * sorted(steps)[int(0.99 * (len(steps) - 1))], "wall_s": wall,
            "booted": report.booted, "trials": len(report.scheduler.trials),
            "succeeded": sum(1 for t in report.scheduler.trials.values() if t.state == "succeeded"),
            "spent": report.world.spent_usd(), "reported": report.world.reported_usd(),
            "violations": report.world.violations}


def optuna_baseline(trials: int, storage: object | None) -> float:
    """Optuna alone: ask + report 5 epochs + tell, per trial, in ms."""
    from cloudtrain.sweep.space import OptunaSampler

    sampler = OptunaSampler(sweep_spec(trials), storage, "baseline", max_epochs=5)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for _ in range(trials):
        number, _params = sampler.ask()  # type: ignore[misc]
        for epoch in range(1, 6):
            sampler.report(number, epoch, 0.1 * epoch)
        sampler.tell(number, "succeeded", 0.5)  # type: ignore[arg-type]
    return 1000 * (time.perf_counter() - t0) / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    from cloudtrain.state import StateStore, SweepRecord
    from cloudtrain.sweep.space import OptunaSampler
    from cloudtrain.sweep.store import StoreJournal

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        rows = [run("core", args.trials, args.parallel, SeededSampler(1), None)]
        rows.append(run("optuna", args.trials, args.parallel,
                        OptunaSampler(sweep_spec(args.trials), tmpdir / "a.journal", "a", max_epochs=5), None))
        store = StateStore(tmpdir / "state.db")
        store.insert_sweep(SweepRecord(id="bench", name="bench", recipe_path="-", recipe_digest="-", status="running",
                                       pid=None, results_dir=tmp, spec="{}", created_at=0, updated_at=0))
        rows.append(run("full", args.trials, args.parallel,
                        OptunaSampler(sweep_spec(args.trials), tmpdir / "b.journal", "b", max_epochs=5),
                        StoreJournal(store, "bench")))
        baseline = optuna_baseline(args.trials, tmpdir / "c.journal")
        sqlite_trials = min(args.trials, 100)
        t0 = time.perf_counter()
        sqlite_ms = _sqlite_baseline(sqlite_trials, tmpdir)
        sqlite_total_s = time.perf_counter() - t0

    print(f"simulated sweep: {args.trials} trials, max_parallel {args.parallel}, 5 epochs each, 2% failures")
    print(f"{'run':8} {'ms/trial':>9} {'p99 step ms':>12} {'steps':>6} {'VMs':>4} {'ok':>4} {'wall s':>7}")
    for r in rows:
        print(f"{r['label']:8} {r['per_trial_ms']:9.3f} {r['p99_step_ms']:12.3f} {r['steps']:6d} {r['booted']:4d} "
              f"{r['succeeded']:4d} {r['wall_s']:7.2f}")
        assert not r["violations"], r["violations"]
    full = rows[-1]["per_trial_ms"]
    print(f"baseline: Optuna ask + 5 reports + tell alone (journal file): {baseline:.3f} ms/trial")
    print(f"cloudtrain full / Optuna alone: {full / baseline:.2f}x; scheduler without Optuna: "
          f"{rows[0]['per_trial_ms']:.3f} ms/trial")
    print(f"(Optuna with its SQLite storage instead: {sqlite_ms:.1f} ms/trial over {sqlite_trials} trials; "
          f"{sqlite_total_s:.1f} s in all with creating its schema)")
    booted_ok = all(r["booted"] <= args.parallel for r in rows)
    print(f"VMs booted <= max_parallel ({args.parallel}) with warm reuse: {'yes' if booted_ok else 'NO'}")
    print(f"overhead <= {BUDGET_MS:g} ms/trial: {'yes' if full <= BUDGET_MS else 'NO'} ({full:.2f} ms)")
    # The reported spend is the ledger's (cloudtrain/sweep/ledger.py over what the backend observed).
    worst = max(abs(r["reported"] - r["spent"]) / max(r["spent"], 1e-12) for r in rows)
    print(f"reported spend vs ground truth: {100 * worst:.3f}% at most (${rows[0]['spent']:.2f} spent in the core run)")


def _sqlite_baseline(trials: int, tmpdir: Path) -> float:
    import optuna

    from cloudtrain.sweep.space import distributions

    sweep = sweep_spec(trials)
    study = optuna.create_study(storage=f"sqlite:///{tmpdir / 'optuna.db'}", study_name="sqlite",
                                sampler=optuna.samplers.TPESampler(seed=0),
                                pruner=optuna.pruners.HyperbandPruner(max_resource=5), direction="maximize")
    dists = distributions(sweep)
    t0 = time.perf_counter()
    for _ in range(trials):
        trial = study.ask(dists)
        for epoch in range(1, 6):
            trial.report(0.1 * epoch, epoch)
            trial.should_prune()
        study.tell(trial.number, 0.5)
    return 1000 * (time.perf_counter() - t0) / trials


if __name__ == "__main__":
    main()
