"""The starts a plan weighs for a task (scheduler_service.domain.planning): the forecast's kinks
in its window and every start on the load's slot grid, scored and sorted, lowest score first."""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta
from typing import Protocol

from scheduler_service.domain.forecast import MICROSECOND, Forecast
from scheduler_service.domain.pool_load import Load


class Startable(Protocol):
    """A task to plan (planning.PlanTask)."""

    @property
    def latest_start(self) -> datetime: ...
    @property
    def duration(self) -> timedelta: ...
    @property
    def planned(self) -> datetime | None: ...
    @property
    def caution(self) -> float | None: ...


def starts(
    task: Startable, forecast: Forecast, load: Load, earliest: datetime, caution: float
) -> list[tuple[float, int]]:
    """(score, offset) of every start worth trying in the task's window, lowest score first: the
    forecast's kinks, and (beside other runs the best free start may be just clear of one of
    them, which is no forecast point) every start on the slot grid."""
    caution = caution if task.caution is None else task.caution
    span = task.duration // MICROSECOND
    lo, hi = forecast.offset(earliest), forecast.offset(task.latest_start)
    table = _Table.of(forecast, load, span, caution)
    if table is not None and table.holds(lo, hi):
        return table.window(lo, hi, None if task.planned is None else (earliest, task.planned, task.latest_start))
    scored = forecast.scored_starts(lo, hi, span, caution)
    if task.planned is not None and earliest < task.planned <= task.latest_start:
        kept = forecast.offset(task.planned)
        scored.append((forecast.score(kept, span, -caution), kept))
    tried = {offset for _, offset in scored}
    for at in load.grid(earliest, task.latest_start):
        offset = forecast.offset(at)
        if offset not in tried:
            scored.append((forecast.score(offset, span, caution), offset))
    scored.sort()
    return scored


class _Table:
    """Every start `_starts` may weigh on one forecast and one load's grid for runs of one span
    and caution (the grid's points, the forecast's points, and the starts ending on one), scored
    once and sorted, lowest score first: a task's starts are the ones in its window, plus its
    window's ends (and its kept start). A plan of thousands of tasks of a few durations scored
    each task's window anew before (the most of a large placement's time). Made on the second
    ask for the same span and caution (a caution of each task's own makes one table a task)."""

    __slots__ = ("_caution", "_forecast", "_grid", "_kinks", "_last", "_sorted", "_span")

    _forecast: Forecast
    _grid: frozenset[int]
    _kinks: frozenset[int]
    _sorted: list[tuple[float, int]]

    def __init__(self, forecast: Forecast, load: Load, span: int, caution: float) -> None:
        self._forecast, self._span, self._caution = forecast, span, caution
        shift = load.shift(forecast.origin)
        step = load.step_us
        # The latest start the forecast covers and the grid holds; no window a plan weighs goes
        # past it.
        self._last = min(forecast.offset(forecast.end) - span, load.size * step - shift)
        self._grid = frozenset(
            o for o in (k * step - shift for k in range(-(-shift // step), load.size + 1)) if 0 <= o <= self._last
        )
        times = forecast.times
        self._kinks = frozenset(o for t in times for o in (t, t - span) if 0 <= o <= self._last)
        score = forecast.score
        self._sorted = sorted((score(o, span, caution), o) for o in self._grid | self._kinks)

    @staticmethod
    def of(forecast: Forecast, load: Load, span: int, caution: float) -> _Table | None:
        key = ("starts", id(forecast), span, caution)
        asked = load.memo.get(key)
        if asked is None:
            # The forecast is kept beside its table, so that its id is not another's meanwhile.
            load.memo[key] = (forecast, None)
            return None
        table = asked[1]
        if table is None:
            table = _Table(forecast, load, span, caution)
            load.memo[key] = (forecast, table)
        return table  # type: ignore[no-any-return]

    def holds(self, lo: int, hi: int) -> bool:
        """Whether every start of [lo, hi] worth weighing is in the table."""
        return 0 <= lo <= hi <= self._last

    def window(self, lo: int, hi: int, planned: tuple[datetime, datetime, datetime] | None) -> list[tuple[float, int]]:
        """The starts of [lo, hi], lowest score first, as `_starts` makes them: with both ends
        of the window, and a kept start (`planned`: earliest, planned, latest) scored at its
        value less the caution (instead of a grid point there that is no kink)."""
        out = [p for p in self._sorted if lo <= p[1] <= hi]
        forecast, span, caution = self._forecast, self._span, self._caution
        ends = {lo, hi} - self._grid - self._kinks
        for o in ends:
            bisect.insort(out, (forecast.score(o, span, caution), o))
        if planned is not None:
            earliest, at, latest = planned
            if earliest < at <= latest:
                kept = forecast.offset(at)
                if kept in self._grid and kept not in self._kinks and kept not in (lo, hi):
                    out.remove((forecast.score(kept, span, caution), kept))
                bisect.insort(out, (forecast.score(kept, span, -caution), kept))
        return out
