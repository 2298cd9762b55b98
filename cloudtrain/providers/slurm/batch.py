"""The one batch job a run becomes on Slurm: sbatch options from the recipe, and the script the
login node runs (templates/slurm_submit.sh, with templates/slurm_task.sh for every node)."""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

from cloudtrain import paths
from cloudtrain.providers.slurm.states import shell_reasons, shell_table

if TYPE_CHECKING:
    from cloudtrain.providers.scheduling import ScheduledRecipe


def time_minutes(recipe: ScheduledRecipe) -> int | None:
    """`--time` in whole minutes (Slurm's unit): the smaller of slurm.time_minutes and budget.max_hours."""
    limits = []
    settings = recipe.resources.slurm
    if settings is not None and settings.time_minutes is not None:
        limits.append(settings.time_minutes)
    if recipe.budget is not None and recipe.budget.max_hours is not None:
        # Rounded up: a limit never cuts a job shorter than the budget says.
        limits.append(max(1, math.ceil(recipe.budget.max_hours * 60)))
    return min(limits) if limits else None


def sbatch_options(recipe: ScheduledRecipe) -> list[str]:
    """Where and how the job is queued: nodes, partition, account, qos, time, GPUs, CPUs."""
    options = [f"--nodes={recipe.num_nodes}"]
    settings = recipe.resources.slurm
    if settings is not None:
        options += [f"--{name}={value}" for name, value in
                    (("partition", settings.partition), ("account", settings.account), ("qos", settings.qos))
                    if value is not None]
        if settings.cpus_per_node is not None:
            options.append(f"--cpus-per-task={settings.cpus_per_node}")
    minutes = time_minutes(recipe)
    if minutes is not None:
        options.append(f"--time={minutes}")
    gpus = recipe.resources.accelerator_count
    if gpus:
        options.append(f"--gres=gpu:{gpus}")
    return options


def job_name(job_id: str) -> str:
    return f"cloudtrain-{job_id}"


def comment(owner: str, cluster: str) -> str:
    return f"cloudtrain:{owner}:{cluster}"


def submit_script(recipe: ScheduledRecipe, run: str, setup: str | None, job_id: str, owner: str, cluster: str) -> str:
    """The login node's script for one run: settings as shell variables, then the submit template."""
    templates = paths.templates_dir()
    settings = {
        "CT_NAME": job_name(job_id),
        "CT_COMMENT": comment(owner, cluster),
        "CT_EXITS": shell_table(),
        "CT_REASONS": shell_reasons(),
        "CT_TASK": (templates / "slurm_task.sh").read_text(),
        "CT_SETUP": setup or "",
        "CT_RUN": run,
    }
    # Read by the task on every node (sbatch passes the submitting environment on).
    exported = {
        "CT_GPUS_PER_NODE": str(recipe.resources.accelerator_count),
        "CT_TF_CONFIG": "1" if recipe.job is not None else "0",
    }
    header = [f"{name}={shlex.quote(value)}" for name, value in settings.items()]
    header += [f"export {name}={shlex.quote(value)}" for name, value in exported.items()]
    header.append(f"set -- {shlex.join(sbatch_options(recipe))}")
    return "\n".join(header) + "\n" + (templates / "slurm_submit.sh").read_text()
