"""Where a recipe launches: the pure plan over the clouds whose credentials work right now.

`plan.make_plan` is pure; this adds the one thing it cannot know: which priced clouds are usable
(their credentials answer). A recipe naming a cloud fails at once without credentials; `cloud: any`
skips the clouds without them and names each one.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.config import Config
from cloudtrain.errors import CredentialsError, UsageError
from cloudtrain.plan import Plan
from cloudtrain.providers import ANY, available, get_provider, traits
from cloudtrain.providers.base import Provider
from cloudtrain.recipe import Recipe


@dataclass(frozen=True)
class UsablePlan:
    plan: Plan
    providers: dict[str, Provider]  # cloud -> provider, for every cloud in the plan's candidates
    skipped: tuple[tuple[str, str], ...]  # (cloud, why) for clouds left out


def priced_clouds() -> tuple[str, ...]:
    return tuple(c for c in available() if traits(c).priced)


def _allowed_clouds(recipe: Recipe) -> tuple[str, ...]:
    cloud = recipe.resources.cloud
    return priced_clouds() if cloud == ANY else (cloud,)


def plan_with_credentials(recipe: Recipe, config: Config) -> UsablePlan:
    """The plan over the clouds the recipe allows whose credentials work; raises when none does."""
    from cloudtrain.catalog import default_catalog
    from cloudtrain.plan import make_plan

    cloud = recipe.resources.cloud
    wanted = _allowed_clouds(recipe)
    providers: dict[str, Provider] = {}
    skipped: list[tuple[str, str]] = []
    for name in wanted:
        provider = get_provider(name, config)
        status = provider.check_credentials()
        if status.ok:
            providers[name] = provider
        else:
            skipped.append((name, status.detail))
    if not providers:
        detail = "; ".join(f"{name}: {why}" for name, why in skipped)
        raise CredentialsError(detail if cloud != ANY else f"no cloud has usable credentials ({detail})",
                               hint=f"see `cloudtrain check{'' if cloud == ANY else ' ' + cloud}`")
    only = next(iter(providers.values())) if len(providers) == 1 else None
    default_region = only.default_region if only is not None else None
    try:
        plan = make_plan(recipe, default_catalog(), list(providers), default_region=default_region)
    except UsageError as exc:
        if not skipped:
            raise
        raise _naming_skipped(exc, recipe, list(providers), skipped, default_region) from None
    return UsablePlan(plan, providers, tuple(skipped))


def catalog_only_plan(recipe: Recipe, config: Config) -> Plan | None:
    """The plan over every cloud the recipe allows, credentials or not; None when nothing fits.
    For showing what a recipe would cost before any login works; never for launching."""
    from cloudtrain.catalog import default_catalog
    from cloudtrain.plan import make_plan

    clouds = list(_allowed_clouds(recipe))
    default_region = get_provider(clouds[0], config).default_region if len(clouds) == 1 else None
    try:
        return make_plan(recipe, default_catalog(), clouds, default_region=default_region)
    except UsageError:
        return None


def _naming_skipped(error: UsageError, recipe: Recipe, usable: list[str], skipped: list[tuple[str, str]],
                    default_region: str | None) -> UsageError:
    """The planner's refusal over the usable clouds, naming the clouds it never saw. Without them
    "no region 'eastus'" or "at most A100:1" reads as a recipe mistake when the fix is a login."""
    from cloudtrain.catalog import default_catalog
    from cloudtrain.plan import make_plan, restate

    names = "; ".join(f"{cloud}: {why}" for cloud, why in skipped)
    message = f"{error.message}; skipped for their credentials: {names}"
    try:
        # Pure and cheap: would the skipped clouds have had a place for it?
        make_plan(recipe, default_catalog(), usable + [cloud for cloud, _ in skipped], default_region=default_region)
    except UsageError:
        return restate(error, message, error.hint)  # nowhere either: the recipe is what to change
    clouds = [cloud for cloud, _ in skipped]
    return restate(error, message, f"it fits on {'/'.join(clouds)}: fix the credentials (`cloudtrain check "
                                   f"{' '.join(clouds)}`)")
