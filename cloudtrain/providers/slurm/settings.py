"""The recipe's `resources.slurm` block: where and how the batch job is queued.

The login node is the recipe's one `hosts` entry; nodes are `num_nodes` and GPUs per node
`resources.accelerators` (`--gres=gpu:N`); `budget.max_hours` and `time_minutes` (the smaller wins)
become `--time`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from cloudtrain.config import StrictModel

# What sbatch accepts as a partition, account or QOS name (no spaces, no shell or option syntax).
_SLURM_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"


class SlurmSettings(StrictModel):
    partition: str | None = Field(default=None, description="sbatch --partition (default: the cluster's default)",
                                  pattern=_SLURM_NAME)
    account: str | None = Field(default=None, description="sbatch --account", pattern=_SLURM_NAME)
    qos: str | None = Field(default=None, description="sbatch --qos", pattern=_SLURM_NAME)
    time_minutes: Annotated[int, Field(ge=1, description="sbatch --time, in minutes (budget.max_hours too: "
                                                         "the smaller wins)")] | None = None
    gpu_hour_usd: Annotated[float, Field(ge=0, description="what a GPU-hour costs you on this cluster, for `plan`'s "
                                                           "estimate (cloudtrain bills on-prem time as $0)")] | None = None
    cpus_per_node: Annotated[int, Field(ge=1, description="sbatch --cpus-per-task (one task per node)")] | None = None

    @field_validator("partition", "account", "qos", mode="before")
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        # `partition: ${CT_SLURM_PARTITION:-}` with the variable unset: the cluster's default.
        return None if value == "" else value

    @field_validator("partition", "account", "qos")
    @classmethod
    def _no_option(cls, value: str | None) -> str | None:
        # A leading '-' would read as another sbatch option (the pattern refuses it as well).
        if value is not None and value.startswith("-"):
            raise ValueError(f"expected a Slurm name, got {value!r}")
        return value
