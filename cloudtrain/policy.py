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

Where the policy comes from is `effective_policy(config, store)`: the config's `policy:`, and in
team mode (a shared PostgreSQL state, docs/teams.md) also the team's floor that its admins set
(`cloudtrain team policy set`, state/policies.py): per key the lower value holds, and the refusal
names where it was set ("(config)", "(team)", "(team, project vision)"). Reading the team's costs
one small query on the CLI's one connection (state/pg.py); on SQLite nothing is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import UsageError

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.recipe import Recipe
    from cloudtrain.state import StateStore
    from cloudtrain.state.policies import TeamPolicy

KEYS = ("max_idle_minutes", "max_hours")


@dataclass(frozen=True)
class Policy:
    max_idle_minutes: int | None = None
    max_hours: float | None = None
    # Where each value was set, for the refusal's line: "config", "team" or "team, project P".
    max_idle_minutes_from: str = "config"
    max_hours_from: str = "config"

    @property
    def empty(self) -> bool:
        return self.max_idle_minutes is None and self.max_hours is None

    def as_json(self) -> dict[str, Any]:
        """Each key's value and where it was set (None: no floor)."""
        return {k: None if getattr(self, k) is None else {"value": getattr(self, k),
                                                           "source": getattr(self, f"{k}_from")} for k in KEYS}


def effective_policy(config: Config, store: StateStore | None = None) -> Policy:
    """The floors in force: the config's, and on a team database the team's rows that cover this
    member's project (`store`'s, else the state the config names, opened on this process's one
    connection); per key the lowest value. On a tie the team's is named: editing the config
    would not lift it. This machine's SQLite state holds none."""
    values: dict[str, tuple[float | None, str]] = {k: (getattr(config.policy, k), "config") for k in KEYS}
    for row in _team_rows(store):  # the every-project row first: it is named on a tie with a project's
        for key in KEYS:
            mine, (held, source) = getattr(row, key), values[key]
            if mine is not None and (held is None or mine < held or (mine == held and source == "config")):
                values[key] = (mine, row.source)
    (idle, idle_from), (hours, hours_from) = values["max_idle_minutes"], values["max_hours"]
    return Policy(None if idle is None else int(idle), hours, idle_from, hours_from)


def _team_rows(store: StateStore | None) -> list[TeamPolicy]:
    if store is None:
        from cloudtrain.state.location import state_url

        # A caller without a store (preflight: validate, plan, up, run): only a team database is
        # opened, on this process's one connection (shared with any store it has open); never a
        # SQLite file, whose state holds no policy.
        url = state_url()
        if url is None:
            return []
        from cloudtrain.state import StateStore

        opened = StateStore(url)
        try:
            return _team_rows(opened)
        finally:
            opened.close()
    from cloudtrain.state.budgets import is_team, project
    from cloudtrain.state.policies import covering

    return covering(store, project()) if is_team(store) else []


def _name(policy: Policy, key: str) -> str:
    return f"policy {key} {getattr(policy, key):g} ({getattr(policy, f'{key}_from')})"


def binds(recipe: Recipe) -> bool:
    """Whether a policy can bind `recipe` at all (a billing cloud, not a sweep): where it cannot,
    callers need not read one (in team mode that is a database query)."""
    from cloudtrain.providers import ANY, available, traits

    cloud = recipe.resources.cloud
    priced = cloud == ANY or (cloud in available() and traits(cloud).priced)
    return priced and recipe.sweep is None


def recipe_refusal(recipe: Recipe, policy: Policy) -> tuple[str, str, str] | None:
    """The first field of `recipe` that would lift `policy`: (field, message, hint), or None."""
    if policy.empty or not binds(recipe):
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
