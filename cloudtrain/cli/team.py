"""`team`: a team's shared state database (docs/teams.md): prepare it, migrate it, its budgets and
policies."""

from __future__ import annotations

import click

from cloudtrain.cli import output


def _team_url() -> str:
    from cloudtrain.errors import UsageError
    from cloudtrain.state.location import ENV, state_url

    url = state_url()
    if url is None:
        raise UsageError("no team database is configured: this machine keeps its own state",
                         hint=f"set state_url: postgresql://user@host/dbname in the config, or ${ENV} (docs/teams.md)")
    return url


@click.group("team")
def team() -> None:
    """A team's shared state database (state_url): init, migrate, budget, policy."""


@team.command("init")
def init() -> None:
    """Prepare an empty database for cloudtrain and print the grants a member needs."""
    from cloudtrain.state import pg
    from cloudtrain.state.team import grants, migrate

    url = _team_url()
    done = migrate(url, init=True)
    where = pg.display(url)
    if done.applied and done.before == 0:
        output.info(f"{where}: cloudtrain schema v{done.after} created")
    elif done.applied:
        output.info(f"{where}: migrated v{done.before} -> v{done.after}")
    else:
        output.info(f"{where}: already at schema v{done.after}, nothing to do")
    output.info("grants for team members (run once as the admin who ran init; docs/teams.md):")
    output.echo(grants(url))


@team.command("migrate")
def migrate_() -> None:
    """Bring the team database's schema up to this cloudtrain's (one transaction per step)."""
    from cloudtrain.state import pg
    from cloudtrain.state.team import grants, migrate

    url = _team_url()
    done = migrate(url)
    where = pg.display(url)
    if done.applied:
        output.info(f"{where}: migrated v{done.before} -> v{done.after} ({len(done.applied)} step(s))")
    else:
        output.info(f"{where}: already at schema v{done.after}, nothing to do")
    # A step (or Optuna's tables, made here too) may add tables members cannot use until granted.
    output.info("grants for team members (run them again after a migrate: new tables need them; docs/teams.md):")
    output.echo(grants(url))


@team.group("budget", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def budget(ctx: click.Context, as_json: bool) -> None:
    """Monthly budgets every launch holds its worst case against: show them (spent this month,
    held by live clusters, left), or `set` / `unset` one. On SQLite too: one laptop, a team of one."""
    if ctx.invoked_subcommand is not None:
        return
    import time

    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import EVERY, month_start, usage

    store = StateStore()
    now = time.time()
    uses = usage(store, _owner(), now)
    if as_json:
        from cloudtrain.cluster.spend import iso

        output.print_json({"month_from": month_start(now), "month_from_iso": iso(month_start(now)), "at": now,
                           "budgets": [u.as_json() for u in uses]})
        return
    if not uses:
        output.info("no team budgets: launches are bounded by their recipes' budgets only "
                    "(`cloudtrain team budget set --monthly-usd N` sets one)")
        return
    output.table(["MEMBER", "PROJECT", "MONTHLY", "SPENT", "HELD", "LEFT"],
                 [("every member" if u.budget.member == EVERY else u.budget.member,
                   "every project" if u.budget.project == EVERY else u.budget.project,
                   output.money(u.budget.monthly_usd), output.money(u.spent), output.money(u.held),
                   output.money(u.left)) for u in uses])
    output.info("spent: the ledger since the 1st of this month (UTC); held: what live clusters may still "
                "spend at most")


@budget.command("set")
@click.option("--monthly-usd", type=click.FloatRange(min=0), required=True, help="The cap, in USD per month.")
@click.option("--project", default=None, help="Only launches of this project (default: every project).")
@click.option("--user", "member", default=None,
              help="Only this member's launches (the database role; on SQLite the config's owner). Default: everyone.")
def budget_set(monthly_usd: float, project: str | None, member: str | None) -> None:
    """Set (or replace) the monthly budget of a member, a project, both, or the whole team."""
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import set_budget, usd, who

    _check_project(project)
    store = StateStore()
    done = set_budget(store, monthly_usd, member, project, by=who(store, _owner()))
    output.info(f"{done.describe()}: {usd(done.monthly_usd)} a month; every launch it covers holds its worst case "
                "against it")


@budget.command("unset")
@click.option("--project", default=None, help="The budget of this project.")
@click.option("--user", "member", default=None, help="The budget of this member.")
def budget_unset(project: str | None, member: str | None) -> None:
    """Remove a budget (the one with exactly this --project and --user)."""
    from cloudtrain.errors import UsageError
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import EVERY, Budget, unset_budget

    store = StateStore()
    described = Budget(member or EVERY, project or EVERY, 0.0).describe()
    if not unset_budget(store, member, project):
        raise UsageError(f"there is no {described.replace('the ', '', 1)} to unset",
                         hint="`cloudtrain team budget` lists them")
    output.info(f"{described}: removed")


@team.group("policy", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def policy(ctx: click.Context, as_json: bool) -> None:
    """The team's floors (max_idle_minutes, max_hours) that no member's recipe and no `cloudtrain
    autostop` lifts: show them and what binds you, or `set` / `unset` one (the admin). A team
    database only: on this machine's own state the floor is the config's `policy:`."""
    if ctx.invoked_subcommand is not None:
        return
    from cloudtrain.config import load_config
    from cloudtrain.policy import effective_policy
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import project
    from cloudtrain.state.policies import list_policies

    store = StateStore()
    rows = list_policies(store)
    mine = effective_policy(load_config(), store)
    if as_json:
        output.print_json({"policies": [r.as_json() for r in rows], "project": project(), "in_force": mine.as_json()})
        return
    if rows:
        output.table(["PROJECT", "MAX IDLE MINUTES", "MAX HOURS", "SET BY", "SET AT (UTC)"],
                     [("every project" if r.project is None else r.project,
                       "-" if r.max_idle_minutes is None else str(r.max_idle_minutes),
                       "-" if r.max_hours is None else f"{r.max_hours:g}", r.set_by, r.set_at_iso)
                      for r in rows])
    else:
        output.info("no team policy (`cloudtrain team policy set --max-idle-minutes N --max-hours H` sets one)")
    held = [f"{k} {getattr(mine, k):g} ({getattr(mine, f'{k}_from')})" for k in ("max_idle_minutes", "max_hours")
            if getattr(mine, k) is not None]
    output.info(f"in force for you (project {project()}): " + (", ".join(held) if held else "nothing"))


@policy.command("set")
@click.option("--max-idle-minutes", type=click.IntRange(min=1), default=None, metavar="N",
              help="A recipe's autostop.idle_minutes and `autostop -i` at most N; autostop off is refused.")
@click.option("--max-hours", type=click.FloatRange(min=0, min_open=True), default=None, metavar="H",
              help="A recipe's budget.max_hours at most H, and every recipe on a billing cloud must set one.")
@click.option("--project", default=None, help="Only members of this project (default: every project).")
def policy_set(max_idle_minutes: int | None, max_hours: float | None, project: str | None) -> None:
    """Set a floor of the team (or of one project); a key not given keeps its value."""
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import who
    from cloudtrain.state.policies import set_policy

    _check_project(project)
    store = StateStore()
    done = set_policy(store, max_idle_minutes=max_idle_minutes, max_hours=max_hours, project=project,
                      by=who(store, _owner()))
    output.info(f"{done.describe()}: {done.floors()}; no member's recipe or `cloudtrain autostop` lifts it")


@policy.command("unset")
@click.option("--project", default=None, help="The policy of this project (default: the every-project one).")
def policy_unset(project: str | None) -> None:
    """Remove a floor (the one with exactly this --project)."""
    from cloudtrain.errors import UsageError
    from cloudtrain.state import StateStore
    from cloudtrain.state.policies import unset_policy

    _check_project(project)
    store = StateStore()
    described = "the team's policy" if project is None else f"project {project}'s policy"
    if not unset_policy(store, project):
        raise UsageError("there is no team policy for " + ("every project" if project is None else f"project {project}")
                         + " to unset", hint="`cloudtrain team policy` lists them")
    output.info(f"{described}: removed")


def _owner() -> str:
    from cloudtrain.providers.base import owner_id

    return owner_id()


def _check_project(project: str | None) -> None:
    import re

    from cloudtrain.errors import UsageError
    from cloudtrain.state.location import PROJECT_PATTERN

    if project is not None and not re.match(PROJECT_PATTERN, project):
        raise UsageError(f"--project {project!r}: expected lowercase letters, digits, - or _ (at most 63)")
