"""Asking before spending: the approver `run`, `up` and `sweep run` give the pipeline.

On a terminal the user sees the price and the worst case and answers; without one (CI, a script,
a pipe) nothing is launched unless `--yes` was given or the config says `confirm: false`: a tool
that bills by the hour must not take silence for consent.
"""

from __future__ import annotations

import sys

import click

from cloudtrain.cli import output
from cloudtrain.errors import Declined, UsageError
from cloudtrain.run.approval import Approver, SpendRequest

yes_option = click.option("--yes", "-y", is_flag=True,
                          help="Do not ask before launching or starting billed machines (also: `confirm: false` in config).")


def ask(headline: str, yes: bool, confirm: bool, what: str = "launched") -> None:
    """Return to go ahead; raise UsageError (no terminal to ask) or Declined (the user said no)."""
    if yes or not confirm:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{headline}: this needs your approval and there is no terminal to ask",
                         hint="pass --yes (-y), or set `confirm: false` in the config for unattended use")
    output.info(headline)
    if not click.confirm("proceed?", default=False, err=True):
        raise Declined(f"nothing {what}: you answered no")


def approver(yes: bool, confirm: bool) -> Approver:
    def approve(request: SpendRequest) -> None:
        ask(request.headline(), yes, confirm)

    return approve
