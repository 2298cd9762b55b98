"""The report's charts as inline SVG, drawn here: no plotting library to import (matplotlib costs
a second and megabytes, and its SVG embeds fonts and ids per file), and the page's CSS styles
them, so light and dark modes and print need nothing else.

Every chart is `<svg role="img">` with a <title> and a <desc> for screen readers; the numbers it
draws are also in a table beside it (the page's job), so nothing is only in a picture.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

# Okabe-Ito: told apart with the common colour blindnesses, readable on light and dark.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#999999")
W, H = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 44

_ids = 0


def _id() -> str:
    global _ids
    _ids += 1
    return f"c{_ids}"


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ticks(high: float, count: int = 4) -> list[float]:
    """0 and round steps up to at least `high` (1, 2, 2.5 or 5 times a power of ten)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [step * i for i in range(int(math.ceil(high / step - 1e-9)) + 1)]


def _frame(title: str, desc: str, body: list[str], height: int = H) -> str:
    cid = _id()
    return (f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" aria-labelledby="{cid}t {cid}d" '
            f'xmlns="http://www.w3.org/2000/svg"><title id="{cid}t">{escape(title)}</title>'
            f'<desc id="{cid}d">{escape(desc)}</desc>{"".join(body)}</svg>')


def _y_axis(ticks: Sequence[float], scale: Callable[[float], float], label: Callable[[float], str]) -> list[str]:
    out = []
    for t in ticks:
        y = scale(t)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label(t))}</text>')
    return out


def stacked_bars(labels: Sequence[str], series: dict[str, Sequence[float]], title: str,
                 money: Callable[[float], str]) -> str:
    """One bar per label (a day), stacked by series; a legend under it."""
    n = len(labels)
    totals = [sum(values[i] for values in series.values()) for i in range(n)]
    ticks = nice_ticks(max(totals, default=0.0))
    top = ticks[-1]
    plot_h = H - TOP - BOTTOM
    scale = lambda v: TOP + plot_h * (1 - v / top)  # noqa: E731
    body = _y_axis(ticks, scale, money)
    slot = (W - LEFT - RIGHT) / max(n, 1)
    bar = max(1.0, slot * 0.8)
    every = max(1, math.ceil(n / 10))  # at most ~10 day labels
    for i, day in enumerate(labels):
        x = LEFT + i * slot + (slot - bar) / 2
        base = 0.0
        for k, (name, values) in enumerate(series.items()):
            v = values[i]
            if v <= 0:
                continue
            y0, y1 = scale(base), scale(base + v)
            body.append(f'<rect x="{x:.1f}" y="{y1:.1f}" width="{bar:.1f}" height="{max(y0 - y1, 0.5):.1f}" '
                        f'fill="{colour(k)}"><title>{escape(day)} {escape(name)}: {escape(money(v))}</title></rect>')
            base += v
        if i % every == 0:
            body.append(f'<text class="tick" x="{x + bar / 2:.1f}" y="{H - BOTTOM + 14}" '
                        f'text-anchor="middle">{escape(day[5:])}</text>')
    body.append(_legend(list(series), H - 12))
    desc = "; ".join(f"{name} {money(sum(values))}" for name, values in series.items())
    return _frame(title, f"Stacked bars per day. Totals: {desc}", body)


def _legend(names: Sequence[str], y: float) -> str:
    parts, x = [], LEFT
    for k, name in enumerate(names):
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour(k)}"/>'
                     f'<text class="tick" x="{x + 14}" y="{y}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return "".join(parts)


def scatter(points: Sequence[tuple[float | str, float]], x_name: str, y_name: str, log_x: bool = False,
            best: int | None = None) -> str:
    """`y_name` against `x_name`: numbers on a linear or log axis, anything else as categories."""
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
    ys = [y for _, y in points]
    lo, hi = min(ys, default=0.0), max(ys, default=1.0)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    lo, hi = lo - pad, hi + pad
    plot_h = H - TOP - BOTTOM
    sy = lambda v: TOP + plot_h * (1 - (v - lo) / (hi - lo))  # noqa: E731
    body = _y_axis([lo + (hi - lo) * k / 4 for k in range(5)], sy, lambda v: f"{v:.4g}")
    width = W - LEFT - RIGHT
    if numeric and points:
        xs = [float(x) for x, _ in points]  # type: ignore[arg-type]
        tx = (lambda v: math.log10(v)) if log_x and min(xs) > 0 else (lambda v: v)
        a, b = min(map(tx, xs)), max(map(tx, xs))
        span = (b - a) or 1.0
        sx = lambda v: LEFT + 12 + (width - 24) * (tx(v) - a) / span  # noqa: E731
        for v in sorted(set(xs))[:: max(1, len(set(xs)) // 6)]:
            body.append(f'<text class="tick" x="{sx(v):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">{v:.3g}</text>')
        where = [sx(float(x)) for x, _ in points]  # type: ignore[arg-type]
    else:
        cats = list(dict.fromkeys(str(x) for x, _ in points))
        step = width / max(len(cats), 1)
        for k, c in enumerate(cats):
            body.append(f'<text class="tick" x="{LEFT + step * (k + 0.5):.1f}" y="{H - BOTTOM + 14}" '
                        f'text-anchor="middle">{escape(c[:14])}</text>')
        where = [LEFT + step * (cats.index(str(x)) + 0.5) for x, _ in points]
    for k, ((x, y), px) in enumerate(zip(points, where)):
        cls = "dot best" if k == best else "dot"
        body.append(f'<circle class="{cls}" cx="{px:.1f}" cy="{sy(y):.1f}" r="{6 if k == best else 4}">'
                    f'<title>{escape(x_name)}={escape(str(x))}: {escape(y_name)} {y:.4g}</title></circle>')
    body.append(f'<text class="axis" x="{LEFT + width / 2:.1f}" y="{H - 8}" text-anchor="middle">'
                f'{escape(x_name)}{" (log)" if numeric and log_x else ""}</text>')
    return _frame(f"{y_name} against {x_name}", f"{len(points)} trials; {y_name} from {min(ys, default=0):.4g} "
                  f"to {max(ys, default=0):.4g}", body)


def spend_line(points: Sequence[tuple[float, float]], budget: float, start: float,
               money: Callable[[float], str]) -> str:
    """A running total of spend over minutes since `start`, with the budget as a dashed line."""
    top = nice_ticks(max([budget] + [u for _, u in points]))[-1]
    plot_h = H - TOP - BOTTOM
    sy = lambda v: TOP + plot_h * (1 - v / top)  # noqa: E731
    end = max([t for t, _ in points] + [start + 60])
    sx = lambda t: LEFT + (W - LEFT - RIGHT) * (t - start) / (end - start)  # noqa: E731
    body = _y_axis(nice_ticks(top), sy, money)
    body.append(f'<line class="budget" x1="{LEFT}" x2="{W - RIGHT}" y1="{sy(budget):.1f}" y2="{sy(budget):.1f}"/>'
                f'<text class="tick" x="{W - RIGHT}" y="{sy(budget) - 4:.1f}" text-anchor="end">budget '
                f'{escape(money(budget))}</text>')
    if points:
        path = " ".join(f"{sx(t):.1f},{sy(u):.1f}" for t, u in points)
        body.append(f'<polyline class="line" points="{path}"/>')
    for frac in (0, 0.5, 1):
        t = start + (end - start) * frac
        body.append(f'<text class="tick" x="{sx(t):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">'
                    f'{(t - start) / 60:.0f} min</text>')
    spent = points[-1][1] if points else 0.0
    return _frame("Spend against budget over time",
                  f"spent {money(spent)} of a {money(budget)} budget over {(end - start) / 60:.0f} minutes", body)


def bars(labels: Sequence[str], values: Sequence[float | None], colours: Sequence[str], title: str,
         unit: str) -> str:
    """Horizontal bars, one per label (missing values drawn as none)."""
    height = TOP + 28 * len(labels) + 24
    ticks = nice_ticks(max([v or 0.0 for v in values], default=0.0))
    width = W - 200 - RIGHT
    sx = lambda v: 200 + width * v / ticks[-1]  # noqa: E731
    body = []
    for t in ticks:
        body.append(f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{TOP}" y2="{height - 20}"/>'
                    f'<text class="tick" x="{sx(t):.1f}" y="{height - 6}" text-anchor="middle">{t:,.4g}</text>')
    for k, (label, value, fill) in enumerate(zip(labels, values, colours)):
        y = TOP + 28 * k
        body.append(f'<text class="tick" x="194" y="{y + 16}" text-anchor="end">{escape(label[:28])}</text>')
        if value:
            body.append(f'<rect x="200" y="{y + 4}" width="{sx(value) - 200:.1f}" height="18" fill="{fill}">'
                        f'<title>{escape(label)}: {value:,.4g} {escape(unit)}</title></rect>')
    desc = "; ".join(f"{label} {'-' if v is None else f'{v:,.4g}'} {unit}" for label, v in zip(labels, values))
    return _frame(title, desc, body, height)
