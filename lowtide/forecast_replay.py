"""Re-playing a feed's record: the jobs of a recent window, each re-planned on the forecasts that
were issued, as the planner scores starts, under each way of reading the forecasts tried (a
calibration and a caution, or the bare forecasts), to learn which started them cheapest in fact.
Part of lowtide.forecast_calibration; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Protocol


class Issued(Protocol):
    """An issued forecast (lowtide.forecast_calibration.Issued)."""

    @property
    def issued_at(self) -> datetime: ...

    @property
    def points(self) -> tuple[tuple[datetime, float], ...]: ...


class Calibration(Protocol):
    """A way of reading forecasts (lowtide.forecast_calibration.Calibration)."""

    def correct(
        self,
        issued_at: datetime,
        points: Iterable[tuple[datetime, float]],
        *,
        now: datetime | None = None,
        actual: float | None = None,
    ) -> list[tuple[datetime, float, float]]: ...

    def without_profile(self) -> Calibration:
        """The same reading of the forecasts without the feed's day profile."""
        ...


# The jobs re-played to choose a caution: one every `JOB_STRIDE`, for each of these windows, over
# the last `CAUTION_WINDOW` (all of it known); fewer than MIN_JOBS and the default holds.
JOB_SLACKS = (timedelta(hours=4), timedelta(hours=8), timedelta(hours=24))
JOB_STRIDE = timedelta(hours=1)
CAUTION_WINDOW = timedelta(days=7)
MIN_JOBS = 24
_CLEARLY = 2.0
# The cautions tried on the record (below 0: a later start is worth more than its expected value,
# for the chance it comes lower still).
CAUTIONS = (-0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0)


def windowed(caution: float, slope: float, window: timedelta) -> float:
    """The caution of a task with `window` left to its latest start: `caution` for the shortest
    re-played, falling by `slope` per doubling up to the longest (the re-play plans its jobs so)."""
    shortest, longest = JOB_SLACKS[0], JOB_SLACKS[-1]
    return caution - slope * math.log2(min(max(window, shortest), longest) / shortest)


def _record(
    issued_all: Sequence[Issued], actuals: dict[datetime, float], now: datetime
) -> tuple[list[datetime], list[Issued]]:
    """The times of the values known at `now` (over the last CAUTION_WINDOW), and the forecasts
    issued by then from the newest one at the first of them on (the older ones are never the
    newest at a re-played step)."""
    times = sorted(t for t in actuals if now - CAUTION_WINDOW <= t <= now)
    issued = [f for f in issued_all if f.issued_at <= now]
    if times:
        issued = issued[max(0, bisect.bisect_right([f.issued_at for f in issued], times[0]) - 1) :]
    return times, issued


def _jobs(times: Sequence[datetime], issued: Sequence[Issued]) -> Iterator[tuple[int, Issued]]:
    """The record's jobs, one every `JOB_STRIDE` once a forecast was issued: the index of each
    one's arrival in `times`, and the forecast newest then."""
    stamps = [f.issued_at for f in issued]
    last_job: datetime | None = None
    for i, arrival in enumerate(times):
        if last_job is not None and arrival - last_job < JOB_STRIDE:
            continue
        newest = bisect.bisect_right(stamps, arrival)
        if newest == 0:
            continue
        last_job = arrival
        yield i, issued[newest - 1]


def replayed(
    issued_all: Sequence[Issued],
    actuals: dict[datetime, float],
    variants: Sequence[Calibration],
    now: datetime,
    cautions: Sequence[Sequence[tuple[float, float]]],
) -> list[tuple[timedelta, list[float]]]:
    """Each of the record's jobs (for each window of `JOB_SLACKS`): its window, and its cost under
    each variant and each of that variant's (caution, slope), each job planned at each step with
    the caution of the window it has left (`windowed`), and last on the bare forecasts."""
    times, issued = _record(issued_all, actuals, now)
    if len(times) < 2 or not issued:
        return []
    seen = [_Seen(issued, v, actuals) for v in variants]
    bare = _Seen(issued, None, actuals)
    costs: list[tuple[timedelta, list[float]]] = []
    for i, _ in _jobs(times, issued):
        arrival = times[i]
        for slack in JOB_SLACKS:
            steps = times[i : bisect.bisect_right(times, arrival + slack)]
            if steps[-1] >= arrival + slack:
                got: dict[tuple[int, float, float], float] = {}
                job = []
                for n, (v, grid) in enumerate(zip(seen, cautions, strict=True)):
                    for c, k in grid:
                        # A window no longer than the shortest has its caution at any slope.
                        key = (n, c, k if slack > JOB_SLACKS[0] else 0.0)
                        if key not in got:
                            got[key] = _replay(steps, actuals, v, c, key[2])
                        job.append(got[key])
                costs.append((slack, [*job, _replay(steps, actuals, bare, 0.0)]))
    return costs


def gaps(
    issued_all: Sequence[Issued],
    actuals: dict[datetime, float],
    calibration: Calibration,
    now: datetime,
    window: timedelta,
) -> list[float]:
    """For each of the record's jobs of this window whose forecast covered it: how far the lowest
    value that came in (arrival, arrival + window] was from the lowest the forecast showed there,
    as `calibration` read it at the arrival, in that point's expected errors (below 0: lower than
    it showed). Points stating no error say nothing of it."""
    times, issued = _record(issued_all, actuals, now)
    if len(times) < 2 or not issued:
        return []
    seen = _Seen(issued, calibration, actuals)
    out = []
    for i, newest in _jobs(times, issued):
        arrival, end = times[i], times[i] + window
        if end > times[-1] or not newest.points or newest.points[-1][0] < end:
            continue
        f = seen.at(arrival)
        ahead = range(bisect.bisect_right(f.times, arrival), bisect.bisect_right(f.times, end))
        came = [actuals[at] for at in times[i + 1 : bisect.bisect_right(times, end)]]
        if not ahead or not came:
            continue
        lowest = min(ahead, key=lambda j: f.values[j])
        if f.spreads[lowest] > 0:
            out.append((min(came) - f.values[lowest]) / f.spreads[lowest])
    return out


class _Corrected:
    """An issued forecast as a plan at some moment saw it: bias taken out, moved by the error it
    made then, each point's spread (value x learned error)."""

    __slots__ = ("spreads", "times", "values")

    def __init__(self, points: Sequence[tuple[datetime, float, float]]) -> None:
        self.times = [at for at, _, _ in points]
        self.values = [v for _, v, _ in points]
        self.spreads = [v * e for _, v, e in points]


class _Seen:
    """The newest forecast at each moment, as `_Corrected` (or as issued, without a calibration),
    computed once per moment."""

    def __init__(
        self, issued: Sequence[Issued], calibration: Calibration | None, actuals: dict[datetime, float]
    ) -> None:
        # How much caution pays is judged on the forecast's own reading: the day profile of today
        # holds the values the re-played jobs went on to see (lowtide.forecast_profile).
        self._calibration = calibration.without_profile() if calibration else None
        self._issued, self._actuals = issued, actuals
        self._stamps = [f.issued_at for f in issued]
        self._seen: dict[datetime, _Corrected] = {}

    def at(self, now: datetime) -> _Corrected:
        got = self._seen.get(now)
        if got is None:
            f = self._issued[bisect.bisect_right(self._stamps, now) - 1]
            if self._calibration is None:
                points = [(at, v, 0.0) for at, v in f.points]
            else:
                points = self._calibration.correct(f.issued_at, f.points, now=now, actual=self._actuals[now])
            got = self._seen[now] = _Corrected(points)
        return got


def _replay(
    steps: Sequence[datetime], actuals: dict[datetime, float], seen: _Seen, caution: float, slope: float = 0.0
) -> float:
    """The actual value at the start a job (arriving at steps[0], to start by steps[-1]) gets when
    re-planned at each step on the newest forecast, scored as the planner does: now at its known
    value, a later start at value + its window's caution x spread (the window left: `windowed`),
    the start planned before at value - that."""
    latest = steps[-1]
    planned: datetime | None = None
    for now in steps[:-1]:
        c = windowed(caution, slope, latest - now)
        f = seen.at(now)
        best_score, best_at = actuals[now], now
        lo = bisect.bisect_right(f.times, now)
        hi = bisect.bisect_right(f.times, latest)
        for j in range(lo, hi):
            at = f.times[j]
            sign = -c if at == planned else c
            score = f.values[j] + sign * f.spreads[j]
            if score < best_score:
                best_score, best_at = score, at
        if best_at == now:
            return actuals[now]
        planned = best_at
    return actuals[latest]


def paying(
    costs: Sequence[Sequence[float]],
    reference: int,
    among: Iterable[int] | None = None,
    independent: float | None = None,
) -> int:
    """The candidate (a column of `costs`, of `among` if given) whose jobs started cheapest, if
    clearly so: the `reference` holds unless another saves on average more than `_CLEARLY`
    standard errors of the jobs' paired differences (the record is short and its jobs overlap, so
    small differences are noise), taken over `independent` jobs (default: each job counts as
    one; lowtide.forecast_caution.independent_jobs)."""
    best, best_mean = reference, 0.0
    for c in range(len(costs[0])) if among is None else among:
        diffs = [job[c] - job[reference] for job in costs]
        mean = statistics.fmean(diffs)
        error = statistics.stdev(diffs) / math.sqrt(independent or len(diffs))
        if mean < best_mean and mean < -_CLEARLY * error:
            best, best_mean = c, mean
    return best
