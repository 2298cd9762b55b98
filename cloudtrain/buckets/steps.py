"""A run's bucket steps on its nodes: copy the data in before the job, upload results at its end.

Both run as detached jobs (templates/runner.sh) of templates/bucket_copy.py, so their progress
streams into the run's output like any job's, and a dropped laptop link does not cut the copy.
The node uses its own identity (the cluster's IAM role, service account or managed identity) on
clouds that own their machines, and says so; ssh and local nodes use the store credentials
configured on them (the environment and the store's own configuration), and say that instead.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cloudtrain import paths
from cloudtrain.buckets.checks import propagation_override
from cloudtrain.buckets.url import BucketUrl, parse_bucket_url
from cloudtrain.cluster.nodes import Node, on_all
from cloudtrain.events import Reporter
from cloudtrain.recipe import LoadedRecipe, Recipe
from cloudtrain.state import StateStore

if TYPE_CHECKING:
    from cloudtrain.run.stop import StopToken

COPY_SCRIPT = "bucket_copy.py"
# The node installs the copy tool into its venv when it is not there (docs/data.md: why obstore).
OBSTORE_REQUIREMENT = "obstore>=0.12,<1"
# Where the CLI's own environment may point the node's copy elsewhere than the cloud's defaults
# (an S3-compatible store, a test's fakes): the CLI's variable -> the node's.
_PASSED_ENV = (
    ("AWS_ENDPOINT_URL_S3", "CLOUDTRAIN_S3_ENDPOINT"),
    ("AWS_ENDPOINT_URL", "CLOUDTRAIN_S3_ENDPOINT"),
    ("CLOUDTRAIN_METADATA_URL", "CLOUDTRAIN_METADATA_URL"),
    ("CLOUDTRAIN_BLOB_ENDPOINT", "CLOUDTRAIN_BLOB_ENDPOINT"),  # an Azure Blob emulator (path-style URLs)
    ("STORAGE_EMULATOR_HOST", "CLOUDTRAIN_GCS_ENDPOINT"),  # Google's clients' variable for another GCS
)


def bucket_mounts(recipe: Recipe) -> list[tuple[BucketUrl, str]]:
    """(bucket URL, target relative to the workdir) of the recipe's bucket data sources."""
    return [(parse_bucket_url(m.source), m.target) for m in recipe.data if m.is_bucket]


def without_buckets(loaded: LoadedRecipe) -> LoadedRecipe:
    """The recipe as the laptop's sync sees it: local data mounts only (the node copies buckets)."""
    if not any(m.is_bucket for m in loaded.recipe.data):
        return loaded
    recipe = loaded.recipe.model_copy(update={"data": [m for m in loaded.recipe.data if not m.is_bucket]})
    return loaded.model_copy(update={"recipe": recipe})


def identity_of(provider: object, cluster: str) -> tuple[str, str]:
    """("instance" | "configured", the identity in words) for the cluster's nodes."""
    traits = getattr(provider, "traits", None)
    if traits is not None and traits.owns_machines:  # a cloud's own machine: it has an identity
        from cloudtrain.providers.base import SaysBucketIdentity, supports

        who = "the VM's own identity"
        if supports(provider, SaysBucketIdentity):
            who = provider.bucket_identity(cluster)  # type: ignore[attr-defined]
        return "instance", who
    return "configured", "the store credentials configured on the node (ssh and local nodes have no cloud identity)"


def grant_wait_s(provider: object, environ: Mapping[str, str] | None = None) -> float:
    """How long a node's first copy of a bucket retries access denied: the cloud's IAM propagation
    (Traits.grant_propagation_s), or CLOUDTRAIN_GRANT_PROPAGATION_S where set (the test kit's fakes
    apply grants in seconds; a store you know to be quicker or slower)."""
    override = propagation_override(environ)
    if override is not None:
        return override
    traits = getattr(provider, "traits", None)
    return float(getattr(traits, "grant_propagation_s", 0.0))


def node_env(identity: str, who: str, environ: Mapping[str, str] | None = None,
             grant_wait: float = 0.0) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    env = {"CLOUDTRAIN_BUCKET_IDENTITY": identity, "CLOUDTRAIN_BUCKET_WHO": who}
    if identity == "instance" and grant_wait > 0:
        env["CLOUDTRAIN_BUCKET_GRANT_WAIT_S"] = f"{grant_wait:g}"
    for source, target in _PASSED_ENV:
        if environ.get(source) and target not in env:
            env[target] = environ[source]
    return env


def _prelude(env: Mapping[str, str]) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    # Installed into cloudtrain's own venv on a node (bootstrap's marker file), never into an
    # interpreter of yours (cloud local runs the copy with the CLI's own Python).
    install = ('if ! "$CLOUDTRAIN_PYTHON" -c "import obstore" 2>/dev/null; then\n'
               '  if [ -f "$(dirname "$CLOUDTRAIN_PYTHON")/../.cloudtrain" ]; then\n'
               f'    "$CLOUDTRAIN_PYTHON" -m pip install --quiet {shlex.quote(OBSTORE_REQUIREMENT)} || '
               '{ echo "bucket copy: could not install obstore on this node" >&2; exit 6; }\n'
               '  else\n'
               '    echo "bucket copy: obstore is not installed for $CLOUDTRAIN_PYTHON: pip install \'cloudtrain[buckets]\'" >&2; '
               'exit 6\n'
               '  fi\n'
               'fi\n')
    return f"set -e\n{exports}{install}"


def copy_in_script(mounts: Sequence[tuple[BucketUrl, str]], env: Mapping[str, str]) -> str:
    lines = [_prelude(env)]
    for url, target in mounts:
        # One record per (source, target) on each node: what the last copy to this node brought.
        key = hashlib.sha256(f"{url}\0{target}".encode()).hexdigest()[:16]
        lines.append(f'"$CLOUDTRAIN_PYTHON" "$CLOUDTRAIN_RUNTIME/{COPY_SCRIPT}" get {shlex.quote(str(url))} '
                     f'{shlex.quote(target)} --state "$CLOUDTRAIN_RUNTIME/../buckets/{key}.json"\n')
    return "".join(lines)


def upload_script(dest: BucketUrl, result_paths: Sequence[str], env: Mapping[str, str]) -> str:
    # Result paths the job did not write are skipped, not an error: collect treats them alike.
    quoted = " ".join(shlex.quote(p) for p in result_paths)
    # One record per bucket on each node: whether this node's identity has written there before
    # (a first upload may meet a grant still propagating, bucket_copy.py).
    key = hashlib.sha256(dest.bucket_url.encode()).hexdigest()[:16]
    return (_prelude(env) + f"set --\nfor p in {quoted}; do [ -e \"$p\" ] && set -- \"$@\" \"$p\"; done\n"
            f'[ $# -gt 0 ] || {{ echo "upload {dest}: no results to upload"; exit 0; }}\n'
            f'"$CLOUDTRAIN_PYTHON" "$CLOUDTRAIN_RUNTIME/{COPY_SCRIPT}" put {shlex.quote(str(dest))} --base . '
            f'--state "$CLOUDTRAIN_RUNTIME/../buckets/put-{key}.json" "$@"\n')


def put_copy_tool(nodes: Sequence[Node]) -> None:
    data = (paths.templates_dir() / COPY_SCRIPT).read_bytes()
    on_all(list(nodes), lambda n: n.transport.put_file(data, f"{n.layout.runtime}/{COPY_SCRIPT}", mode=0o644))


def copy_in(store: StateStore, reporter: Reporter, nodes: Sequence[Node], provider: object, run_id: str,
            recipe: Recipe, started: list[str], stop: StopToken | None = None) -> None:
    """Every node copies the recipe's bucket data into its workdir (only what changed there).
    `stop`: the attempt's token; a stop ends the copy job's waits at once (run/job.py)."""
    from cloudtrain.run.job import run_job

    mounts = bucket_mounts(recipe)
    if not mounts:
        return
    identity, who = identity_of(provider, nodes[0].record.cluster)
    reporter.info(f"data: the nodes read {', '.join(str(u) for u, _ in mounts)} with {who}")
    put_copy_tool(nodes)
    env = node_env(identity, who, grant_wait=grant_wait_s(provider))
    run_job(store, reporter, nodes, run_id, f"{run_id}-data", copy_in_script(mounts, env), recipe, "data copy",
            started, stop=stop)


def refresh_grants(cluster: object, recipe: Recipe) -> None:
    """A reused cluster's node identity is given this recipe's buckets (it was made for the recipe
    that created the cluster), where the provider can (`grant_buckets`)."""
    from cloudtrain.buckets.grants import recipe_grants

    grants = recipe_grants(recipe)
    grant = getattr(getattr(cluster, "provider", None), "grant_buckets", None)
    if grants and grant is not None:
        grant(cluster.record.name, [n.instance_id for n in cluster.nodes], grants)  # type: ignore[attr-defined]


def upload_destination(recipe: Recipe, run_id: str) -> BucketUrl | None:
    return parse_bucket_url(recipe.upload).child(run_id) if recipe.upload else None


def upload(store: StateStore, reporter: Reporter, nodes: Sequence[Node], provider: object, run_id: str,
           recipe: Recipe, started: list[str]) -> BucketUrl | None:
    """Rank 0 uploads the recipe's result paths under `upload`/<run-id>/; returns where."""
    from cloudtrain.run.job import run_job

    dest = upload_destination(recipe, run_id)
    if dest is None:
        return None
    identity, who = identity_of(provider, nodes[0].record.cluster)
    reporter.info(f"upload: node 0 writes the results to {dest} with {who}")
    put_copy_tool(nodes[:1])
    run_job(store, reporter, nodes[:1], run_id, f"{run_id}-upload",
            upload_script(dest, recipe.result_paths(), node_env(identity, who, grant_wait=grant_wait_s(provider))),
            recipe, "upload", started)
    return dest
