"""`gc`: leaked instances and resources, found by tag."""

from __future__ import annotations

import click

from cloudtrain.cli import output


@click.command()
@click.option("--cloud", "clouds", multiple=True, metavar="CLOUD", help="Only these clouds (default: every cloud whose machines cloudtrain creates).")
@click.option("--yes", "-y", is_flag=True, help="Terminate and delete what is found (default: only list it).")
def gc(clouds: tuple[str, ...], yes: bool) -> None:
    """Find what cloudtrain created but no longer tracks (by tag, even if local state is lost)."""
    from cloudtrain.config import load_config
    from cloudtrain.cluster.gc import collect, find_leaks, gc_clouds
    from cloudtrain.errors import UsageError
    from cloudtrain.state import StateStore

    known = gc_clouds()
    for cloud in clouds:
        if cloud not in known:
            from cloudtrain.yamlfile import did_you_mean

            raise UsageError(f"--cloud {cloud!r}: gc knows {', '.join(known)}", hint=did_you_mean(cloud, known))
    config = load_config()
    leaks, skipped = find_leaks(StateStore(), config, clouds or known)
    for skip in skipped:
        output.warn(f"{skip.cloud}: not checked: {skip.reason}")
    if not leaks:
        output.info("nothing leaked")
        return
    output.table(["CLOUD", "CLUSTER", "KIND", "IDS / REGIONS", "WHY"],
                 [(k.cloud, k.cluster, k.kind, ", ".join(k.ids), k.reason) for k in leaks])
    if not yes:
        output.info("run `cloudtrain gc --yes` to remove them")
        raise SystemExit(1)
    for line in collect(leaks, config):
        output.info(line)
