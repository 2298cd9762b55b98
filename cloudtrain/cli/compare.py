"""`compare`: the course's CPU-vs-GPU table from real run directories."""

from __future__ import annotations

from pathlib import Path

import click

from cloudtrain.cli import output


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default="compare.png", show_default=True,
              help="Where to save the bar chart.")
def compare(run_dirs: tuple[str, ...], png_path: str) -> None:
    """Compare RUN_DIRs: device, strategy, sec/batch, images/s, speed-up vs the first, accuracy, cost/epoch."""
    from cloudtrain.compare import CompareError, compare_table, format_rows, load_runs, render_png

    try:
        rows = compare_table(load_runs([Path(d) for d in run_dirs]))
    except CompareError as exc:
        exc.hint = exc.hint or "pass directories written by `cloudtrain run` or the bundled job"
        raise
    headers, cells = format_rows(rows)
    output.table(headers, cells)
    saved = render_png(rows, Path(png_path))
    output.info(f"chart: {saved}")
