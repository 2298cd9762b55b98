"""A tiny training job: fit y = 3x + 1 by gradient descent, save the model and its metrics.

Pure Python, so it runs on any node with python3. Hyperparameters come from the environment
(the recipe's `envs`): EPOCHS, LR, SEED. Writes outputs/model.json and outputs/metrics.json,
and exits 1 if training diverged, so a bad learning rate fails the run.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path


def make_data(n: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(x, 3.0 * x + 1.0 + rng.gauss(0, 0.01)) for x in (rng.uniform(-1, 1) for _ in range(n))]


def train(epochs: int, lr: float, seed: int) -> dict[str, float]:
    data = make_data(200, seed)
    w, b = 0.0, 0.0
    loss = float("inf")
    for epoch in range(1, epochs + 1):
        grad_w = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        grad_b = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        w, b = w - lr * grad_w, b - lr * grad_b
        loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
        if not math.isfinite(loss) or loss > 1e6:
            break
        if epoch % 50 == 0 or epoch == epochs:
            print(f"epoch {epoch}: loss {loss:.6f}", flush=True)
    return {"w": w, "b": b, "final_loss": loss, "epochs": epochs, "lr": lr}


def main() -> int:
    result = train(int(os.environ.get("EPOCHS", "300")), float(os.environ.get("LR", "0.1")),
                   int(os.environ.get("SEED", "0")))
    out = Path("outputs")
    out.mkdir(exist_ok=True)
    (out / "model.json").write_text(json.dumps({"w": result["w"], "b": result["b"]}))
    (out / "metrics.json").write_text(json.dumps(result))
    if not math.isfinite(result["final_loss"]) or result["final_loss"] > 1.0:
        print(f"training diverged (loss {result['final_loss']})", flush=True)
        return 1
    print(f"model: y = {result['w']:.3f}x + {result['b']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
