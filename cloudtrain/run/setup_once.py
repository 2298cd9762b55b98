"""A recipe's `setup`, once per node and setup text, for the verbs that prepare a cluster without a
run: `up` runs it, `exec` on a node where it never ran runs it first (SkyPilot users expect `launch`
to leave a node on which `python train.py` works). `run` keeps running it every time (its setup.log
is part of the run) and marks it done too.

The truth is a file on the node (`<cluster root>/setup.done`: the setup's hash); this machine
remembers what it last saw (remote/homecache.py), so that a warm `exec` asks the node nothing more.
That memory is only a guess: `up` (and an `exec` without it) always asks the node, since a host that
`down` cleaned (an `ssh` cluster) comes back under the same name without the setup's work.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence

from cloudtrain.cluster.nodes import Node, on_all
from cloudtrain.events import Reporter
from cloudtrain.recipe import Recipe
from cloudtrain.remote import homecache
from cloudtrain.state import StateStore


def setup_key(recipe: Recipe) -> str:
    """What makes a setup the same: its text and the `envs` it runs with (a changed version pin in
    envs is a new setup), in a canonical order."""
    import json

    envs = json.dumps({k: str(v) for k, v in sorted(recipe.envs.items())}, separators=(",", ":"))
    return hashlib.sha256(f"{recipe.setup or ''}\0{envs}".encode()).hexdigest()[:32]


def _marker(node: Node) -> str:
    return f"{node.layout.root}/setup.done"


def _memory(node: Node) -> tuple[str, str, str] | None:
    endpoint = getattr(node.transport, "endpoint", None)
    return None if endpoint is None else (endpoint.instance_id, endpoint.user, f"setup:{node.layout.root}")


def remembered(node: Node, recipe: Recipe) -> bool:
    """Whether this machine saw this setup done on the node (a guess; `pending` asks the node)."""
    memory = _memory(node)
    return memory is not None and homecache.remembered(*memory) == setup_key(recipe)


def pending(nodes: Sequence[Node], recipe: Recipe) -> list[Node]:
    """The nodes on which this setup has not run: asked of each node (one round trip), never taken
    from memory, which a node cleaned by `down` and made again under the same name outlives."""
    key = setup_key(recipe)

    def done(node: Node) -> bool:
        said = node.transport.run(["cat", _marker(node)], check=False, what="reading the setup mark")
        ok = said.exit_code == 0 and said.text.strip() == key
        memory = _memory(node)
        if memory is not None:
            homecache.remember(*memory, key if ok else "")
        return ok

    marks = on_all(list(nodes), done)
    return [node for node, ok in zip(nodes, marks) if not ok]


def mark_done(nodes: Sequence[Node], recipe: Recipe) -> None:
    key = setup_key(recipe)

    def write(node: Node) -> None:
        write_file = 'umask 077 && printf %s "$2" > "$1.part" && mv -f "$1.part" "$1"'
        node.transport.run(["sh", "-c", write_file, "sh", _marker(node), key], what="writing the setup mark")
        memory = _memory(node)
        if memory is not None:
            homecache.remember(*memory, key)

    on_all(list(nodes), write)


def ensure(store: StateStore, reporter: Reporter, nodes: Sequence[Node], recipe: Recipe, cluster: str,
           why: str) -> None:
    """Run the recipe's setup on the nodes that have not run it (all of them at once, as `run`
    does, so a multi-node setup sees every peer); a failure raises JobFailedError."""
    from cloudtrain.run.job import run_job

    if not recipe.setup:
        return
    if not pending(nodes, recipe):
        return
    reporter.phase_start("setup", why)
    started = time.monotonic()
    job_id = f"setup-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    ok = False
    try:
        run_job(store, reporter, nodes, f"{cluster}-{job_id}", job_id, recipe.setup + "\n", recipe, "setup", [])
        ok = True
    finally:
        reporter.phase_end("setup", time.monotonic() - started, ok=ok)
    mark_done(nodes, recipe)

