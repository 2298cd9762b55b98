"""What a scheduler (base.Schedules: Slurm) reads of a recipe, as Protocols, so that providers sit
below the recipe that names them: cloudtrain.recipe.Recipe is a ScheduledRecipe as it is
(tests/test_architecture.py keeps providers from importing recipe/ through the no-circle rule)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class LoginHost(Protocol):
    address: str
    user: str | None
    port: int


class Limits(Protocol):
    max_hours: float | None


class ScheduledResources(Protocol):
    cloud: str
    hosts: Sequence[LoginHost] | None
    # The scheduler's own section of the recipe (providers/slurm/settings.SlurmSettings), read only by
    # that scheduler's package.
    slurm: Any

    @property
    def accelerator_count(self) -> int: ...


class ScheduledRecipe(Protocol):
    num_nodes: int
    resources: ScheduledResources
    budget: Limits | None
    job: object | None  # the bundled job, if the recipe runs it
