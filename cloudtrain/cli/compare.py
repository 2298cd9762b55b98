"""`compare`: the course's CPU-vs-GPU table from real run directories."""

from __future__ import annotations

from pathlib import Path

import click

from cloudtrain.cli import output


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--output", "-o", "png_path", type=click.Path(dir_okay=False),
              help="Where to save the chart (default: compare.png next to the runs).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), hidden=True)
def compare(run_dirs: tuple[str, ...], png_path: str | None) -> None:
    """Compare RUN_DIRs. Any runs: status, exit code, wall and job time, cost, and every number the
    runs' outputs/metrics.json share. The bundled job's runs: device, strategy, batch size, sec/batch,
    images/s, speed-up vs the first, test accuracy, cost per epoch, and a chart coloured by device."""
    from cloudtrain.compare import (CompareError, batch_size_warning, compare_table, default_png_path, epochs_warning,
                                    format_rows, load_runs, render_png)

    # `compare runs/*` also matches the chart an earlier compare saved next to the runs: not a run.
    charts = [d for d in run_dirs if Path(d).is_file() and Path(d).suffix.lower() == ".png"]
    for chart in charts:
        output.warn(f"skipped {chart}: a chart, not a run directory")
    run_dirs = tuple(d for d in run_dirs if d not in charts)
    from cloudtrain.compare_any import load_all, table

    anyruns = load_all([Path(d) for d in run_dirs])
    if not all(r.bundled for r in anyruns):
        # Runs of your own scripts: what run.json records, and the metrics they all report.
        headers, cells, partial = table(anyruns)
        output.table(headers, cells)
        if partial:
            output.info(f"not in every run (left out): {', '.join(partial)}")
        if len(headers) == 6:
            output.info("no metric common to these runs: write numbers to outputs/metrics.json to compare them")
        if png_path:
            output.warn(f"--output {png_path}: nothing written: a chart is drawn for runs of the bundled job only; "
                        "the table above is the comparison (`> file` keeps it)")
        return
    from cloudtrain.extras import require

    require("tf", "the bundled job's comparison chart", modules=("matplotlib",))
    try:
        rows = compare_table(load_runs([Path(d) for d in run_dirs]))
    except CompareError as exc:
        exc.hint = exc.hint or "pass directories written by `cloudtrain run` or the bundled job"
        raise
    for warning in (batch_size_warning(rows), epochs_warning(rows)):
        if warning:
            output.warn(warning)
    headers, cells = format_rows(rows)
    output.table(headers, cells)
    saved = render_png(rows, Path(png_path) if png_path else default_png_path(run_dirs))
    output.info(f"chart: {saved}")
