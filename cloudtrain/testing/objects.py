"""The bucket fixtures' test datasets: many objects, each different, cheap to make (one shape for
S3, GCS and Azure Blob, so the three clouds' e2e tests copy the same data)."""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def put_dataset(put: Callable[[str, bytes], None], prefix: str, files: int, total_bytes: int, seed: int = 0,
                workers: int = 8) -> dict[str, int]:
    """`files` objects under `prefix` adding up to `total_bytes`, each a random 64-byte head on a
    zero body, stored with `put(key, body)` from `workers` threads (a failed put is raised here,
    not lost in its thread). Returns key -> size."""
    rng = random.Random(seed)
    base = total_bytes // files
    sizes = {f"{prefix}/part-{i // 100:03d}/f{i:05d}.bin": base + (total_bytes - base * files if i == 0 else 0)
             for i in range(files)}
    heads = {k: rng.randbytes(64) for k in sizes}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda k: put(k, heads[k] + bytes(sizes[k] - 64)), sizes))
    return sizes
