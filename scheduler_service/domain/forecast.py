"""The forecast a plan is made on: a step function of (time, value, expected error) points, with
running integrals so that the mean, and the pessimistic mean, over any window cost two binary
searches (scheduler_service.domain.planning plans on it)."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import itemgetter

MICROSECOND = timedelta(microseconds=1)
# Means are compared after rounding to this many decimals (a millionth of a gCO2/kWh), so two
# windows of equal forecast value tie, and resolve to the earlier one, even when their sums
# were taken in a different order and differ in the last bits.
DECIMALS = 6
# The most scores a forecast keeps (see Forecast._scores): some 10 MB (about 200 bytes a score).
_SCORES_KEPT = 50_000


@dataclass(frozen=True, slots=True)
class Forecast:
    """A forecast as a step function: each point's value holds until the next point's time, and
    the last one for `end` (by default one more step of the same length as the one before it,
    since the grid APIs publish intervals by their start).

    Times are kept as integer microseconds since the first point, with the running integral at
    each point, so the mean over any interval costs two binary searches whatever the horizon,
    and times computed from them are exact (a plan is never a microsecond past a latest start).
    A forecast that starts after `now` does not cover a window starting now: callers that know
    the current value prepend it as a point at `now` (the signal service's points convert with
    `(p.at, p.value)`, or `(p.at, p.value, p.expected_error)`).

    A point may state its expected relative error (one standard deviation; 0 when not given):
    `spreads` is each point's value times it, with its own running integral, so that the
    pessimistic mean of a window costs the same as its mean.
    """

    origin: datetime
    end: datetime
    times: tuple[int, ...] = field(repr=False)
    values: tuple[float, ...] = field(repr=False)
    integrals: tuple[float, ...] = field(repr=False)
    spreads: tuple[float, ...] = field(default=(), repr=False)
    spread_integrals: tuple[float, ...] = field(default=(), repr=False)
    # How much of a point's error the next point shares (a calibration learns it; None: not known).
    error_shared: float | None = None
    # Scores already taken, by (start, span, caution): a plan scores the same starts again for
    # every task of the same duration and window, in every round of a placement. Bounded.
    # Shared by the leader's planning thread and the submits planned on the event loop, with no
    # lock: each get, set and clear is one atomic step on a dict, and a score is a function of
    # its key alone, so two threads that race write the same score (or lose one to a clear, a
    # miss), and the bound is passed by one score per thread at most.
    _scores: dict[tuple[int, int, float], float] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def of(
        cls,
        points: Iterable[tuple[datetime, float] | tuple[datetime, float, float]],
        *,
        end: datetime | None = None,
        error_shared: float | None = None,
    ) -> Forecast:
        """Points (time, value) or (time, value, expected relative error) in any order; of two at
        the same time, the later in `points` wins."""
        by_time = {p[0]: (p[1], p[2] if len(p) == 3 else 0.0) for p in sorted(points, key=itemgetter(0))}
        if not by_time:
            raise ValueError("a forecast needs at least one point")
        stamps = list(by_time)
        origin = stamps[0]
        if end is None:
            end = stamps[-1] + (stamps[-1] - stamps[-2]) if len(stamps) > 1 else stamps[-1]
        if end < stamps[-1]:
            raise ValueError(f"a forecast cannot end ({end}) before its last point ({stamps[-1]})")
        times = tuple((at - origin) // MICROSECOND for at in stamps)
        values = tuple(v for v, _ in by_time.values())
        if any(e < 0 or not math.isfinite(e) for _, e in by_time.values()):
            raise ValueError("an expected error must be a finite number, 0 or more")
        spreads = tuple(v * e for v, e in by_time.values())
        if not any(spreads):
            return cls(origin, end, times, values, _integrals(times, values), error_shared=error_shared)
        spread_integrals = _integrals(times, spreads)
        return cls(origin, end, times, values, _integrals(times, values), spreads, spread_integrals, error_shared)

    def covers(self, start: datetime, end: datetime) -> bool:
        return self.origin <= start and end <= self.end

    def mean(self, start: datetime, duration: timedelta) -> float:
        """The mean forecast value over [start, start + duration]; the value at `start` for a
        zero duration. The interval must be covered."""
        return self.mean_of((start - self.origin) // MICROSECOND, duration // MICROSECOND)

    def mean_of(self, t: int, span: int) -> float:
        return _step_mean(self.times, self.values, self.integrals, t, span)

    def score(self, t: int, span: int, caution: float) -> float:
        """The pessimistic mean of [t, t + span] (rounded): the mean, plus `caution` expected
        errors. A start at the first point (the known current value, which states no error) is
        scored by its mean alone."""
        key = (t, span, caution)
        known = self._scores.get(key)
        if known is not None:
            return known
        mean = self.mean_of(t, span)
        if self.spreads and caution:
            mean += caution * _step_mean(self.times, self.spreads, self.spread_integrals, t, span)
        if len(self._scores) >= _SCORES_KEPT:
            self._scores.clear()
        score = self._scores[key] = round(mean, DECIMALS)
        return score

    def scored_starts(self, earliest: int, latest: int, span: int, caution: float) -> list[tuple[float, int]]:
        """(rounded score, start) for the starts worth scoring in [earliest, latest], in no order.

        The mean over a window of fixed length, as a function of its start, is piecewise linear
        with kinks where the start or the end crosses a forecast point (and so is the pessimistic
        mean, of a step function with the same points); so its minimum over [earliest, latest]
        is at one of those crossings or at either bound.
        """
        times = self.times
        starts = {earliest, latest}
        starts.update(times[bisect.bisect_left(times, earliest) : bisect.bisect_right(times, latest)])
        ends = times[bisect.bisect_left(times, earliest + span) : bisect.bisect_right(times, latest + span)]
        starts.update(t - span for t in ends)
        score = self.score
        return [(score(t, span, caution), t) for t in starts]

    def time_of(self, offset: int) -> datetime:
        return self.origin + offset * MICROSECOND

    def offset(self, at: datetime) -> int:
        return (at - self.origin) // MICROSECOND

    def breakpoints(self, start: datetime, end: datetime) -> list[datetime]:
        """The points' times in [start, end]: where the forecast's value changes."""
        lo = bisect.bisect_left(self.times, self.offset(start))
        hi = bisect.bisect_right(self.times, self.offset(end))
        return [self.time_of(t) for t in self.times[lo:hi]]


def _integrals(times: tuple[int, ...], values: tuple[float, ...]) -> tuple[float, ...]:
    steps = map(operator.mul, values, map(operator.sub, times[1:], times))
    return tuple(itertools.accumulate(steps, initial=0.0))


def _step_mean(
    times: tuple[int, ...], values: tuple[float, ...], integrals: tuple[float, ...], t: int, span: int
) -> float:
    i = bisect.bisect_right(times, t) - 1
    if span <= 0:
        return values[i]
    j = bisect.bisect_right(times, t + span, i) - 1
    before = integrals[i] + values[i] * (t - times[i])
    return (integrals[j] + values[j] * (t + span - times[j]) - before) / span
