"""`team`: a team's shared state database (docs/teams.md): prepare it, migrate it."""

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
    """A team's shared state database (state_url): init, migrate."""


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
    from cloudtrain.state.team import migrate

    url = _team_url()
    done = migrate(url)
    where = pg.display(url)
    if done.applied:
        output.info(f"{where}: migrated v{done.before} -> v{done.after} ({len(done.applied)} step(s))")
    else:
        output.info(f"{where}: already at schema v{done.after}, nothing to do")
