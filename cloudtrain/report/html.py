"""ReportData to one self-contained HTML page: tables that read without JavaScript, SVG charts
from report/svg.py, the CSS and the small sorting/filtering script inline."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cloudtrain.cli.output import money
from cloudtrain.report import svg
from cloudtrain.report.assets import CSS, JS
from cloudtrain.report.data import ReportData

# Rows a leaderboard shows (the rest are in `sweep status ID`).
LEADERBOARD = 10


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _day(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}h {s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _ncell(text: str, v: float | None = None) -> str:
    """A number's cell: text this module formatted itself (no markup to escape: 10,000 runs' worth)."""
    return f'<td class="n">{text}' if v is None else f'<td class="n" data-v="{v:.6g}">{text}'


def _cell(value: Any, v: float | None = None, numeric: bool = False) -> str:
    attrs = (' class="n"' if numeric else "") + ("" if v is None else f' data-v="{v:.6g}"')
    return f"<td{attrs}>{escape(str(value))}"


def table(table_id: str, caption: str, headers: Sequence[str], rows: Iterable[str], numeric: Sequence[int] = (),
          sortable: bool = True, filter_label: str | None = None) -> str:
    """A table; `rows` are ready `<tr>` strings (end tags omitted: HTML allows it, and 10,000 runs
    make the saving count). With `filter_label`, a text box that hides non-matching rows."""
    head = "".join(f'<th scope="col"{" class=n" if k in numeric else ""}>{escape(h)}</th>'
                   for k, h in enumerate(headers))
    box = (f'<input class="filter" type="search" aria-controls="{table_id}" aria-label="{escape(filter_label)}" '
           f'placeholder="{escape(filter_label)}">' if filter_label else "")
    cls = ' class="sortable"' if sortable else ""
    return (f'{box}<div class="scroll"><table id="{table_id}"{cls}><caption>{escape(caption)}</caption>'
            f'<thead><tr>{head}</tr></thead><tbody>\n{chr(10).join(rows)}\n</tbody></table></div>')


def render(data: ReportData, out_dir: Path) -> str:
    sections = [_summary(data), _spend(data), _now(data), _sweeps(data), _comparison(data), _runs(data, out_dir)]
    if data.leaks is not None:
        sections.append(_leaks(data))
    nav = "".join(f'<a href="#{k}">{t}</a>' for k, t in (
        ("spend", "Spend"), ("now", "Billing now"), ("sweeps", "Sweeps"), ("compare", "CPU vs GPU"),
        ("runs", "Runs")) + ((("leaks", "Leaks"),) if data.leaks is not None else ()))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>cloudtrain report {_iso(data.at)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>cloudtrain report</h1><nav aria-label=\"Sections\">{nav}</nav></header><main>"
            + "".join(sections) + f"</main><script>{JS}</script></body></html>\n")


def _summary(data: ReportData) -> str:
    billing_h = sum(b.compute_usd_h + b.disk_usd_h for b in data.billing)
    since = f"since {_iso(data.since)}" if data.since else "everything in this machine's state"
    cards = [("Total spent", money(data.cost.total_usd), "total"), ("Billing now", f"{money(billing_h)}/h", "rate"),
             ("Runs", f"{len(data.runs):,}", "runs"), ("Sweeps", str(len(data.sweeps)), "sweeps")]
    if data.leaks is not None:
        cards.append(("Leaks", f"{money(data.leaks.cost.hourly_usd)}/h", "leaks-h"))
    body = "".join(f'<div class="card" id="card-{i}">{escape(k)}<b>{escape(v)}</b></div>' for k, v, i in cards)
    problems = "".join(f'<p class="bad">{escape(p)}</p>' for p in data.problems)
    return (f'<p class="muted">Generated {_iso(data.at)}; {since}. Amounts are billed time x price from the '
            f"ledger, as <code>cloudtrain cost</code> reports them; days are UTC.</p>"
            f'<div class="cards" role="group" aria-label="Totals">{body}</div>{problems}')


def _spend(data: ReportData) -> str:
    out = ['<section id="spend"><h2>Spend</h2>']
    if not data.cost.spends:
        return out[0] + '<p class="muted">Nothing billed in this period.</p></section>'
    labels = [_day(d) for d in data.by_cloud.days]
    charts = [("cloud", data.by_cloud), ("cluster", data.by_cluster)]
    if len(data.by_owner.series) > 1:
        charts.append(("owner", data.by_owner))
    for what, series in charts:
        out.append(f"<h3>Per day, by {what}</h3>")
        out.append(svg.stacked_bars(labels, series.series, f"Spend per day by {what}", money))
    # The same numbers as a table (screen readers, print, copy).
    rows = [f"<tr><th scope=row>{_day(d)}" + "".join(_cell(money(v[i]), v[i], True) for v in data.by_cloud.series.values())
            + _cell(money(sum(v[i] for v in data.by_cloud.series.values())), None, True)
            for i, d in enumerate(data.by_cloud.days)]
    out.append("<details><summary>Per day, as a table</summary>" + table(
        "days", "Spend per UTC day by cloud", ["day", *data.by_cloud.series, "total"], rows,
        numeric=range(1, len(data.by_cloud.series) + 2), sortable=False) + "</details>")
    rows = [f"<tr><td>{escape(c['cluster'])}" + _cell(c["cloud"]) + _cell(c["status"])
            + _cell(f"{c['node_hours']:.2f}", c["node_hours"], True) + _cell(money(c["usd"]), c["usd"], True)
            + _cell("yes" if c["billing_now"] else "no") for c in data.cost.clusters]
    out.append(table("clusters", f"Per cluster (as cost --json): total {money(data.cost.total_usd)}",
                     ["cluster", "cloud", "status", "node-hours", "spent", "billing now"], rows, numeric=(3, 4)))
    return "".join(out) + "</section>"


def _now(data: ReportData) -> str:
    out = ['<section id="now"><h2>Billing now</h2>']
    if data.billing:
        rows = [f"<tr><td>{escape(b.cluster)}" + _cell(b.cloud) + _cell(b.status) + _cell(b.owner)
                + _cell(b.nodes, b.nodes, True) + _cell(b.instance_type or "-")
                + _cell(f"{money(b.compute_usd_h)}/h", b.compute_usd_h, True)
                + _cell(f"{money(b.disk_usd_h)}/h", b.disk_usd_h, True)
                + _cell(f"{money(b.compute_usd_h + b.disk_usd_h)}/h", b.compute_usd_h + b.disk_usd_h, True)
                for b in data.billing]
        out.append(table("billing", "Clusters in state and what their open billed intervals cost per hour",
                         ["cluster", "cloud", "status", "owner", "nodes", "type", "compute", "disks", "total"], rows,
                         numeric=(4, 6, 7, 8)))
    else:
        out.append('<p class="muted">Nothing in this state bills now.</p>')
    out.append("<h3>Budgets</h3>")
    rows = [f"<tr><td>{escape(b.cluster)}" + _cell(b.why) + _cell(duration(b.limit_s), b.limit_s, True)
            + _cell(duration(b.used_s), b.used_s, True) + _cell(duration(b.left_s), b.left_s, True)
            + _cell(money(b.left_s * b.hourly_usd / 3600), b.left_s * b.hourly_usd / 3600, True) for b in data.budgets]
    rows += [f"<tr><td>sweep {escape(s.detail['id'])}" + _cell(f"budget_usd {s.spec.costs.budget_usd:g}")
             + _cell("-") + _cell(money(s.detail["spent_usd"]), s.detail["spent_usd"], True) + _cell("-")
             + _cell(money(max(0.0, s.spec.costs.budget_usd - s.detail["spent_usd"])),
                     max(0.0, s.spec.costs.budget_usd - s.detail["spent_usd"]), True) for s in data.sweeps]
    if rows:
        out.append(table("budgets", "Running time a live cluster's recipe budget allows (as its watchdog counts it), "
                         "and each sweep's budget", ["what", "limit", "allows", "used", "left", "left $"], rows,
                         numeric=(2, 3, 4, 5)))
    else:
        out.append('<p class="muted">No live cluster or sweep with a budget.</p>')
    return "".join(out) + "</section>"


def _sweeps(data: ReportData) -> str:
    out = ['<section id="sweeps"><h2>Sweeps</h2>']
    if not data.sweeps:
        return out[0] + '<p class="muted">No sweeps in this state.</p></section>'
    for s in data.sweeps:
        d, spec = s.detail, s.spec
        out.append(f"<h3>Sweep {escape(d['id'])} ({escape(d['name'])}): {escape(d['status'])}</h3>"
                   f"<p>trials {_finished(d['trials'])}/{spec.limits.max_trials}; best {escape(d['best'])}; spent "
                   f"<span class=\"sweep-spent\" data-v=\"{d['spent_usd']}\">{money(d['spent_usd'])}</span> of "
                   f"{money(spec.costs.budget_usd)}; metric {escape(spec.metric)} ({escape(spec.goal)})</p>")
        done = [t for t in d["trials"] if t.get(spec.metric) is not None]
        ranked = sorted(done, key=lambda t: t[spec.metric], reverse=spec.goal == "max")
        rows = [f"<tr><td class=n>{k + 1}" + _cell(t["trial"], t["trial"], True)
                + "".join(_cell(_num(t["params"].get(p)) if isinstance(t["params"].get(p), float)
                                else t["params"].get(p, "-")) for p in spec.params)
                + _cell(_num(t[spec.metric]), t[spec.metric], True) + _cell(t["state"])
                for k, t in enumerate(ranked[:LEADERBOARD])]
        out.append(table(f"lb-{d['id']}", f"Leaderboard: best {min(LEADERBOARD, len(ranked))} of {len(d['trials'])} "
                         "trials", ["rank", "trial", *spec.params, spec.metric, "state"], rows,
                         numeric=(0, 1, len(spec.params) + 2)))
        best = ranked[0]["trial"] if ranked else None
        plots = []
        for p in spec.params:
            points = [(t["params"].get(p), t[spec.metric]) for t in done if p in t["params"]]
            index = next((k for k, t in enumerate(t for t in done if p in t["params"]) if t["trial"] == best), None)
            plots.append(svg.scatter(points, p, spec.metric, log_x=_log_axis(points, p in spec.log_params),
                                     best=index))
        plots.append(svg.spend_line([(pt.at, pt.usd) for pt in s.spend], spec.costs.budget_usd,
                                    d["created_at"], money))
        out.append(f'<div class="grid2">{"".join(plots)}</div>')
    return "".join(out) + "</section>"


def _finished(trials: Sequence[dict[str, Any]]) -> int:
    """Trials that ended, as `sweep status` counts them (neither pending nor running)."""
    return sum(1 for t in trials if t["state"] not in ("pending", "running"))


def _log_axis(points: Sequence[tuple[Any, float]], log_distributed: bool) -> bool:
    from cloudtrain.sweep.results import x_scale

    xs = [x for x, _ in points]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        return False
    return x_scale([float(x) for x in xs], log_distributed) == "log"


def _comparison(data: ReportData) -> str:
    from cloudtrain.compare import device_colours, device_label, format_rows

    out = ['<section id="compare"><h2>The bundled job: CPU vs GPU</h2>']
    if not data.comparison:
        return out[0] + ('<p class="muted">No finished runs of the bundled job here (<code>cloudtrain run '
                         'recipes/mnist-local.yaml</code> makes one).</p></section>')
    headers, cells = format_rows(data.comparison)
    rows = ["<tr>" + "".join(_cell(c) for c in row) for row in cells]
    out.append(table("comparison", "As cloudtrain compare shows it; speed-up against the first (CPU) run", headers,
                     rows, numeric=range(4, len(headers))))
    labels = [f"{r.run} ({device_label(r)})" for r in data.comparison]
    out.append(svg.bars(labels, [r.images_per_sec for r in data.comparison], device_colours(data.comparison),
                        "Images per second by run", "images/s"))
    return "".join(out) + "</section>"


def _link(run_dir: str | None, out_dir: str) -> str | None:
    """The run directory relative to the page (it opens from wherever both are copied together)."""
    if not run_dir:
        return None
    try:
        rel = os.path.relpath(run_dir, out_dir)
    except ValueError:  # another drive (Windows): an absolute file URL
        return Path(run_dir).resolve().as_uri() + "/"
    return quote(rel.replace(os.sep, "/")) + "/"


def _runs(data: ReportData, out_dir: Path) -> str:
    names = data.metric_names
    rows = []
    here = str(out_dir.resolve())
    for r in data.runs:
        href = _link(r.run_dir, here)
        first = f'<a href="{escape(href)}">{escape(r.id)}</a>' if href else escape(r.id)
        rows.append(f"<tr><td>{first}" + _cell(r.cluster) + _cell(r.cloud or "-") + _cell(r.status)
                    + f'<td data-v="{r.started_at:.0f}">{_iso(r.started_at)[:16]}'
                    + _ncell(duration(r.duration_s), r.duration_s) + _ncell(money(r.cost_usd), r.cost_usd)
                    + "".join(_ncell(_num(r.metrics.get(n))) for n in names))
    caption = f"{len(data.runs):,} run(s), newest first; the run id links to its directory"
    return ('<section id="runs"><h2>Runs</h2>' + table(
        "runs-table", caption, ["run", "cluster", "cloud", "status", "started", "duration", "cost", *names], rows,
        numeric=range(5, 7 + len(names)), filter_label="Filter runs (id, cluster, status...)") + "</section>")


def _leaks(data: ReportData) -> str:
    scan = data.leaks
    out = ['<section id="leaks"><h2>Leaks (what <code>cloudtrain gc</code> lists)</h2>']
    rows = [f"<tr><td>{escape(leak.cloud)}" + _cell(leak.cluster) + _cell(item.kind) + _cell(item.id)
            + _cell(item.region or "-")
            + _cell("price unknown" if item.hourly_usd is None else f"{money(item.hourly_usd)}/h", item.hourly_usd, True)
            + _cell(f"{leak.reason}; {leak.evidence}" if leak.evidence else leak.reason)
            for leak in scan.leaks for item in leak.items]
    if rows:
        out.append(table("leaks-table", f"About {money(scan.cost.hourly_usd)}/h"
                         + (f" plus {scan.cost.unknown} item(s) of unknown price" if scan.cost.unknown else "")
                         + "; `cloudtrain gc --yes` removes them",
                         ["cloud", "cluster", "kind", "id", "region", "$/h", "why"], rows, numeric=(5,)))
    else:
        out.append(f'<p class="ok">Nothing leaked in {escape(", ".join(scan.checked) or "no cloud")}.</p>')
    for leak in scan.live:
        out.append(f'<p class="muted">In use elsewhere, left alone: {escape(leak.cloud)} {escape(leak.cluster)}</p>')
    if scan.not_set_up:
        out.append(f'<p class="muted">Not set up here (no credentials): '
                   f'{escape(", ".join(s.cloud for s in scan.not_set_up))}</p>')
    for skip in scan.skipped:
        out.append(f'<p class="bad">NOT CHECKED: {escape(skip.cloud)} ({escape(skip.reason)}); it may have leaks</p>')
    return "".join(out) + "</section>"
