"""Every check that needs no cloud, made before anything exists.

`preflight(loaded, config)` is what `validate`, `up` and `run` call right after loading a recipe:
if it passes, the only ways left for the recipe to fail are things the world decides (credentials,
capacity, the network, the job itself). It makes no network call, writes no file, creates no key
and writes no state (in team mode a billing recipe's policy floors are read from the team
database); it imports neither cloud SDKs nor TensorFlow nor numpy.

Checks, in order, each raising one line with `file:line: field: what was expected` (exit code 2):
  1. the cloud exists in this cloudtrain (one without a provider is refused here, not after a run row);
  2. recipe fields the cloud cannot act on (autostop and budget where its machines cannot stop
     themselves, budget.max_usd on a free cloud; cloud-only fields on cloud local; a bucket whose
     store the cloud gives its machines no identity for, buckets/checks.py), then the config's
     `policy:` floors a recipe may not lift (cloudtrain/policy.py);
  3. the bundled job's parameters, against its declared schema (cloudtrain/jobs/params.py);
  4. for priced clouds, the catalog plan: instance type, region, GPU (with did-you-mean), sizes, AMI.
Data targets (relative, inside the workdir) are checked when the recipe loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cloudtrain.errors import CloudtrainError, NotAvailableError, RecipeError, UsageError
from cloudtrain.yamlfile import line_of

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.plan import Plan
    from cloudtrain.providers.base import Traits
    from cloudtrain.recipe import LoadedRecipe, Recipe

# Fields that only mean something for a cloud that creates machines.
CLOUD_ONLY_FIELDS = ("region", "zone", "instance_type", "accelerators", "image", "disk_gb")


def preflight(loaded: LoadedRecipe, config: Config) -> Plan | None:
    """Raise on the static problems of `loaded`: the paths load_recipe kept (`defer_paths`) with
    the first problem of the checks below, in one error of a line each; return the plan for priced
    clouds, else None."""
    if not loaded.path_problems:
        return _preflight(loaded, config)
    try:
        _preflight(loaded, config)
    except CloudtrainError as exc:
        raise RecipeError("\n".join([*loaded.path_problems, exc.one_line()])) from None
    raise RecipeError("\n".join(loaded.path_problems))


def _preflight(loaded: LoadedRecipe, config: Config) -> Plan | None:
    from cloudtrain.providers import ANY

    recipe = loaded.recipe
    cloud = recipe.resources.cloud
    if cloud == ANY:
        from cloudtrain.cluster.planning import priced_clouds

        clouds = list(priced_clouds())
        # Credentials are not asked here (no network): `plan` and `up` skip the clouds without them.
        default_region = None
    else:
        if not _cloud_traits(loaded).priced:
            clouds = []
        else:
            clouds = [cloud]
        default_region = getattr(getattr(config, cloud, None), "region", None)
    problem = unsupported(recipe)
    if problem is not None:
        field, message, hint = problem
        raise NotAvailableError(_located(loaded, field, message), hint=hint)
    from cloudtrain.policy import binds, effective_policy, recipe_refusal

    # The floors a recipe cannot lift (cloudtrain/policy.py). In team mode the team's floor is one
    # query on the team database (effective_policy opens it, or shares the process's connection);
    # a recipe no policy binds (this machine, given hosts, a sweep) reads nothing.
    refusal = recipe_refusal(recipe, effective_policy(config)) if binds(recipe) else None
    if refusal is not None:
        field, message, hint = refusal
        raise UsageError(_located(loaded, field, message), hint=hint)
    _check_host_keys(loaded)
    if recipe.upload or any(m.is_bucket for m in recipe.data):
        from cloudtrain.buckets.checks import propagation_override

        propagation_override()  # a malformed CLOUDTRAIN_GRANT_PROPAGATION_S is said now, not after launch
    if recipe.job is not None:
        _check_job_params(loaded)
        if cloud != ANY and not _cloud_traits(loaded).remote:
            # The bundled job runs in this very Python here; a node installs TensorFlow itself.
            from cloudtrain.extras import require

            require("tf", f"the bundled job {recipe.job.name} on cloud {cloud}")
    if not clouds and cloud != ANY:
        return None
    from cloudtrain.catalog import default_catalog
    from cloudtrain.plan import make_plan, refused_field

    # The same call lifecycle makes at launch time, so validate and up agree on the plan.
    try:
        return make_plan(recipe, default_catalog(), clouds, default_region=default_region)
    except UsageError as exc:
        field = refused_field(exc)
        if field is None:
            raise
        raise type(exc)(_located(loaded, field, exc.message), hint=exc.hint) from None


def unsupported(recipe: Recipe) -> tuple[str, str, str | None] | None:
    """The first field that validates but that the recipe's cloud cannot act on: (field, message, hint).

    Refused, never ignored. lifecycle.refuse_unavailable raises the same messages for callers
    that skip preflight.
    """
    cloud = recipe.resources.cloud
    for name in ("autostop", "budget"):
        if getattr(recipe, name) is None:
            continue
        for target in _clouds_of(cloud):
            if name == "budget" and _limits_time(target):
                continue  # a scheduler's time limit (sbatch --time) enforces max_hours; max_usd: below
            # Machines that stop themselves can delete themselves too: autostop.down needs no more.
            problem = autostop_problem(target, name)
            if problem is not None:
                return problem
    if recipe.budget is not None and recipe.budget.max_usd is not None and cloud in _registered():
        if not provider_traits(cloud).priced:
            return ("budget.max_usd", f"budget.max_usd needs a priced cloud: cloud {cloud} has no hourly price",
                    "use budget.max_hours to limit the running time")
    from cloudtrain.buckets.checks import bucket_problem

    bucket = bucket_problem(recipe, _clouds_of(cloud))
    if bucket is not None:
        return bucket
    if cloud in _registered() and not provider_traits(cloud).cloud_fields:
        honoured = provider_traits(cloud).honours_fields
        for name in CLOUD_ONLY_FIELDS:
            if getattr(recipe.resources, name) is not None and name not in honoured:
                return f"resources.{name}", f"resources.{name} does not apply to cloud {cloud}", "remove it or pick a cloud"
        if recipe.resources.spot:
            return "resources.spot", f"resources.spot does not apply to cloud {cloud}", None
    return None


def autostop_problem(cloud: str, field: str = "autostop") -> tuple[str, str, str | None] | None:
    """Why `cloud` cannot honour `field` (autostop or budget): its machines cannot stop or delete
    themselves (it does not implement SelfStopping). None when it can."""
    if cloud not in _registered():
        return None  # the cloud itself is refused elsewhere, with its own message
    from cloudtrain.providers import implements
    from cloudtrain.providers.base import GivenHosts, SelfStopping

    if implements(cloud, SelfStopping):
        return None
    what = "autostop is" if field == "autostop" else "budget limits are"
    if implements(cloud, GivenHosts):
        return (field, f"{what} not available for cloud {cloud}: the hosts are your own machines and cloudtrain "
                       "never stops them", f"remove '{field}'; `cloudtrain down` ends the cluster's jobs")
    return (field, f"{what} not available yet for cloud {cloud}: its machines cannot stop themselves yet",
            f"remove '{field}' and use `cloudtrain down`")


def _clouds_of(cloud: str) -> list[str]:
    """The clouds a recipe may land on: its own, or every priced one for `cloud: any`."""
    from cloudtrain.providers import ANY

    if cloud != ANY:
        return [cloud]
    from cloudtrain.cluster.planning import priced_clouds

    return list(priced_clouds())


def _limits_time(cloud: str) -> bool:
    """The cloud's scheduler enforces a time limit itself (traits `limits_time`)."""
    return cloud in _registered() and provider_traits(cloud).limits_time


def _registered() -> tuple[str, ...]:
    from cloudtrain.providers import available

    return available()


def _cloud_traits(loaded: LoadedRecipe) -> Traits:
    cloud = loaded.recipe.resources.cloud
    try:
        return provider_traits(cloud)
    except NotAvailableError as exc:
        raise NotAvailableError(_located(loaded, "resources.cloud", exc.message), hint=exc.hint) from None


def provider_traits(cloud: str) -> Traits:
    """`cloud`'s facts (priced, remote, ...): the registry reads its class, never instantiates it."""
    from cloudtrain.providers import traits

    return traits(cloud)


def _check_job_params(loaded: LoadedRecipe) -> None:
    from cloudtrain.jobs.params import JOBS, ParamProblem, check_params

    job = loaded.recipe.job
    assert job is not None
    if job.name not in JOBS:
        # The recipe model only admits bundled jobs; a job without a schema is a cloudtrain bug.
        raise RecipeError(_located(loaded, "job.name", f"bundled job {job.name!r} declares no parameters"))
    try:
        check_params(job.name, job.params)
    except ParamProblem as problem:
        loc = ("job", "params", problem.key)
        raise RecipeError(_located(loaded, loc, problem.message), hint=problem.hint) from None


def _check_host_keys(loaded: LoadedRecipe) -> None:
    """A host's `key:` must be a private key file here before anything connects: a missing or
    wrong file is said at `validate`, with its line, not as a parser's error at the first connect."""
    from pathlib import Path

    for index, host in enumerate(loaded.recipe.resources.hosts or []):
        if not host.key:  # none (or `${CT_SSH_KEY:-}` unset): the ssh-agent and default keys
            continue
        path = Path(host.key).expanduser()
        field = ("resources", "hosts", index, "key")
        try:
            with open(path, "rb") as handle:
                head = handle.read(4096)
        except FileNotFoundError:
            raise RecipeError(_located(loaded, field, f"{path} does not exist"),
                              hint="give the path of the private key this host accepts (e.g. ~/.ssh/id_ed25519), "
                                   "or leave `key:` out to use your ssh-agent and default keys") from None
        except OSError as exc:
            raise RecipeError(_located(loaded, field, f"{path} cannot be read: {exc.strerror}"),
                              hint="check the path and its permissions") from None
        if b"PRIVATE KEY-----" not in head:
            what = "a public key" if head.startswith((b"ssh-", b"ecdsa-")) else "not a private SSH key"
            raise RecipeError(_located(loaded, field, f"{path} is {what} (expected an OpenSSH or PEM private key, "
                                                      "the file that starts with -----BEGIN ... PRIVATE KEY-----)"),
                              hint=f"point `key:` at the private half{' (without .pub)' if path.suffix == '.pub' else ''}")


def _located(loaded: LoadedRecipe, field: str | Sequence[str | int], message: str) -> str:
    """`recipe.yaml:7: resources.region: message` (the line when the YAML is at hand; the field is
    left out when the message already starts with it)."""
    loc = field.split(".") if isinstance(field, str) else list(field)
    dotted = ".".join(str(part) for part in loc)
    line = line_of(loaded.node, loc) if loaded.node is not None else None
    where = f"{loaded.path}:{line}" if line else str(loaded.path)
    return f"{where}: {message}" if message.startswith(dotted) else f"{where}: {dotted}: {message}"


def _or_list(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)
