"""The lazy command table: every listed command loads, and help needs none of them."""

from __future__ import annotations

import click

from cloudtrain.cli.main import COMMANDS, cli


def test_every_listed_command_loads_with_its_name() -> None:
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command), name
        assert command.name == name
