"""Limits that hold (issue 39.4): `policy: {max_idle_minutes, max_hours}` in the config, floors that a
recipe or `cloudtrain autostop` cannot lift. Each refusal is one line naming the policy, its value
and where it comes from (exit 2, UsageError).

    max_idle_minutes  a recipe's autostop.idle_minutes may not be larger; a recipe that turns
                      autostop off (`autostop: false`) and `cloudtrain autostop --cancel` are refused;
                      `cloudtrain autostop -i MIN` may not set more
    max_hours         a recipe's budget.max_hours may not be larger, and a recipe must set one (a
                      missing budget has no limit at all)

They bind recipes on clouds that bill (a recipe on this machine or on given hosts spends nothing).
Sweeps are not bound here: their trials' VMs live under the sweep's lease and budget_usd.

Where the policy comes from is `effective_policy(config, store)`: today the config's `policy:`.
Team mode (a shared PostgreSQL state, docs/teams.md) puts the team's floor there, set by its admins:
the seam is that one function, which its callers already hand the store they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudtrain.errors import UsageError

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.recipe import Recipe
    from cloudtrain.state import StateStore


@dataclass(frozen=True)
class Policy:
    max_idle_minutes: int | None = None
    max_hours: float | None = None
    source: str = "config"  # where it was set, for the refusal's line ("config", later "team <name>")

    @property
    def empty(self) -> bool:
        return self.max_idle_minutes is None and self.max_hours is None


def effective_policy(config: Config, store: StateStore | None = None) -> Policy:
    """The floors in force. `store`: where a team's floor will be read from (team mode: the shared
    state's, which wins over the config's where it is lower); this machine's SQLite state holds none."""
    del store  # the seam for team mode (docs/teams.md): no table holds a team's policy yet
    return Policy(config.policy.max_idle_minutes, config.policy.max_hours, "config")


def _name(policy: Policy, key: str) -> str:
    return f"policy {key} {getattr(policy, key):g} ({policy.source})"


def recipe_refusal(recipe: Recipe, policy: Policy) -> tuple[str, str, str] | None:
    """The first field of `recipe` that would lift `policy`: (field, message, hint), or None."""
    from cloudtrain.providers import ANY, available, traits

    cloud = recipe.resources.cloud
    priced = cloud == ANY or (cloud in available() and traits(cloud).priced)
    if policy.empty or recipe.sweep is not None or not priced:
        return None
    if policy.max_idle_minutes is not None:
        limit = policy.max_idle_minutes
        if recipe.autostop is None:
            return ("autostop", f"autostop: false turns autostop off, which {_name(policy, 'max_idle_minutes')} "
                                "does not allow", f"set `autostop: {{idle_minutes: {limit}}}` or less")
        if recipe.autostop.idle_minutes > limit:
            return ("autostop.idle_minutes", f"{recipe.autostop.idle_minutes} is more than "
                                             f"{_name(policy, 'max_idle_minutes')}", f"at most {limit}")
    if policy.max_hours is not None:
        hours = recipe.budget.max_hours if recipe.budget is not None else None
        if hours is None:
            return ("budget", f"no budget.max_hours, which {_name(policy, 'max_hours')} requires",
                    f"add `budget: {{max_hours: {policy.max_hours:g}}}` or less")
        if hours > policy.max_hours:
            return ("budget.max_hours", f"{hours:g} is more than {_name(policy, 'max_hours')}",
                    f"at most {policy.max_hours:g}")
    return None


def check_autostop(name: str, idle_minutes: int | None, cancel: bool, policy: Policy) -> None:
    """`cloudtrain autostop NAME [-i MIN | --cancel]` under `policy`: UsageError when it would lift it."""
    limit = policy.max_idle_minutes
    if limit is None:
        return
    if cancel:
        raise UsageError(f"autostop --cancel: {_name(policy, 'max_idle_minutes')} does not allow turning "
                         f"autostop off", hint=f"`cloudtrain autostop {name} -i {limit}` (or less)")
    if idle_minutes is not None and idle_minutes > limit:
        raise UsageError(f"autostop -i {idle_minutes}: more than {_name(policy, 'max_idle_minutes')}",
                         hint=f"`cloudtrain autostop {name} -i {limit}` (or less)")
