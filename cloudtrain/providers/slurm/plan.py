"""What `cloudtrain plan` says for a Slurm recipe: where the one batch job would queue, with which
sbatch options, and what it could cost (a configured price per GPU-hour, or $0, said plainly)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cloudtrain.providers.slurm.batch import sbatch_options, time_minutes

if TYPE_CHECKING:
    from cloudtrain.providers.scheduling import ScheduledRecipe


def plan_document(recipe: ScheduledRecipe) -> dict[str, Any]:
    res = recipe.resources
    settings = res.slurm
    login = res.hosts[0] if res.hosts else None
    minutes = time_minutes(recipe)
    gpus = res.accelerator_count * recipe.num_nodes
    price = settings.gpu_hour_usd if settings is not None else None
    worst = None
    if price is not None and minutes is not None:
        worst = round(price * gpus * minutes / 60, 6)
    return {
        "cloud": res.cloud,
        "login": None if login is None else f"{login.user + '@' if login.user else ''}{login.address}:{login.port}",
        "nodes": recipe.num_nodes,
        "partition": settings.partition if settings is not None else None,
        "sbatch": sbatch_options(recipe),
        "time_limit_minutes": minutes,
        "gpus": gpus,
        "gpu_hour_usd": price,
        "worst_case_usd": worst,
    }


def plan_lines(recipe: ScheduledRecipe) -> list[str]:
    doc = plan_document(recipe)
    where = f"partition {doc['partition']}" if doc["partition"] else "the cluster's default partition"
    lines = [f"plan: one Slurm batch job, {doc['nodes']} node(s) on {where}, submitted from {doc['login']}",
             f"sbatch {' '.join(doc['sbatch'])}"]
    minutes = doc["time_limit_minutes"]
    lines.append(f"time limit: {minutes} min" if minutes is not None
                 else "time limit: the partition's (set budget.max_hours or resources.slurm.time_minutes)")
    if doc["gpu_hour_usd"] is None:
        lines.append("cost: $0: cloudtrain bills nothing on your own cluster (resources.slurm.gpu_hour_usd "
                     "prices a GPU-hour for this estimate)")
    elif doc["worst_case_usd"] is None:
        lines.append(f"cost: {doc['gpus']} GPU(s) at ${doc['gpu_hour_usd']:g}/GPU-hour; no time limit, so no worst "
                     "case (`cloudtrain cost` counts on-prem time as $0)")
    else:
        lines.append(f"cost: at most ${doc['worst_case_usd']:.2f} ({doc['gpus']} GPU(s) x {minutes} min at "
                     f"${doc['gpu_hour_usd']:g}/GPU-hour; `cloudtrain cost` counts on-prem time as $0)")
    return lines
