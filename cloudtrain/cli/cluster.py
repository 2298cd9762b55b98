"""`up`, `status`, `stop`, `start`, `down`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import click

from cloudtrain.cli import output
from cloudtrain.cli.approve import approver, yes_option
from cloudtrain.cli.common import cluster_argument, cluster_option, open_lifecycle, valid_cluster_names


@click.command()
@click.argument("recipe_path", metavar="RECIPE")
@cluster_option
@yes_option
def up(recipe_path: str, cluster: str | None, yes: bool) -> None:
    """Provision the cluster RECIPE describes, or reuse it if it is already up; sync its workdir and
    run its `setup` on every node where that setup has not run yet (so `exec` finds it done).

    On a priced cloud a new (or stopped) cluster is priced first and you are asked to proceed on a
    terminal; without one pass --yes (or set `confirm: false` in the config)."""
    from cloudtrain.run.pipeline import Executor
    from cloudtrain.recipe import load_recipe

    from cloudtrain.cli.run import sigterm_as_interrupt

    loaded = load_recipe(recipe_path, defer_paths=True)
    output.recipe_warnings(loaded.warnings)
    display = output.RunDisplay()
    lc = open_lifecycle(display)
    name = cluster or loaded.recipe.name
    sigterm_as_interrupt()
    display.phase_start("provision", loaded.recipe.resources.cloud)
    started = time.monotonic()
    result, created = Executor(lc, display, approver(yes, lc.config.confirm)).up(loaded, name, setup=True)
    display.phase_end("provision", time.monotonic() - started)
    verb = "created" if created else "reused"
    output.info(f"cluster {name} {verb}: {len(result.nodes)} node(s) on {result.provider.name}")


@click.command()
@cluster_argument(required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Ask the providers for the real state (finds instances by tag).")
@click.option("--all-users", is_flag=True,
              help="Every team member's clusters and runs, with a USER column (a team database; on SQLite, every owner's).")
def status(name: str | None, as_json: bool, refresh: bool, all_users: bool) -> None:
    """Show clusters (or one cluster), their nodes, and recent runs."""
    # Reads state directly: no provider, config or SDK import on this path unless --refresh or NAME.
    from cloudtrain.state import StateStore
    from cloudtrain.state.budgets import cluster_members, is_team, run_members, who

    store = StateStore()
    if refresh or name is not None:
        _refresh(store, name, instances=refresh)
    # On a team database a member sees their own rows unless --all-users; this machine's SQLite
    # file holds only its own. (A named cluster is shown whoever launched it.)
    members = cluster_members(store) if all_users or is_team(store) else {}
    me = who(store, "") if is_team(store) and not all_users and name is None else None
    clusters = [c for c in store.list_clusters() if (name is None or c.name == name)
                and (me is None or members.get(c.name) == me)]
    if name is not None and not clusters and not store.list_runs(cluster=name, limit=1):
        from cloudtrain.errors import ClusterNotFoundError

        raise ClusterNotFoundError(f"no cluster named {name!r}", hint="see `cloudtrain status`")
    view = status_view(store, name, run_limit=10 if me is None else 200)
    if me is not None:
        by = run_members(store) or {}
        view = StatusView(store, [r for r in view.runs if by.get(r.id) == me][:10], view.latest)
    runs, latest = view.runs, view.latest
    if as_json:
        document = view.as_json(clusters)
        if all_users:
            for item in document["clusters"]:
                item["user"] = members.get(item["name"])
        output.print_json(document)
        return
    now = time.time()
    if clusters:
        user = ["USER"] if all_users else []
        output.table(
            ["CLUSTER", *user, "CLOUD", "STATUS", "NODES", "TYPE", "$/H", "AGE", "LAST JOB"],
            [
                (c.name, *([members.get(c.name, "-")] if all_users else []), c.provider, c.status, c.num_nodes,
                 c.instance_type, output.money(c.hourly_price), output.age(now - c.created_at),
                 f"{latest[c.name].status}" + (f" ({latest[c.name].exit_code})" if latest[c.name].exit_code not in (None, 0) else "")
                 if c.name in latest else "-")
                for c in clusters
            ],
        )
    elif name is None and me is not None and members:
        output.info(f"no clusters of yours ({me}); `cloudtrain status --all-users` shows the team's {len(members)}")
    elif name is None:
        output.info("no clusters")
    else:
        output.info(f"cluster {name} is down; its runs:")
    if name is not None and clusters:
        nodes = store.get_nodes(name)
        if nodes:
            output.echo()
            output.table(
                ["RANK", "INSTANCE", "STATE", "ADDRESS", "USER", "PORT"],
                [(n.rank, n.instance_id, n.state, n.public_ip, n.ssh_user, n.ssh_port) for n in nodes],
            )
        if latest.get(name) is not None:
            job = latest[name]
            output.echo()
            output.info(f"last job {job.id}: {job.status}" + (f", exit code {job.exit_code}" if job.exit_code is not None else "")
                        + f"  (`cloudtrain logs {name} {job.id}`)")
    if refresh:
        _stopped_lines(store, clusters)
    if runs:
        output.echo()
        output.table(
            ["RUN", "STATUS", "EXIT", "CLOUD", "COST", "STARTED", "ERROR"],
            [(r.id, r.status, r.exit_code, r.provider, output.money(r.cost_usd),
              time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)),
              (r.error[:77] + "...") if r.error and len(r.error) > 80 else r.error) for r in runs],
        )


@dataclass(frozen=True)
class StatusView:
    """What `status` shows besides the cluster rows: the recent runs and each cluster's last job."""

    store: Any  # StateStore
    runs: list[Any]  # RunRecord, newest first
    latest: dict[str, Any]  # cluster -> its newest JobRecord, open ones as the node's local file says

    def as_json(self, clusters: list[Any]) -> dict[str, Any]:
        """`status --json` (and `cloudtrain report`'s cluster and run rows) for `clusters` (ClusterRecord)."""
        record = output.json_record
        return {
            "clusters": [
                {**record(c.__dict__), "nodes": [record(n.__dict__) for n in self.store.get_nodes(c.name)],
                 "last_job": record(self.latest[c.name].__dict__) if c.name in self.latest else None}
                for c in clusters
            ],
            "runs": [record(r.__dict__, decode=("result_paths",)) for r in self.runs],
        }


def status_view(store: Any, name: str | None = None, run_limit: int = 10) -> StatusView:
    """The runs and last jobs `status` reports, a plain function the command and `report` share."""
    from cloudtrain.remote.jobs import OPEN_STATES
    from cloudtrain.run.jobstate import peek_local
    from cloudtrain.state import RunStatus

    runs = store.list_runs(cluster=name, limit=run_limit)
    # A run whose `cloudtrain run` process died (kill -9, a crash) will never finish its row.
    dead = [r for r in runs if r.status == RunStatus.RUNNING and not r.driver_alive()]
    for r in dead:
        store.update_run(r.id, status=RunStatus.ABANDONED)
    if dead:
        runs = store.list_runs(cluster=name, limit=run_limit)
    latest = {
        cluster: (peek_local(job) if job.status in OPEN_STATES else job)
        for cluster, job in store.latest_jobs().items()
    }
    return StatusView(store, runs, latest)


_FORCE_HELP = "On a team database: also a teammate's cluster (refused without it; recorded in its events)."


@click.command()
@cluster_argument()
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def stop(name: str, force: bool) -> None:
    """Stop NAME's instances: no compute billing, disks kept, `start` resumes."""
    lc = _teammates_lifecycle(open_lifecycle(output.RunDisplay()), (name,), "stop", force)
    lc.stop(name)
    output.info(f"cluster {name} stopped")


@click.command()
@cluster_argument()
def start(name: str) -> None:
    """Start a stopped cluster."""
    lc = open_lifecycle(output.RunDisplay())
    cluster = lc.start(name)
    output.info(f"cluster {name} started: {len(cluster.nodes)} node(s)")


@click.command()
@click.argument("names", nargs=-1, required=True, callback=valid_cluster_names)
@click.option("--forget", is_flag=True, help="Drop the cluster from state even if a node cannot be cleaned.")
@click.option("--include-live", is_flag=True,
              help="For a name not in this machine's state: end its machines found by tag even when a cloudtrain "
                   "command elsewhere marked them alive moments ago.")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before ending a cluster that a live run (another terminal's) is using.")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def down(names: tuple[str, ...], forget: bool, include_live: bool, yes: bool, force: bool) -> None:
    """End every job, terminate clusters and everything they created. Safe to repeat."""
    from cloudtrain.cluster.untracked import Outcome, down_untracked, near_names
    from cloudtrain.errors import ClusterBusyError, ClusterNotFoundError, ProviderError
    from cloudtrain.yamlfile import did_you_mean

    lc = _teammates_lifecycle(open_lifecycle(output.RunDisplay()), names, "down", force)
    unknown: list[str] = []
    for name in names:
        busy = lc.live_runs(name)
        if busy:
            # Another terminal's run is using it: ending it ends that run, which cannot then
            # collect its results. Asked, never assumed (no terminal: --yes).
            _confirm_ending_a_run(name, busy[0], yes)
        if lc.down(name, forget=forget):
            output.info(f"cluster {name} is down")
            continue
        # Not in this machine's state: the clouds are asked by tag before anything is said.
        found = down_untracked(lc.store, lc.config, name, include_live)
        for cloud, reason in found.not_asked.items():
            output.warn(f"could not ask {cloud} for cluster {name}'s machines: {reason}")
        if found.outcome is Outcome.TERMINATED:
            for cloud, ids in found.ended.items():
                output.info(f"cluster {name} was not in this machine's state; terminated on {cloud} "
                            f"(found by tag): {', '.join(ids)}")
            for cloud, what in found.released.items():
                output.info(f"cluster {name}: released on {cloud}: {', '.join(what)}")
            for note in found.kept:
                output.warn(f"kept for now: {note}")
            output.info(f"cluster {name} is down")
        elif found.outcome is Outcome.LIVE:
            for cloud, what in found.live.items():
                output.warn(f"cluster {name} is not in this machine's state, and its machines on {cloud} are in use "
                            f"elsewhere: {what} (another state of this owner); left alone")
            raise ClusterBusyError(f"cluster {name}: not ended: a cloudtrain command elsewhere is using it",
                                   hint=f"end it from there, or `cloudtrain down {name} --include-live` ends it anyway")
        elif found.outcome is Outcome.ALREADY_DOWN:
            output.info(f"cluster {name} is already down")
        else:
            unknown.append(name)
        if found.not_asked and found.outcome is not Outcome.TERMINATED:
            raise ProviderError(f"cluster {name}: {', '.join(found.not_asked)} could not be asked whether "
                                "it still runs machines tagged with it",
                                hint="fix the credentials (`cloudtrain check`) and run `cloudtrain down` again")
    if unknown:
        name = unknown[0]
        hint = did_you_mean(name, near_names(lc.store, name)) or "`cloudtrain status` lists the clusters"
        listed = ", ".join(repr(n) for n in unknown)
        raise ClusterNotFoundError(f"no cluster named {listed} here or in any cloud set up", hint=hint)


def _teammates_lifecycle(lc, names: tuple[str, ...], verb: str, force: bool):  # noqa: ANN001, ANN202 - Lifecycle
    """On a team database, `down`/`stop` of a teammate's cluster: refused (exit 2) unless --force;
    forced, it is recorded and done with every owner's tags in view (the teammate's machines,
    key pair and firewall carry their owner tag, not ours). Elsewhere: `lc` as it is."""
    from cloudtrain.state.team import guard_teammates

    if not guard_teammates(lc.store, names, verb, force):
        return lc
    from cloudtrain.cluster.lifecycle import Lifecycle
    from cloudtrain.config import ALL_OWNERS

    return Lifecycle(lc.store, lc.config.model_copy(update={"owner": ALL_OWNERS}), lc.reporter)


def _confirm_ending_a_run(name: str, run, yes: bool) -> None:  # noqa: ANN001 - RunRecord
    import sys

    from cloudtrain.errors import Declined, UsageError

    if yes:
        return
    what = (f"cluster {name} is in use by run {run.id} (pid {run.pid}): `down` ends that run's job before it "
            "has collected its results")
    if not sys.stdin.isatty():
        raise UsageError(what, hint=f"wait for the run to end, `cloudtrain cancel {name}` its job (the run then "
                                    "collects and tears down), or pass --yes to end it anyway")
    output.info(what)
    if not click.confirm("down anyway?", default=False, err=True):
        raise Declined(f"cluster {name} left as it is: you answered no")


def _stopped_lines(store: Any, clusters: list[Any]) -> None:
    """For `status --refresh`: what each stopped cluster's disks cost per day and, where
    autostop.delete_after_stopped_days armed it, when `gc --expired` deletes it (or that it is due).
    Asks the clouds of stopped clusters only: a listing per cloud, as `gc --expired` does."""
    from cloudtrain.state import ClusterStatus

    stopped = {c.name: c for c in clusters if c.status == ClusterStatus.STOPPED}
    if not stopped:
        return
    from cloudtrain import expiry
    from cloudtrain.cluster.gc import find_expired
    from cloudtrain.config import load_config

    at = expiry.now()
    found, skipped = find_expired(store, load_config(), tuple(sorted({c.provider for c in stopped.values()})), at=at)
    for item in skipped:
        output.warn(f"{item.cloud}: stopped clusters' expiry not read: {item.reason}")
    armed = {e.cluster: e for e in found}
    output.echo()
    for name in sorted(stopped):
        e = armed.get(name)
        if e is None:
            output.info(f"{name}: stopped, kept until `cloudtrain down {name}` (no autostop.delete_after_stopped_days)")
        elif e.delete:
            output.info(f"{name}: stopped and due for deletion: {e.why}; `cloudtrain gc --expired --yes` deletes it")
        elif e.hourly_usd is not None:
            output.info(f"{name}: {expiry.stopped_disk_cost_line(e.hourly_usd, e.due, at)}")
        else:
            output.info(f"{name}: stopped; {e.why}")


def _refresh(store, name: str | None, instances: bool) -> None:  # noqa: ANN001
    """Ask the providers (instances) and the nodes (open jobs) for the truth, for NAME or every cluster."""
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.remote.jobs import OPEN_STATES
    from cloudtrain.run.jobstate import refresh_jobs
    from cloudtrain.state import ClusterStatus
    from cloudtrain.cluster.nodes import close_all, connect

    lc = open_lifecycle()
    for record in store.list_clusters():
        if name is not None and record.name != name:
            continue
        cluster = lc.refresh(record.name) if instances else lc.get(record.name)
        if cluster.record.status != ClusterStatus.UP or not any(j.status in OPEN_STATES for j in store.list_jobs(record.name)):
            continue
        try:
            nodes = connect(list(cluster.nodes[:1]), cluster.provider, lc.config)
        except CloudtrainError as exc:
            output.warn(f"{record.name}: job states not refreshed: {exc.one_line()}")
            continue
        try:
            refresh_jobs(store, record.name, nodes)
        finally:
            close_all(nodes)
