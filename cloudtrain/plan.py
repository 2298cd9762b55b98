"""From a recipe to where it runs and what it costs: a pure function over the catalog.

`make_plan` does no I/O and asks no cloud: it picks the cheapest catalog offer that fits the recipe's
resources and lists every other fitting placement after it, cheapest first, so the lifecycle can fail
over (next zone is the provider's job; next region or type is the lifecycle's, from this list).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from cloudtrain.catalog import PRICE_UNKNOWN, Catalog, Offer
from cloudtrain.errors import NotAvailableError, UsageError
from cloudtrain.recipe import Recipe
from cloudtrain.yamlfile import did_you_mean


def _free(cloud: str) -> bool:
    """Clouds whose machines already exist (or are this one): nothing to pick, nothing to pay."""
    from cloudtrain.providers import available, traits

    return cloud in available() and not traits(cloud).priced


def _image_pins_region(cloud: str, image: str) -> bool:
    from cloudtrain.providers import image_pins_region

    return image_pins_region(cloud, image)

_E = TypeVar("_E", bound=UsageError)


def _refusal(kind: type[_E], field: str, message: str, hint: str | None = None) -> _E:
    """A plan error that knows which recipe field it is about (`field`, dotted, e.g.
    "resources.region"), so a caller holding the YAML can point at the file and line."""
    error = kind(message, hint=hint)
    error.field = field  # type: ignore[attr-defined]
    return error


def refused_field(error: BaseException) -> str | None:
    """The recipe field a `make_plan` error is about, or None for errors from elsewhere."""
    return getattr(error, "field", None)


def restate(error: UsageError, message: str, hint: str | None) -> UsageError:
    """`error` (same type, same recipe field) with a new message and hint: for callers that know
    more than the pure planner did, e.g. which clouds it was not allowed to look at."""
    field = refused_field(error)
    if field is None:
        return type(error)(message, hint=hint)
    return _refusal(type(error), field, message, hint)


@dataclass(frozen=True)
class Placement:
    """One place the cluster could run: every node of the cluster in the same region (and zone)."""

    cloud: str
    region: str | None
    zone: str | None  # None: the provider tries the region's zones in order
    instance_type: str | None
    hourly_price: float  # USD per hour per node
    spot: bool
    accelerators: str | None = None  # e.g. "T4:1", per node
    vcpus: int | None = None
    memory_gib: float | None = None
    avoid_zones: tuple[str, ...] = ()  # set by run/recover.py: zones a preemption just ruled out
    # The catalog price's date (ISO) and, when it is undated or over STALE_AFTER_DAYS old, why the
    # plan line should not be read as today's price. Not part of a placement's identity.
    price_date: str | None = field(default=None, compare=False)
    price_flag: str | None = field(default=None, compare=False)

    def describe(self) -> str:
        where = "/".join(p for p in (self.cloud, self.zone or self.region) if p)
        if self.instance_type:
            what = self.instance_type
        else:
            from cloudtrain.providers import implements
            from cloudtrain.providers.base import GivenHosts

            what = "the listed hosts" if implements(self.cloud, GivenHosts) else "this machine"
        gpu = f" ({self.accelerators})" if self.accelerators else ""
        market = " spot" if self.spot else ""
        flag = f" ({self.price_flag})" if self.price_flag else ""
        return f"{what}{gpu}{market} in {where} at ${self.hourly_price:.4g}/h{flag}"


@dataclass(frozen=True)
class Plan:
    cloud: str
    num_nodes: int
    spot: bool
    candidates: tuple[Placement, ...]  # cheapest first; never empty
    max_usd: float | None = None
    max_hours: float | None = None
    # Relaunches after a lost node (recipe `recover:`, default on for spot); None: a lost node fails the run.
    max_restarts: int | None = None
    # What `plan` should say besides the table: what failover may not do (more GPUs per node than the
    # recipe asks for), or what the budget left out (placements whose first billed minimum is over it).
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> Placement:
        return self.candidates[0]

    @property
    def hourly_cost(self) -> float:
        """USD per hour for the whole cluster at the best placement."""
        return self.best.hourly_price * self.num_nodes

    @property
    def worst_hourly_cost(self) -> float:
        """USD per hour for the whole cluster at the dearest placement failover may move it to."""
        return max(c.hourly_price for c in self.candidates) * self.num_nodes

    @property
    def estimated_cost(self) -> float | None:
        """Worst case for the run when the budget bounds its duration: at the dearest placement the
        run may use (failover walks every candidate), never above budget.max_usd."""
        if self.max_hours is None:
            return None
        from cloudtrain.budget import billed_usd
        from cloudtrain.cost import billing_minimum_s

        # Each start is billed at least its cloud's minimum, also when max_hours is shorter.
        worst = max(billed_usd(c.hourly_price * self.num_nodes, self.max_hours * 3600.0, billing_minimum_s(c.cloud))
                    for c in self.candidates)
        return min(worst, self.max_usd) if self.max_usd is not None else worst

    @property
    def affordable_hours(self) -> float | None:
        """How long the budget lasts at the best placement (None: no money limit or free)."""
        if self.max_usd is None or self.hourly_cost == 0:
            return None
        return self.max_usd / self.hourly_cost

    def summary(self) -> str:
        line = self.best.describe()
        if self.num_nodes > 1:
            line = f"{self.num_nodes} x {line} = ${self.hourly_cost:.4g}/h"
        if self.estimated_cost is not None:
            line += f", at most ${self.estimated_cost:.2f} for {self.max_hours:g} h"
            if self.worst_hourly_cost > self.hourly_cost:
                line += f" (failover may reach ${self.worst_hourly_cost:.4g}/h)"
        if self.max_restarts:
            # Every attempt spends from the same budget: the worst case above covers them all.
            line += f"; recover: up to {self.max_restarts} relaunch(es) elsewhere if the node is lost"
        return line


def make_plan(
    recipe: Recipe,
    catalog: Catalog,
    clouds: Sequence[str],
    *,
    default_region: str | None = None,
) -> Plan:
    """Choose where `recipe` runs among `clouds` (the clouds this cloudtrain can use).

    `default_region` (the user's configured region) only breaks price ties, so equal prices
    prefer the region the user already works in.
    """
    res = recipe.resources
    budget = recipe.budget
    max_usd = budget.max_usd if budget else None
    max_hours = budget.max_hours if budget else None
    if _free(res.cloud):
        free = Placement(cloud=res.cloud, region=None, zone=None, instance_type=None, hourly_price=0.0, spot=False)
        return Plan(res.cloud, recipe.num_nodes, False, (free,), max_usd, max_hours)

    priced = [c for c in catalog.clouds() if c in clouds]
    if res.cloud == "any":
        if not priced:
            raise _refusal(
                NotAvailableError,
                "resources.cloud",
                "cloud any: none of the usable clouds has offers in the catalog",
                hint=f"usable: {', '.join(clouds) or 'none'}; run `cloudtrain check`",
            )
        targets = priced
    elif res.cloud not in clouds:
        raise _refusal(
            NotAvailableError,
            "resources.cloud",
            f"cloud {res.cloud!r} is not available yet in this cloudtrain",
            hint=f"available: {', '.join(clouds)}",
        )
    elif res.cloud not in priced:
        raise _refusal(NotAvailableError, "resources.cloud", f"no catalog of {res.cloud} offers yet",
                       hint="pick another cloud")
    else:
        targets = [res.cloud]

    if res.region is not None:
        _check_region(catalog, targets, res.region)
    offers, more = _kept_gpu_count(recipe, _fitting_offers(recipe, catalog, targets))
    if res.image and res.region is None and any(_image_pins_region(c, res.image) for c in targets):
        # e.g. AMI ids exist in one region only: failing over to another region could never use it.
        if default_region is None:
            raise _refusal(
                UsageError,
                "resources.image",
                f"resources.image {res.image} exists in one region only",
                hint="set resources.region too",
            )
        offers = [o for o in offers if o.region == default_region]
        if not offers:
            raise _refusal(
                NotAvailableError,
                "resources.image",
                f"resources.image {res.image} pins the plan to region {default_region}, where nothing fits",
                hint="set resources.region to the AMI's region",
            )
    placements = _placements(offers, res.zone, res.spot)
    if res.max_hourly_usd is not None:
        within = [p for p in placements if p.hourly_price <= res.max_hourly_usd]
        if not within:
            cheapest = min(placements, key=lambda p: p.hourly_price)
            raise _refusal(
                NotAvailableError,
                "resources.max_hourly_usd",
                f"resources.max_hourly_usd: nothing that fits costs ${res.max_hourly_usd:g}/h or less per node; "
                f"the cheapest is {cheapest.describe()}",
                hint="raise the limit, allow spot, or ask for less",
            )
        placements = within
    placements.sort(key=lambda p: _rank(recipe, p, max_hours, default_region))

    notes = list(_gpu_notes(recipe, placements, more))
    if max_usd is not None:
        placements, note = _within_minimum(recipe, placements, max_usd)
        notes.extend(note)
    if max_usd is not None and max_hours is not None:
        affordable = [p for p in placements if p.hourly_price * recipe.num_nodes * max_hours <= max_usd]
        if not affordable:
            cheapest = placements[0]
            cost = cheapest.hourly_price * recipe.num_nodes * max_hours
            nodes = f" x {recipe.num_nodes} nodes" if recipe.num_nodes > 1 else ""
            raise _refusal(
                UsageError,
                "budget.max_usd",
                f"budget: the cheapest fit, {cheapest.describe()}{nodes}, costs ${cost:.2f} for "
                f"{max_hours:g} h, over budget.max_usd ${max_usd:.2f}",
                hint="raise budget.max_usd, lower budget.max_hours or num_nodes"
                + ("" if res.spot else ", or set resources.spot: true"),
            )
        placements = affordable
    recovery = recipe.recovery
    return Plan(res.cloud, recipe.num_nodes, res.spot, tuple(placements), max_usd, max_hours,
                recovery.max_restarts if recovery is not None else None, tuple(notes))


def _within_minimum(recipe: Recipe, placements: list[Placement], max_usd: float) -> tuple[list[Placement], list[str]]:
    """The placements whose first billed minimum fits budget.max_usd (budget.minimum_fits: a start
    costs its cloud's minimum even if the machine goes a second later), and a note on what that
    left out. Raises the budget's one-line refusal when none fits."""
    from cloudtrain.budget import below_minimum, least_billed_usd, minimum_fits, usd

    nodes = recipe.num_nodes
    fits = [p for p in placements if minimum_fits(max_usd, p.cloud, p.hourly_price * nodes)]
    if not fits:
        cheapest = min(placements, key=lambda p: least_billed_usd(p.cloud, p.hourly_price * nodes))
        what = f"{cheapest.instance_type} on {cheapest.cloud}" + (f" x {nodes} nodes" if nodes > 1 else "")
        message, hint = below_minimum(max_usd, cheapest.cloud, what, cheapest.hourly_price * nodes)
        raise _refusal(UsageError, "budget.max_usd", message, hint=hint)
    if len(fits) == len(placements):
        return fits, []
    return fits, [f"budget: {len(placements) - len(fits)} placement(s) left out: one billed minimum there costs "
                  f"more than budget.max_usd {usd(max_usd)}"]


def _gpu_notes(recipe: Recipe, placements: Sequence[Placement], more: Sequence[Offer]) -> list[str]:
    """What `plan` says of the GPU count failover keeps: the offers with more GPUs per node it left
    out (`more`), or, where resources.allow_more_accelerators lets it, the dearest it may move to."""
    res = recipe.resources
    if res.accelerators is None or res.instance_type is not None:
        return []
    asked = f"{res.accelerator_name}:{res.accelerator_count}"
    if not res.allow_more_accelerators:
        if not more:
            return []
        cheapest = min(more, key=lambda o: o.hourly(res.spot) or 0.0)
        return [f"failover keeps {asked} per node: {len(more)} offer(s) with more GPUs (from {cheapest.instance_type}, "
                f"{cheapest.accelerators}, at ${cheapest.hourly(res.spot) or 0.0:.4g}/h) are left out; "
                "`resources.allow_more_accelerators: true` allows them"]
    bigger = [p for p in placements if _gpu_count(p.accelerators) > res.accelerator_count]
    if not bigger:
        return []
    dearest = max(bigger, key=lambda p: p.hourly_price)
    return [f"failover may move to more GPUs per node than {asked} (resources.allow_more_accelerators): "
            f"{len(bigger)} placement(s), up to {dearest.instance_type} ({dearest.accelerators}) at "
            f"${dearest.hourly_price:.4g}/h"]


def _kept_gpu_count(recipe: Recipe, offers: list[Offer]) -> tuple[list[Offer], list[Offer]]:
    """The offers with exactly the GPUs per node the recipe asks for, and those with more, left out:
    failover never moves a T4:1 run to a T4:4 type at several times the price unless the recipe
    says it may (resources.allow_more_accelerators). Raises when no offer has the count asked."""
    res = recipe.resources
    if res.accelerators is None or res.instance_type is not None or res.allow_more_accelerators:
        return offers, []
    count = res.accelerator_count
    exact = [o for o in offers if o.accelerator_count == count]
    more = [o for o in offers if o.accelerator_count > count]
    if not exact and more:
        market = "spot " if res.spot else ""
        nearest = min(more, key=lambda o: (o.accelerator_count, o.hourly(res.spot) or 0.0))
        raise _refusal(
            NotAvailableError,
            "resources.accelerators",
            f"resources.accelerators: no {market}offer has exactly {nearest.accelerator}:{count} per node; the nearest "
            f"is {nearest.instance_type} ({nearest.accelerators}) at ${nearest.hourly(res.spot) or 0.0:.4g}/h",
            hint=f"ask for {nearest.accelerators}, or set resources.allow_more_accelerators: true",
        )
    return exact, more


def _gpu_count(accelerators: str | None) -> int:
    if not accelerators:
        return 0
    _, _, count = accelerators.partition(":")
    return int(count or 1)


def _rank(recipe: Recipe, p: Placement, max_hours: float | None,
          default_region: str | None) -> tuple[float, int, bool, str, str, str]:
    """Cheapest first, where the data's transfer is part of the price: moving a bucket's data to
    another region or cloud is billed by the store's cloud (buckets/egress.py). With the run's
    length bounded (budget.max_hours) and the data's size known (data[].size_gb), a placement's
    price is its worst-case compute plus one full copy; otherwise the hourly price decides and a
    tie goes to the placement whose data crosses fewest regions, then to the user's region."""
    from cloudtrain.buckets.egress import egress_for

    crossings = egress_for(recipe, p.cloud, p.region)
    price = p.hourly_price
    if max_hours is not None:
        price = p.hourly_price * recipe.num_nodes * max_hours + sum(e.usd or 0.0 for e in crossings)
    return (round(price, 6), len(crossings), p.region != default_region, p.cloud, p.region or "",
            p.instance_type or "")


def _check_region(catalog: Catalog, clouds: Sequence[str], region: str) -> None:
    known = sorted({r for c in clouds for r in catalog.regions(c)})
    if region in known:
        return
    hint = did_you_mean(region, known)
    if hint:
        raise _refusal(UsageError, "resources.region", f"resources.region: {', '.join(clouds)} has no region {region!r}",
                       hint=hint)
    raise _refusal(
        NotAvailableError,
        "resources.region",
        f"resources.region: no price data for region {region!r}", hint=f"the catalog covers {', '.join(known)}"
    )


def _fitting_offers(recipe: Recipe, catalog: Catalog, clouds: Sequence[str]) -> list[Offer]:
    res = recipe.resources
    where = f" in {res.region}" if res.region else ""
    market = "spot " if res.spot else ""
    common = dict(cloud=clouds, region=res.region, zone=res.zone, spot=res.spot)

    if res.instance_type is not None:
        known = [t for c in clouds for t in catalog.instance_types(c)]
        if res.instance_type not in known:
            raise _refusal(
                UsageError,
                "resources.instance_type",
                f"resources.instance_type: {'/'.join(clouds)} instance type {res.instance_type!r} is not in the "
                "catalog cloudtrain knows",
                hint=did_you_mean(res.instance_type, known) or "`cloudtrain catalog` lists it; `cloudtrain catalog refresh` updates it",
            )
        offers = catalog.query(instance_type=res.instance_type, **common)  # type: ignore[arg-type]
        if not offers and catalog.unpriced(cloud=clouds, region=res.region, instance_type=res.instance_type):
            raise _refusal(NotAvailableError, "resources.instance_type",
                           f"{res.instance_type}{where}: {PRICE_UNKNOWN}",
                           hint="pick a type with a known price (`cloudtrain catalog`)")
        if not offers:
            raise _refusal(
                NotAvailableError,
                "resources.instance_type",
                f"no {market}offer of {res.instance_type}{where}",
                hint=_elsewhere(catalog.query(cloud=clouds, instance_type=res.instance_type, spot=res.spot)),
            )
        _check_type_fits(recipe, offers[0])
        return offers

    if res.accelerators is not None:
        name = res.accelerator_name or ""
        canonical = catalog.canonical_accelerator(name)
        if canonical is None:
            known_gpus = catalog.accelerator_names()
            raise _refusal(
                UsageError,
                "resources.accelerators",
                f"resources.accelerators: the catalog cloudtrain knows has no GPU called {name!r}",
                hint=_gpu_did_you_mean(name, known_gpus) or f"known GPUs: {', '.join(known_gpus)}",
            )
        count = res.accelerator_count
        anywhere = catalog.query(cloud=clouds, accelerator=canonical)
        unknown = catalog.unpriced(cloud=clouds, accelerator=canonical, min_accelerators=count)
        if not anywhere:
            others = sorted({o.cloud for o in catalog.query(accelerator=canonical)})
            if unknown:
                raise _refusal(
                    NotAvailableError, "resources.accelerators",
                    f"resources.accelerators: {canonical} on {'/'.join(dict.fromkeys(o.cloud for o in unknown))} "
                    f"({_types(unknown)}): {PRICE_UNKNOWN}",
                    hint=f"priced on {', '.join(others)}" if others else None,
                )
            raise _refusal(
                NotAvailableError,
                "resources.accelerators",
                f"resources.accelerators: the catalog cloudtrain knows has no {canonical} GPUs on {'/'.join(clouds)}",
                hint=(f"offered on {', '.join(others)}; " if others else "") + "`cloudtrain catalog refresh` updates it",
            )
        most = max(anywhere, key=lambda o: o.accelerator_count)
        if most.accelerator_count < count:
            if unknown:
                raise _refusal(
                    NotAvailableError, "resources.accelerators",
                    f"resources.accelerators: {canonical}:{count} on one node ({_types(unknown)}): {PRICE_UNKNOWN}",
                    hint=f"the most with a known price is {canonical}:{most.accelerator_count} ({most.instance_type}); "
                         "or use num_nodes",
                )
            raise _refusal(
                NotAvailableError,
                "resources.accelerators",
                f"resources.accelerators: the catalog cloudtrain knows has at most {canonical}:{most.accelerator_count} "
                f"on one node ({most.instance_type}), the recipe asks for {canonical}:{count}",
                hint="use num_nodes for more GPUs, or `cloudtrain catalog refresh`",
            )
        offers = catalog.query(
            accelerator=canonical,
            min_accelerators=count,
            min_vcpus=res.cpus or 0,
            min_memory_gib=res.memory or 0,
            **common,  # type: ignore[arg-type]
        )
        if not offers:
            raise _refusal(
                NotAvailableError,
                _sizes_field(recipe, "resources.accelerators"),
                f"no {market}offer with {canonical}:{count}{_sizes(recipe)}{where}",
                hint=_elsewhere(
                    catalog.query(
                        cloud=clouds, accelerator=canonical, min_accelerators=count, spot=res.spot,
                        min_vcpus=res.cpus or 0, min_memory_gib=res.memory or 0,
                    )
                ),
            )
        return offers

    # No GPU asked for: CPU-only types, so a recipe without accelerators never lands on a GPU bill.
    offers = catalog.query(
        cpu_only=True, min_vcpus=res.cpus or 0, min_memory_gib=res.memory or 0, **common  # type: ignore[arg-type]
    )
    if not offers:
        raise _refusal(NotAvailableError, _sizes_field(recipe, "resources"),
                       f"no {market}CPU offer{_sizes(recipe)}{where}", hint="lower resources.cpus/memory")
    return offers


def _gpu_did_you_mean(name: str, known: Sequence[str]) -> str | None:
    # GPU names are short ("T4", "A100"): one wrong character is a big edit ratio, so the cutoff
    # is lower than for field names, and the comparison ignores case.
    by_upper = {k.upper(): k for k in known}
    close = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=0.5)
    return f"did you mean {by_upper[close[0]]!r}?" if close else None


def _check_type_fits(recipe: Recipe, offer: Offer) -> None:
    res = recipe.resources
    if res.accelerators is not None:
        name = (res.accelerator_name or "").lower()
        if (offer.accelerator or "").lower() != name or offer.accelerator_count < res.accelerator_count:
            has = offer.accelerators or "no GPU"
            raise _refusal(
                UsageError,
                "resources.accelerators",
                f"resources.instance_type {offer.instance_type} has {has}, "
                f"resources.accelerators asks for {res.accelerators}",
                hint="drop one of the two, or make them agree",
            )
    if (res.cpus or 0) > offer.vcpus or (res.memory or 0) > offer.memory_gib:
        raise _refusal(
            UsageError,
            "resources.cpus" if (res.cpus or 0) > offer.vcpus else "resources.memory",
            f"resources.instance_type {offer.instance_type} has {offer.vcpus} vCPUs and {offer.memory_gib:g} GiB, "
            f"the recipe asks for{_sizes(recipe)}",
            hint="drop cpus/memory or pick a bigger instance_type",
        )


def _sizes(recipe: Recipe) -> str:
    res = recipe.resources
    parts = ([f"{res.cpus} vCPUs"] if res.cpus else []) + ([f"{res.memory:g} GiB"] if res.memory else [])
    if not parts:
        return ""
    return (" and " if res.accelerators else " with ") + ", ".join(parts)


def _sizes_field(recipe: Recipe, otherwise: str) -> str:
    """The field to blame when nothing fits: cpus, else memory, else region, else `otherwise`."""
    res = recipe.resources
    for name in ("cpus", "memory", "region"):
        if getattr(res, name):
            return f"resources.{name}"
    return otherwise


def _types(offers: Sequence[Offer]) -> str:
    """A few instance types, for a "price unknown" line."""
    names = list(dict.fromkeys(o.instance_type for o in offers))
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _price_flag(offer: Offer) -> str | None:
    """What the plan line says about a catalog price it should not be read as current."""
    import datetime as dt

    from cloudtrain.catalog import STALE_AFTER_DAYS

    if offer.price_date is None:
        return "undated price: `cloudtrain catalog refresh`"
    if offer.stale(dt.date.today()):
        return f"STALE price of {offer.price_date.isoformat()}, over {STALE_AFTER_DAYS} days old: `cloudtrain catalog refresh`"
    return None


def _elsewhere(offers: Sequence[Offer]) -> str | None:
    regions = sorted({o.region for o in offers})
    return f"offered in {', '.join(regions)}" if regions else None


def _placements(offers: Sequence[Offer], zone: str | None, spot: bool) -> list[Placement]:
    seen: dict[tuple[str, str, str | None, str], Placement] = {}
    for offer in offers:
        price = offer.hourly(spot)
        assert price is not None  # query() left out offers without a price for this market
        placement = Placement(
            cloud=offer.cloud,
            region=offer.region,
            zone=zone or offer.zone,
            instance_type=offer.instance_type,
            hourly_price=price,
            spot=spot,
            accelerators=offer.accelerators,
            vcpus=offer.vcpus,
            memory_gib=offer.memory_gib,
            price_date=offer.price_date.isoformat() if offer.price_date else None,
            price_flag=_price_flag(offer),
        )
        key = (offer.cloud, offer.region, placement.zone, offer.instance_type)
        # A zone-specific price row and the region's row can both match: keep the cheaper one.
        if key not in seen or price < seen[key].hourly_price:
            seen[key] = placement
    return list(seen.values())
