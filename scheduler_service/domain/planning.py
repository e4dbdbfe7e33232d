"""Planned release: when a held task with a deadline should start, chosen on the signal's forecast.

A threshold hold releases work at the first moment the signal dips under a threshold, which on a
real grid is rarely the cheapest moment before the deadline. With a forecast the scheduler can do
better: it picks, for each task, the start in [earliest, latest start] whose forecast mean
intensity over the task's estimated duration is lowest.

Many tasks tend to pick the same cheap window, so planning is capacity-aware: tasks are planned
one by one, tightest latest start first (the ones with the fewest options choose first), each
taking the cheapest start where the pool still has room; a full window sends a task to its next
cheapest one. Room is counted on slots of `resolution`, and a task occupies every slot it
touches, so the pool is never over-booked by rounding.

A forecast is not the future, and the further ahead the more it is off. Picking the lowest of
many noisy values picks, more often than not, one that only looks low because of its noise (the
winner's curse), and re-planning on each new forecast compares the exactly known current value
with such values again and again, so tasks keep waiting for windows that never come. So when the
forecast states its expected error at each point (one standard deviation, relative), a start is
scored not by its forecast mean but by a pessimistic one, mean + caution x sigma (per point, the
value times 1 + caution x its expected error): waiting must be expected to save more than the
noise would make it seem to. The current value is known, so starting now is scored as it is. A
forecast that states no error (or zero) is planned on as before.

Without a forecast that covers a task's window the plan falls back to the threshold hold, still
bounded by the latest start; such a task takes no room in the plan, since when it will run is
not known. Nothing here does I/O and nothing is remembered between calls: a plan is a function
of the forecast, the tasks, the capacity and `now`, so re-planning on a new forecast is calling
`plan` again with it.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from operator import itemgetter

from lowtide_proto.durations import format_duration

_US = timedelta(microseconds=1)
# Means are compared after rounding to this many decimals (a millionth of a gCO2/kWh), so two
# windows of equal forecast value tie, and resolve to the earlier one, even when their sums
# were taken in a different order and differ in the last bits.
_DECIMALS = 6

# A held task is released this long before its latest start, so that the claim which follows
# the release (a few milliseconds) still starts it by then: one scheduling step.
RELEASE_LEAD = timedelta(milliseconds=50)

# How many standard deviations of a forecast point's expected error a start is scored above its
# forecast value (see the module's docstring); tuned on the carbon bench (`make bench`).
CAUTION = 1.0


def release_by(latest_start: datetime) -> datetime:
    """When a task with this latest start is released at the latest (plan or no plan)."""
    return latest_start - RELEASE_LEAD


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

    @classmethod
    def of(
        cls, points: Iterable[tuple[datetime, float] | tuple[datetime, float, float]], *, end: datetime | None = None
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
        times = tuple((at - origin) // _US for at in stamps)
        values = tuple(v for v, _ in by_time.values())
        if any(e < 0 or not math.isfinite(e) for _, e in by_time.values()):
            raise ValueError("an expected error must be a finite number, 0 or more")
        spreads = tuple(v * e for v, e in by_time.values())
        if not any(spreads):
            return cls(origin, end, times, values, _integrals(times, values))
        return cls(origin, end, times, values, _integrals(times, values), spreads, _integrals(times, spreads))

    def covers(self, start: datetime, end: datetime) -> bool:
        return self.origin <= start and end <= self.end

    def mean(self, start: datetime, duration: timedelta) -> float:
        """The mean forecast value over [start, start + duration]; the value at `start` for a
        zero duration. The interval must be covered."""
        return self._mean((start - self.origin) // _US, duration // _US)

    def _mean(self, t: int, span: int) -> float:
        return _step_mean(self.times, self.values, self.integrals, t, span)

    def _score(self, t: int, span: int, caution: float) -> float:
        """The pessimistic mean of [t, t + span] (rounded): the mean, plus `caution` expected
        errors. A start at the first point (the known current value, which states no error) is
        scored by its mean alone."""
        mean = self._mean(t, span)
        if self.spreads and caution:
            mean += caution * _step_mean(self.times, self.spreads, self.spread_integrals, t, span)
        return round(mean, _DECIMALS)

    def _scored_starts(self, earliest: int, latest: int, span: int, caution: float) -> list[tuple[float, int]]:
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
        score = self._score
        return [(score(t, span, caution), t) for t in starts]

    def _time(self, offset: int) -> datetime:
        return self.origin + offset * _US

    def _offset(self, at: datetime) -> int:
        return (at - self.origin) // _US

    def breakpoints(self, start: datetime, end: datetime) -> list[datetime]:
        """The points' times in [start, end]: where the forecast's value changes."""
        lo = bisect.bisect_left(self.times, self._offset(start))
        hi = bisect.bisect_right(self.times, self._offset(end))
        return [self._time(t) for t in self.times[lo:hi]]


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


@dataclass(frozen=True, slots=True)
class PlanTask:
    """A held task with a deadline. `earliest` is when it may start at all (its submission, or a
    later not-before); a deadline on the finish is turned into a latest start by `finishing_by`.
    `planned` is the start its last plan chose, if any: keeping it is scored on the forecast mean
    alone, so a re-plan leaves it only for a start that is better even allowing for the error."""

    task_id: int
    earliest: datetime
    latest_start: datetime
    duration: timedelta
    planned: datetime | None = None

    def __post_init__(self) -> None:
        if self.duration < timedelta(0):
            raise ValueError(f"task {self.task_id}: a duration cannot be negative ({self.duration})")

    @classmethod
    def finishing_by(cls, task_id: int, earliest: datetime, finish_by: datetime, duration: timedelta) -> PlanTask:
        return cls(task_id, earliest, finish_by - duration, duration)


@dataclass(frozen=True, slots=True)
class Commitment:
    """Capacity already spoken for over [start, end): fixed-start reservations, or running work
    until its estimated end."""

    start: datetime
    end: datetime
    count: int = 1


@dataclass(frozen=True, slots=True)
class Capacity:
    max_running: int
    committed: tuple[Commitment, ...] = ()


class PlanKind(StrEnum):
    # Released at release_at, the cheapest start on the forecast where the pool has room.
    FORECAST = "forecast"
    # No choice of start: the latest start is not after the earliest (or has passed).
    NO_SLACK = "no_slack"
    # No forecast covers the window: the threshold hold applies, bounded by release_at.
    THRESHOLD = "threshold"


@dataclass(frozen=True, slots=True)
class Plan:
    task_id: int
    release_at: datetime
    # The forecast mean over the planned run; None when no forecast covers it.
    expected_intensity: float | None
    kind: PlanKind
    reason: str
    # True when no start in the window had room: the task is released at the start with the
    # least load and will queue behind other work rather than be planned past its latest start.
    over_capacity: bool = False


def plan(
    tasks: Iterable[PlanTask],
    forecast: Forecast | None,
    capacity: Capacity,
    now: datetime,
    *,
    signal_low: bool,
    resolution: timedelta = timedelta(minutes=5),
    caution: float = CAUTION,
) -> list[Plan]:
    """One plan per task, in the order given.

    `signal_low` is the threshold hold's current verdict (the signal is at or under its
    threshold): it decides the fallback for tasks no forecast covers. `caution` weighs the
    forecast's expected errors (0: plan on its values alone).
    """
    given = list(tasks)
    if resolution <= timedelta(0):
        raise ValueError("resolution must be positive")
    load = _Load.for_tasks(given, capacity, now, resolution)

    # Tasks without a choice first (they run when they must, room or not), then tightest latest
    # start first: a task with little slack has few starts to choose from, and a roomier task can
    # still move to its next-best window after it.
    def order(index: int) -> tuple[bool, datetime, datetime, int]:
        task = given[index]
        return task.latest_start > max(task.earliest, now), task.latest_start, task.earliest, task.task_id

    plans = {
        i: _plan_one(given[i], forecast, load, now, signal_low, caution=caution)
        for i in sorted(range(len(given)), key=order)
    }
    return [plans[i] for i in range(len(given))]


def _plan_one(
    task: PlanTask, forecast: Forecast | None, load: _Load | None, now: datetime, signal_low: bool, *, caution: float
) -> Plan:
    earliest = max(task.earliest, now)
    latest = task.latest_start
    if latest <= earliest:
        # Never after the latest start, and never before now: a latest start already passed
        # means at once.
        at = max(now, latest)
        expected = None
        if forecast is not None and forecast.covers(at, at + task.duration):
            expected = round(forecast.mean(at, task.duration), _DECIMALS)
        if load is not None:
            load.add(at, at + task.duration)
        reason = f"no slack: the latest start {_t(latest)} is not after the earliest {_t(earliest)}"
        return Plan(task.task_id, at, expected, PlanKind.NO_SLACK, reason)
    if forecast is None or not forecast.covers(earliest, latest + task.duration):
        return _threshold_plan(task, forecast, earliest, signal_low)

    span = task.duration // _US
    scored = forecast._scored_starts(forecast._offset(earliest), forecast._offset(latest), span, caution)
    if task.planned is not None and earliest < task.planned <= latest:
        kept = forecast._offset(task.planned)
        scored.append((round(forecast._mean(kept, span), _DECIMALS), kept))
    # Lowest score first, and of equal scores the earliest start.
    best_score, best = min(scored)
    if load is None:
        return _forecast_plan(task, forecast, best, earliest)
    # Beside other runs the best free start may be just clear of one of them, which is no
    # forecast point: every start on the slot grid is scored too.
    tried = {offset for _, offset in scored}
    for at in load.grid(earliest, latest):
        offset = forecast._offset(at)
        if offset not in tried:
            scored.append((forecast._score(offset, span, caution), offset))
    scored.sort()
    best_at = forecast._time(best)
    for _, offset in scored:
        at = forecast._time(offset)
        if load.fits(at, at + task.duration):
            load.add(at, at + task.duration)
            full = "" if offset == best else f"; the pool is full at {_t(best_at)} ({best_score:g})"
            return _forecast_plan(task, forecast, offset, earliest, note=full)
    # No room anywhere in the window: release where the load is least (the earliest such start),
    # so the task queues for a slot before its latest start instead of being planned past it.
    starts = [forecast._time(offset) for _, offset in scored]
    at = min(starts, key=lambda a: (load.peak(a, a + task.duration), a))
    load.add(at, at + task.duration)
    value = round(forecast.mean(at, task.duration), _DECIMALS)
    reason = f"the pool (capacity {load.capacity}) is full throughout [{_t(earliest)}, {_t(latest)}]"
    return Plan(task.task_id, at, value, PlanKind.FORECAST, reason + "; released where it is least loaded", True)


def _forecast_plan(task: PlanTask, forecast: Forecast, offset: int, earliest: datetime, *, note: str = "") -> Plan:
    at = forecast._time(offset)
    value = round(forecast._mean(offset, task.duration // _US), _DECIMALS)
    window = f"[{_t(earliest)}, {_t(task.latest_start)}]"
    reason = f"lowest forecast mean {value:g} over {format_duration(task.duration)} for a start in {window}"
    if forecast.spreads:
        reason = f"lowest forecast mean {value:g} (allowing for its expected error) over"
        reason += f" {format_duration(task.duration)} for a start in {window}"
    return Plan(task.task_id, at, value, PlanKind.FORECAST, reason + note)


def _threshold_plan(task: PlanTask, forecast: Forecast | None, earliest: datetime, signal_low: bool) -> Plan:
    if forecast is None:
        missing = "no forecast"
    else:
        missing = f"the forecast ({_t(forecast.origin)} to {_t(forecast.end)}) does not cover the window"
    if signal_low:
        return Plan(task.task_id, earliest, None, PlanKind.THRESHOLD, f"{missing}; the signal is under its threshold")
    reason = f"{missing}; held until the signal falls under its threshold, at the latest {_t(task.latest_start)}"
    return Plan(task.task_id, task.latest_start, None, PlanKind.THRESHOLD, reason)


def _t(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")


class _Load:
    """Tasks per slot of `resolution`, from a grid anchored at `now` rounded down to a multiple of
    the resolution since midnight UTC, so that slots line up with the grid's half hours."""

    def __init__(self, capacity: int, anchor: datetime, resolution: timedelta, slots: int) -> None:
        self.capacity = capacity
        self._anchor = anchor
        self._step = resolution
        self._counts = [0] * slots

    @classmethod
    def for_tasks(
        cls, tasks: Sequence[PlanTask], capacity: Capacity, now: datetime, resolution: timedelta
    ) -> _Load | None:
        """None when the pool cannot run out of room (everything fits at once), which spares
        the bookkeeping in the common case of a few held tasks."""
        if capacity.max_running >= len(tasks) + sum(c.count for c in capacity.committed):
            return None
        midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        anchor = midnight + ((now - midnight) // resolution) * resolution
        horizon = max((max(t.latest_start, now) + t.duration for t in tasks), default=now)
        load = cls(capacity.max_running, anchor, resolution, math.ceil((horizon - anchor) / resolution) + 1)
        for commitment in capacity.committed:
            load.add(commitment.start, commitment.end, commitment.count)
        return load

    def _span(self, start: datetime, end: datetime) -> range:
        """The slots [start, end) touches; a run of zero length still takes the slot it is in."""
        first = (start - self._anchor) // self._step
        last = max(first + 1, -((self._anchor - end) // self._step))
        return range(max(0, first), min(len(self._counts), last))

    def add(self, start: datetime, end: datetime, count: int = 1) -> None:
        for i in self._span(start, end):
            self._counts[i] += count

    def peak(self, start: datetime, end: datetime) -> int:
        span = self._span(start, end)
        return max(self._counts[span.start : span.stop], default=0)

    def fits(self, start: datetime, end: datetime) -> bool:
        return self.peak(start, end) < self.capacity

    def grid(self, earliest: datetime, latest: datetime) -> list[datetime]:
        first = -((self._anchor - earliest) // self._step)
        last = (latest - self._anchor) // self._step
        return [self._anchor + k * self._step for k in range(first, last + 1)]
