"""`plan`: where a recipe would run, at what price, and what it can cost at most. Creates nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cloudtrain.cli import output

if TYPE_CHECKING:
    from cloudtrain.plan import Plan
    from cloudtrain.recipe import Recipe


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--alternatives", "-n", default=5, show_default=True, type=click.IntRange(min=0),
              help="How many fallbacks to show.")
def plan(recipe_path: str, as_json: bool, alternatives: int) -> None:
    """Show the placement RECIPE would launch (cheapest fitting offer among clouds with working
    credentials), the fallbacks failover would walk, and the worst-case cost from the budget."""
    from cloudtrain.cluster.planning import catalog_only_plan, plan_with_credentials
    from cloudtrain.config import load_config
    from cloudtrain.errors import CredentialsError
    from cloudtrain.preflight import preflight
    from cloudtrain.recipe import load_recipe

    loaded = load_recipe(recipe_path, defer_paths=True)
    # The config only: opening the state store would create state.db, and `plan` creates nothing.
    config = load_config()
    static = preflight(loaded, config)
    if static is None:
        from cloudtrain.providers import provider_class
        from cloudtrain.providers.base import Schedules, supports

        # A scheduler's plan (Slurm): where its one batch job would queue, with what options.
        scheduler = provider_class(loaded.recipe.resources.cloud)
        if supports(scheduler, Schedules):
            if as_json:
                output.print_json(scheduler.plan_document(loaded.recipe))
            else:
                for line in scheduler.plan_lines(loaded.recipe):
                    output.info(line)
            return
        output.info(f"{recipe_path}: cloud {loaded.recipe.resources.cloud} costs nothing; nothing to plan")
        return
    try:
        usable = plan_with_credentials(loaded.recipe, config)
    except CredentialsError as exc:
        # Nothing can launch, but the user asked what it would cost: show the catalog's answer (when
        # there is one) before the refusal, so pricing a recipe does not wait on a cloud login.
        unlaunchable = catalog_only_plan(loaded.recipe, config)
        if unlaunchable is not None and as_json:
            # One document still (a program reads stdout); the exit code and stderr say it cannot launch.
            output.print_json({**_document(unlaunchable), **_autostop_doc(loaded.recipe), "catalog_only": True, "skipped": [],
                               "error": exc.one_line()})
        elif unlaunchable is not None:
            output.info("catalog only: no credentials work for these clouds, so nothing here can launch yet")
            _render(unlaunchable, alternatives)
            output.info(autostop_line(loaded.recipe))
        raise
    p = usable.plan
    if as_json:
        from cloudtrain.buckets.egress import egress_for

        output.print_json({**_document(p), **_autostop_doc(loaded.recipe), "catalog_only": False,
                           "team_budgets": [u.as_json() for u in _budgets_left(config, warn=False)],
                           "skipped": [{"cloud": c, "why": w} for c, w in usable.skipped],
                           "egress": [{**e.__dict__, "usd": e.usd}
                                      for e in egress_for(loaded.recipe, p.best.cloud, p.best.region)]})
        return
    for cloud, why in usable.skipped:
        output.warn(f"skipping {cloud}: {why} (see `cloudtrain check {cloud}`)")
    _render(p, alternatives)
    output.info(autostop_line(loaded.recipe))
    _budget_lines(loaded.recipe, p, config)
    from cloudtrain.buckets.egress import egress_for
    from cloudtrain.providers.base import SaysVmIdentity, supports

    for crossing in egress_for(loaded.recipe, p.best.cloud, p.best.region):
        output.warn(crossing.line())
    cheapest = min(p.candidates, key=lambda c: c.hourly_price)
    if cheapest.hourly_price < p.best.hourly_price:
        # The planner counted the data's transfer (plan._rank): say why a dearer hour won.
        moved = sum(e.usd or 0.0 for e in egress_for(loaded.recipe, cheapest.cloud, cheapest.region))
        output.info(f"next to the data: {cheapest.describe()} is cheaper per hour, but copying the data there "
                    f"costs about ${moved:.2f}")
    # What a VM could do with its own credentials, where the provider says (its watchdog deletes it
    # under autostop.down or a sweep's lease; only then does it need an identity).
    recipe = loaded.recipe
    deletes = bool(recipe.autostop is not None and recipe.autostop.down) or recipe.sweep is not None
    buckets = any(m.is_bucket for m in recipe.data) or recipe.upload is not None
    for cloud in dict.fromkeys(c.cloud for c in p.candidates):
        provider = usable.providers.get(cloud)
        if supports(provider, SaysVmIdentity):
            output.info(f"{cloud} VMs run as: {provider.vm_identity(deletes, buckets)}")  # type: ignore[union-attr]


def autostop_line(recipe: Recipe) -> str:
    """What stops an idle node, said before anything exists (the default included: it is not the user's choice)."""
    stop = recipe.autostop
    if stop is None:
        return "autostop: off (`autostop: false`): an idle node bills until you stop it or its budget ends"
    action = "delete" if stop.down else "stop"
    # Every signal the watchdog will weigh, so that nobody learns of one from a stopped VM.
    busy = {"jobs_and_ssh": "a job or an SSH session", "jobs": "a job", "none": "nothing"}[stop.wait_for]
    armed = [f"busy while {busy} runs" if stop.wait_for != "none" else "nothing counts as busy"]
    if stop.gpu_util_below is not None:
        armed.append(f"a job with every GPU under {stop.gpu_util_below:g}% is idle")
    if stop.delete_after_stopped_days is not None:
        armed.append(f"deleted {stop.delete_after_stopped_days} day(s) after the stop (`cloudtrain gc --expired`)")
    if recipe.autostop_is_default:
        armed.append("the default for priced clusters: `autostop: false` for none")
    return f"autostop: {action} after {stop.idle_minutes} min idle ({'; '.join(armed)})"


def _autostop_doc(recipe: Recipe) -> dict:
    stop = recipe.autostop
    return {"autostop": stop.model_dump() if stop is not None else None, "autostop_default": recipe.autostop_is_default}


def _document(p: Plan) -> dict:
    return {"best": p.best.__dict__, "candidates": [c.__dict__ for c in p.candidates], "num_nodes": p.num_nodes,
            "hourly_usd": p.hourly_cost, "worst_hourly_usd": p.worst_hourly_cost, "worst_case_usd": p.estimated_cost,
            "affordable_hours": p.affordable_hours,
            # Relaunches after a lost node (recipe `recover:`, docs/recovery.md); null: none.
            "max_restarts": p.max_restarts,
            # What failover may not do (more GPUs per node) or what the budget's minimum left out.
            "notes": list(p.notes)}


def _render(p: Plan, alternatives: int) -> None:
    rows = [(i + 1, c.cloud, c.region, c.zone or "-", c.instance_type, c.accelerators or "-",
             "spot" if c.spot else "on-demand", f"${c.hourly_price:.4g}", f"${c.hourly_price * p.num_nodes:.4g}")
            for i, c in enumerate(p.candidates[: alternatives + 1])]
    output.info(f"plan: {p.summary()}")
    output.table(["#", "CLOUD", "REGION", "ZONE", "TYPE", "GPU", "MARKET", "$/H/NODE", "$/H"], rows)
    more = len(p.candidates) - len(rows)
    if more > 0:
        output.info(f"... and {more} more placement(s)")
    for note in p.notes:
        output.info(note)
    if p.estimated_cost is not None:
        output.info(f"worst case: ${p.estimated_cost:.2f} ({_worst_why(p)})")
    elif p.affordable_hours is not None:
        output.info(f"budget ${p.max_usd:g} lasts {p.affordable_hours:.1f} h at ${p.hourly_cost:.4g}/h")
    else:
        output.info("no budget set: nothing bounds the cost but you (set budget.max_hours or budget.max_usd)")


def _worst_why(p: Plan) -> str:
    """What the worst case is made of: the budget's hours at the dearest placement failover may use."""
    assert p.max_hours is not None and p.estimated_cost is not None
    if p.max_usd is not None and p.estimated_cost >= p.max_usd:
        return f"budget.max_usd ${p.max_usd:g}, enforced on the machine"
    if len(p.candidates) == 1 or p.worst_hourly_cost == p.hourly_cost:
        return f"{p.max_hours:g} h budget at ${p.hourly_cost:.4g}/h"
    return (f"{p.max_hours:g} h budget at up to ${p.worst_hourly_cost:.4g}/h: the dearest of the "
            f"{len(p.candidates)} placements failover may use; ${p.hourly_cost:.4g}/h at the first")


def _budgets_left(config, warn: bool = True) -> list:  # noqa: ANN001 - Config; list of BudgetUse
    """The team budgets covering this member's and project's launches, with what is left of each.
    Only a state that exists is read: `plan` creates nothing (no state.db)."""
    from cloudtrain import paths
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.providers.base import owner_id
    from cloudtrain.state.location import state_url

    if state_url() is None and not paths.state_db().exists():
        return []
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import covering

    try:
        store = StateStore()
        try:
            return covering(store, owner_id(config))[2]
        finally:
            store.close()
    except CloudtrainError as exc:
        if warn:
            output.warn(f"team budgets not shown: {exc.one_line()}")
        return []


def _budget_lines(recipe: Recipe, p: Plan, config) -> None:  # noqa: ANN001 - Config
    """What is left of each team budget covering this launch, and whether its worst case fits."""
    from cloudtrain.budget import budget_limit
    from cloudtrain.cluster.holds import worst_case_usd
    from cloudtrain.state.budgets import usd

    uses = _budgets_left(config)
    if not uses:
        return
    best = p.best
    limit = budget_limit(recipe.budget, best.hourly_price * p.num_nodes)
    worst = worst_case_usd(best.cloud, best.hourly_price, p.num_nodes, limit[0] if limit else None,
                           recipe.resources.disk_gb)
    for use in uses:
        line = (f"{use.budget.describe()}: {usd(use.left)} left this month of {usd(use.budget.monthly_usd)} "
                f"({usd(use.spent)} spent, {usd(use.held)} held by live clusters)")
        if worst is None:
            output.warn(line + "; this recipe has no budget, so nothing bounds its cost and a launch would be refused")
        elif worst > 0 and round(worst, 4) > round(use.left, 4):
            output.warn(line + f"; a launch holds its worst case {usd(worst)} and would be refused")
        else:
            output.info(line + (f"; a launch holds up to {usd(worst)} of it" if worst > 0 else ""))
