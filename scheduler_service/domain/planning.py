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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from lowtide_proto.durations import format_duration
from scheduler_service.domain.forecast import _DECIMALS, _US, Forecast

__all__ = ["CAUTION", "Capacity", "Commitment", "Forecast", "Plan", "PlanKind", "PlanTask", "plan", "release_by"]

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
    expected: Iterable[PlanTask] = (),
) -> list[Plan]:
    """One plan per task, in the order given.

    `signal_low` is the threshold hold's current verdict (the signal is at or under its
    threshold): it decides the fallback for tasks no forecast covers. `caution` weighs the
    forecast's expected errors (0: plan on its values alone). `expected` are tasks expected to
    be submitted later (see `scheduler_service.domain.demand`): they are planned beside the
    given ones and take room in the plan, but get no plan, and never take a given task's room.
    """
    given = list(tasks)
    if resolution <= timedelta(0):
        raise ValueError("resolution must be positive")
    coming = [t for t in expected if t.earliest > now] if given else []
    if coming:
        # Expected work arriving after the last given task's latest start competes with none.
        last = max(t.latest_start for t in given)
        coming = [t for t in coming if t.earliest <= last]
    load = _Load.for_tasks(given + coming, capacity, now, resolution)

    # Tasks without a choice first (they run when they must, room or not), then tightest latest
    # start first: a task with little slack has few starts to choose from, and a roomier task can
    # still move to its next-best window after it.
    def order(task: PlanTask) -> tuple[bool, datetime, datetime, int]:
        return task.latest_start > max(task.earliest, now), task.latest_start, task.earliest, task.task_id

    if load is not None and forecast is not None and coming:
        _reserve(sorted(coming, key=order), forecast, load, now, caution)
    plans = {
        i: _plan_one(given[i], forecast, load, now, signal_low, caution=caution)
        for i in sorted(range(len(given)), key=lambda i: order(given[i]))
    }
    return [plans[i] for i in range(len(given))]


def _starts(
    task: PlanTask, forecast: Forecast, load: _Load, earliest: datetime, caution: float
) -> list[tuple[float, int]]:
    """(score, offset) of every start worth trying in the task's window, lowest score first: the
    forecast's kinks, and (beside other runs the best free start may be just clear of one of
    them, which is no forecast point) every start on the slot grid."""
    span = task.duration // _US
    scored = forecast._scored_starts(forecast._offset(earliest), forecast._offset(task.latest_start), span, caution)
    if task.planned is not None and earliest < task.planned <= task.latest_start:
        kept = forecast._offset(task.planned)
        scored.append((forecast._score(kept, span, -caution), kept))
    tried = {offset for _, offset in scored}
    for at in load.grid(earliest, task.latest_start):
        offset = forecast._offset(at)
        if offset not in tried:
            scored.append((forecast._score(offset, span, caution), offset))
    scored.sort()
    return scored


def _reserve(coming: Sequence[PlanTask], forecast: Forecast, load: _Load, now: datetime, caution: float) -> None:
    """Plans the expected work (tightest latest start first, each at its cheapest start with
    room), and prices the room each takes by what it would lose if moved: the score of its best
    start still free, less its own (the window's dearest start when none is free). A given task
    takes that room only when its other starts are dearer than its own by more than that."""
    placed: list[tuple[PlanTask, list[tuple[float, int]], int, float]] = []
    for task in coming:
        earliest = max(task.earliest, now)
        if task.latest_start < earliest or not forecast.covers(earliest, task.latest_start + task.duration):
            continue
        scored = _starts(task, forecast, load, earliest, caution)
        for score, offset in scored:
            at = forecast._time(offset)
            if load.fits(at, at + task.duration):
                load.add(at, at + task.duration, firm=False)
                placed.append((task, scored, offset, score))
                break
    for task, scored, offset, score in placed:
        free = (s for s, o in scored if o != offset and load.fits(forecast._time(o), forecast._time(o) + task.duration))
        at = forecast._time(offset)
        load.price_held(at, at + task.duration, next(free, scored[-1][0]) - score)


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
            load.take(at, at + task.duration)
        reason = f"no slack: the latest start {_t(latest)} is not after the earliest {_t(earliest)}"
        return Plan(task.task_id, at, expected, PlanKind.NO_SLACK, reason)
    if forecast is None or not forecast.covers(earliest, latest + task.duration):
        return _threshold_plan(task, forecast, earliest, signal_low)

    span = task.duration // _US
    if load is None:
        scored = forecast._scored_starts(forecast._offset(earliest), forecast._offset(latest), span, caution)
        if task.planned is not None and earliest < task.planned <= latest:
            kept = forecast._offset(task.planned)
            scored.append((forecast._score(kept, span, -caution), kept))
        # Lowest score first, and of equal scores the earliest start.
        return _forecast_plan(task, forecast, min(scored)[1], earliest)
    scored = _starts(task, forecast, load, earliest, caution)
    best_score, best = scored[0]
    # The cheapest start with room, counting as dear the room expected work was planned in.
    chosen: tuple[float, int] | None = None
    for score, offset in scored:
        if chosen is not None and score >= chosen[0]:
            break
        at = forecast._time(offset)
        if load.fits(at, at + task.duration, firm_only=True):
            cost = round(score + load.price(at, at + task.duration), _DECIMALS)
            chosen = min(chosen or (cost, offset), (cost, offset))
    if chosen is not None:
        at = forecast._time(chosen[1])
        load.take(at, at + task.duration)
        full = "" if chosen[1] == best else f"; the pool is full at {_t(forecast._time(best))} ({best_score:g})"
        return _forecast_plan(task, forecast, chosen[1], earliest, note=full)
    # No room anywhere in the window: release where the load is least (the earliest such start),
    # so the task queues for a slot before its latest start instead of being planned past it.
    starts = [forecast._time(offset) for _, offset in scored]
    at = min(starts, key=lambda a: (load.peak(a, a + task.duration, firm_only=True), a))
    load.take(at, at + task.duration)
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
        # Every planned run, and the given tasks' and commitments' alone (not expected work).
        self._counts = [0] * slots
        self._firm = [0] * slots
        # Per slot, what each expected run in it would lose if moved (see `_reserve`).
        self._held: list[list[float]] = [[] for _ in range(slots)]

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

    def add(self, start: datetime, end: datetime, count: int = 1, *, firm: bool = True) -> None:
        for i in self._span(start, end):
            self._counts[i] += count
            if firm:
                self._firm[i] += count

    def price_held(self, start: datetime, end: datetime, loss: float) -> None:
        for i in self._span(start, end):
            self._held[i].append(loss)

    def price(self, start: datetime, end: datetime) -> float:
        """What a given run over [start, end) costs the expected work it would displace: in each
        slot with no room but for expected runs, the least any of them would lose."""
        return sum(
            min(self._held[i]) for i in self._span(start, end) if self._held[i] and self._counts[i] >= self.capacity
        )

    def take(self, start: datetime, end: datetime) -> None:
        """A given run: where the slot is full with expected runs, the cheapest to move gives way."""
        for i in self._span(start, end):
            held = self._held[i]
            if held and self._counts[i] >= self.capacity:
                held.remove(min(held))
                self._counts[i] -= 1
        self.add(start, end)

    def peak(self, start: datetime, end: datetime, *, firm_only: bool = False) -> int:
        span = self._span(start, end)
        counts = self._firm if firm_only else self._counts
        return max(counts[span.start : span.stop], default=0)

    def fits(self, start: datetime, end: datetime, *, firm_only: bool = False) -> bool:
        return self.peak(start, end, firm_only=firm_only) < self.capacity

    def grid(self, earliest: datetime, latest: datetime) -> list[datetime]:
        first = -((self._anchor - earliest) // self._step)
        last = (latest - self._anchor) // self._step
        return [self._anchor + k * self._step for k in range(first, last + 1)]
