"""Spend over time, cut from the ledger without a second arithmetic.

Every amount here is `cloudtrain.cost.spend` over the same billed intervals `cost` sums. A day's
(or a moment's) share is the difference of one interval's spend up to two instants: the running
total up to a boundary, minus the running total up to the previous one. Those differences add up,
exactly, to `spend(interval, since, now)`, so the days of a chart always sum to `cost --json`'s
`total_usd` (a start's minimum billed time lands on the day it started, as the cloud bills it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cloudtrain.cost import spend
from cloudtrain.state import BillingRecord

DAY_S = 86400.0


def spent_by(item: BillingRecord, since: float, until: float) -> float:
    """What `item` billed from `since` up to `until` (0 before it started): `spend` on that one interval.
    An interval that starts after `until` has billed nothing yet, not its minimum."""
    if item.started_at >= until:
        return 0.0
    return spend([item], since=since, until=until).usd


def _last_billed(item: BillingRecord, now: float) -> float:
    """The last instant at which the running total of `item` still grows (its minimum included)."""
    end = now if item.ended_at is None else min(item.ended_at, now)
    return max(end, item.started_at + item.min_s)


@dataclass(frozen=True)
class Daily:
    """Spend per UTC day per series: `days` are the epochs of each day's 00:00 UTC, and each
    series' list holds one amount per day."""

    days: tuple[float, ...]
    series: dict[str, list[float]]

    def total(self) -> float:
        return sum(sum(values) for values in self.series.values())

    def top(self, keep: int, other: str = "other") -> Daily:
        """The `keep` largest series, the rest summed into `other` (a chart's legend stays readable)."""
        ranked = sorted(self.series, key=lambda k: -sum(self.series[k]))
        if len(ranked) <= keep + 1:
            return Daily(self.days, {k: self.series[k] for k in ranked})
        kept = {k: self.series[k] for k in ranked[:keep]}
        rest = [sum(self.series[k][i] for k in ranked[keep:]) for i in range(len(self.days))]
        return Daily(self.days, {**kept, other: rest})


def daily(intervals: Iterable[BillingRecord], since: float, now: float,
          key: Callable[[BillingRecord], str]) -> Daily:
    """Each interval's spend from `since` to `now`, cut at each UTC midnight and summed per `key`."""
    items = list(intervals)
    if not items:
        return Daily((), {})
    first_day = int(max(min(i.started_at for i in items), since) // DAY_S)
    last_day = int(now // DAY_S)
    days = tuple(float(d * DAY_S) for d in range(first_day, last_day + 1))
    series: dict[str, list[float]] = {}
    for item in items:
        values = series.setdefault(key(item), [0.0] * len(days))
        start_day = int(max(item.started_at, since) // DAY_S)
        end_day = min(int(_last_billed(item, now) // DAY_S), last_day)
        before = 0.0
        for day in range(max(start_day, first_day), end_day + 1):
            boundary = now if day == last_day else min((day + 1) * DAY_S, now)
            if day == end_day:
                boundary = now  # the total at `now`: what `cost` counts, to the last cent
            upto = spent_by(item, since, boundary)
            values[day - first_day] += upto - before
            before = upto
    return Daily(days, series)


@dataclass(frozen=True)
class Point:
    at: float
    usd: float  # spent up to `at`


def cumulative(intervals: Sequence[BillingRecord], now: float) -> list[Point]:
    """The running total of `intervals` at every start and end (and `now`): a line of spend over time
    whose last point is `spend(intervals, until=now)`, what a sweep's ledger says it spent."""
    if not intervals:
        return []
    moments = sorted({i.started_at for i in intervals}
                     | {min(_last_billed(i, now), now) for i in intervals} | {now})
    return [Point(t, sum(spent_by(i, 0.0, t) for i in intervals)) for t in moments if t <= now]
