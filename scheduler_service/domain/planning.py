"""Planned release: when a held task with a deadline should start, chosen on the signal's forecast.

Why it works this way: docs/architecture/holds.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from itertools import takewhile

from lowtide_proto.durations import format_duration
from scheduler_service.domain.assignment import Bidder, auction
from scheduler_service.domain.forecast import DECIMALS, MICROSECOND, Forecast
from scheduler_service.domain.pool_load import Load
from scheduler_service.domain.pool_share import contended_share
from scheduler_service.domain.starts import starts as _starts

__all__ = ["CAUTION", "Capacity", "Commitment", "Forecast", "Plan", "PlanKind", "PlanTask", "plan", "release_by"]

# A held task is released this long before its latest start, so that the claim which follows
# the release still starts it by then. A claim takes milliseconds, but a loaded machine (a disk
# flush, both cores busy) has delayed one by 300 ms; a second is also a fixed start's default
# tolerance, and costs a plan nothing it could measure.
RELEASE_LEAD = timedelta(seconds=1)

# How many standard deviations of a forecast point's expected error a start is scored above its
# forecast value (see the module's docstring); tuned on the carbon bench (`make bench`).
CAUTION = 1.0
# A caution by window is taken to this step (exact in binary: equal steps scale to equal floats).
CAUTION_STEP = 1 / 64

# The auction that shares a small pool with expected work (scheduler_service.domain.assignment):
# its bid increment as a share of the forecast's largest value (the plan is within tasks x that
# of the cheapest; tuned on the carbon bench), the bids it may make per task (about 10 are made
# on the bench, 20 at most), and the most (start, slot) pairs it weighs (beyond, the expected
# work takes room greedily, priced by what it would lose if moved).
EPSILON = 0.004
BIDS_PER_TASK = 50
AUCTION_WORK = 100_000

# The tasks one placement (scheduler_service.domain.placement) places exactly, at most: past that
# many, the most urgent (no choice of start, then the earliest latest start) are placed so,
# beside the expected work, and each of the others then takes its cheapest start with room in
# any pool it may run in (placement_bound). A plan of one pool needs no such bound: past AUCTION_WORK
# it is greedy already, one look a task (performance-log.md, "One placement's work, bounded").
EXACT_TASKS = 1000


def release_by(latest_start: datetime) -> datetime:
    """When a task with this latest start is released at the latest (plan or no plan)."""
    return latest_start - RELEASE_LEAD


@dataclass(frozen=True, slots=True)
class PlanTask:
    """A held task with a deadline. `earliest` is when it may start at all (its submission, or a
    later not-before); a deadline on the finish is turned into a latest start by `finishing_by`.
    `planned` is the start its last plan chose, if any: keeping it is scored at the forecast mean
    less its expected error, so a re-plan leaves it only for a start that is better by more than
    the noise. `caution`, when set, is the task's own (see `plan`)."""

    task_id: int
    earliest: datetime
    latest_start: datetime
    duration: timedelta
    planned: datetime | None = None
    caution: float | None = None

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
    caution: float | Callable[[timedelta], float] = CAUTION,
    expected: Iterable[PlanTask] = (),
) -> list[Plan]:
    """One plan per task, in the order given.

    `signal_low` is the threshold hold's current verdict (the signal is at or under its
    threshold): it decides the fallback for tasks no forecast covers. `caution` weighs the
    forecast's expected errors (0: plan on its values alone), the same for every task, or a
    function of the window a task has left (its latest start less now, or less its earliest when
    that is later): a start now cannot be undone, a later one is planned again, and a longer
    window holds more chances to wait for.
    `expected` are tasks expected to be submitted later (see `scheduler_service.domain.demand`):
    they are planned beside the given ones and take room in the plan, but get no plan, and never
    take a given task's room.
    """
    given = list(tasks)
    if resolution <= timedelta(0):
        raise ValueError("resolution must be positive")
    coming = [t for t in expected if t.earliest > now] if given else []
    if callable(caution):
        by_window = caution
        given, coming = ([_own(t, by_window, now) for t in ts] for ts in (given, coming))
        caution = CAUTION
    if coming:
        # Expected work arriving after the last given task's latest start competes with none.
        last = max(t.latest_start for t in given)
        coming = [t for t in coming if t.earliest <= last]
    plans = _plan(given, coming, forecast, capacity, now, signal_low=signal_low, resolution=resolution, caution=caution)
    if coming and any(p.over_capacity for p in plans):
        # The auction weighs scores, not how many tasks get room, and expected work placed
        # greedily can crowd a pending task out too: a plan beside expected work that leaves a
        # given task without the room it has in a plan of the given tasks alone is not made.
        alone = _plan(given, [], forecast, capacity, now, signal_low=signal_low, resolution=resolution, caution=caution)
        if _costs_room(plans, alone):
            return alone
    return plans


def urgency(task: PlanTask, now: datetime) -> tuple[bool, datetime, datetime, int]:
    """Tasks without a choice first, then the tightest latest start (the order `_plan` plans in)."""
    return task.latest_start > max(task.earliest, now), task.latest_start, task.earliest, task.task_id


def _scaled(task: PlanTask, caution: float, share: float) -> PlanTask:
    return replace(task, caution=(caution if task.caution is None else task.caution) * share)


def caution_of(task: PlanTask, caution: float | Callable[[timedelta], float], now: datetime) -> float:
    """The caution `task` is planned with: its own, else `caution`, which a function gives by
    the window the task has left (its latest start less now, or less its earliest when later),
    to CAUTION_STEP: tasks whose windows differ by minutes share a table of scored starts."""
    if task.caution is not None:
        return task.caution
    if not callable(caution):
        return caution
    return round(caution(task.latest_start - max(task.earliest, now)) / CAUTION_STEP) * CAUTION_STEP


def _own(task: PlanTask, caution: Callable[[timedelta], float], now: datetime) -> PlanTask:
    return task if task.caution is not None else replace(task, caution=caution_of(task, caution, now))


def _costs_room(beside: Sequence[Plan], alone: Sequence[Plan]) -> bool:
    """Whether a plan made beside expected work leaves some task without room that the plan of
    the given tasks alone has for it (both one plan per task, in the order given)."""
    return any(b.over_capacity and not a.over_capacity for b, a in zip(beside, alone, strict=True))


def _plan(
    given: Sequence[PlanTask],
    coming: Sequence[PlanTask],
    forecast: Forecast | None,
    capacity: Capacity,
    now: datetime,
    *,
    signal_low: bool,
    resolution: timedelta,
    caution: float,
) -> list[Plan]:
    """One plan per given task, in the order given, with the expected work `coming` (already
    the part of it that competes with them) taking room beside them."""
    load = Load.for_tasks([*given, *coming], capacity, now, resolution)
    if load is not None and forecast is not None:
        # The pool is contended: the caution each task is planned with is scaled to the starts
        # the tasks share (see `contended_share`).
        share = contended_share([*given, *coming], capacity.max_running, now, forecast)
        if share != 1.0:
            given, coming = ([_scaled(t, caution, share) for t in ts] for ts in (given, coming))
            caution *= share

    # Tasks without a choice first (they run when they must, room or not), then tightest latest
    # start first: a task with little slack has few starts to choose from, and a roomier task can
    # still move to its next-best window after it.
    def order(task: PlanTask) -> tuple[bool, datetime, datetime, int]:
        return urgency(task, now)

    ordered = sorted(range(len(given)), key=lambda i: order(given[i]))
    plans: dict[int, Plan] = {}
    pinned: dict[int, tuple[int, tuple[float, int]]] = {}
    if load is not None and forecast is not None and coming:
        # Tasks without a choice take their room first; the others share what is left with the
        # expected work, by auction (or, for a plan too large for one, greedily).
        for i in ordered:
            if not order(given[i])[0]:
                plans[i] = _plan_one(given[i], forecast, load, now, signal_low, caution=caution)
        chosen = [given[i] for i in ordered if i not in plans]
        got = _assign(chosen, coming, forecast, load, now=now, caution=caution)
        if got is None:
            _reserve(sorted(coming, key=order), forecast, load, now, caution)
        pinned = got or {}
    for i in ordered:
        if i not in plans:
            at = pinned.get(given[i].task_id)
            plans[i] = _plan_one(given[i], forecast, load, now, signal_low, caution=caution, pinned=at)
    return [plans[i] for i in range(len(given))]


def _assign(
    given: Sequence[PlanTask],
    coming: Sequence[PlanTask],
    forecast: Forecast,
    load: Load,
    *,
    now: datetime,
    caution: float,
) -> dict[int, tuple[int, tuple[float, int]]] | None:
    """The start (offset) the auction gives each given task with a choice, and its best (score,
    offset), by task id, with the expected work bidding beside them (see
    `scheduler_service.domain.assignment`); None when the plan is too large for an auction."""
    bidders: list[Bidder] = []
    work = 0
    starts_of: dict[int, list[tuple[float, int]]] = {}
    for n, task in enumerate([*given, *coming]):
        earliest = max(task.earliest, now)
        if task.latest_start <= earliest or not forecast.covers(earliest, task.latest_start + task.duration):
            continue
        starts = _starts(task, forecast, load, earliest, caution)
        span, shift = task.duration // MICROSECOND, load.shift(forecast.origin)
        options = [(score, load.slots_at(o + shift, o + shift + span)) for score, o in starts]
        work += sum(len(slots) for _, slots in options)
        if work > AUCTION_WORK:
            return None
        bidders.append(Bidder(n, options, droppable=n >= len(given)))
        starts_of[n] = starts
    scale = max((abs(v) for v in forecast.values), default=0.0) or 1.0
    got = auction(bidders, load.room(), epsilon=EPSILON * scale, max_bids=BIDS_PER_TASK * len(bidders))
    return {given[n].task_id: (starts_of[n][option][1], starts_of[n][0]) for n, option in got.items() if n < len(given)}


def _reserve(coming: Sequence[PlanTask], forecast: Forecast, load: Load, now: datetime, caution: float) -> None:
    """Plans the expected work (tightest latest start first, each at its cheapest start with
    room), and prices the room each takes by what it would lose if moved: the score of its best
    start still free, less its own (the window's dearest start when none is free). A given task
    takes that room only when its other starts are dearer than its own by more than that."""
    placed: list[tuple[PlanTask, list[tuple[float, int]], int, float]] = []
    # Starts as microseconds since the load's anchor (its `*_at` methods), not datetimes: the
    # same slots, for a fraction of the arithmetic.
    shift = load.shift(forecast.origin)
    for task in coming:
        earliest = max(task.earliest, now)
        if task.latest_start < earliest or not forecast.covers(earliest, task.latest_start + task.duration):
            continue
        span = task.duration // MICROSECOND
        scored = _starts(task, forecast, load, earliest, caution)
        fit = load.first_fit(scored, shift, span)
        if fit is not None:
            score, offset = fit
            at = forecast.time_of(offset)
            load.add(at, at + task.duration, firm=False)
            placed.append((task, scored, offset, score))
    for task, scored, offset, score in placed:
        free = load.first_fit((p for p in scored if p[1] != offset), shift, task.duration // MICROSECOND)
        at = forecast.time_of(offset)
        load.price_held(at, at + task.duration, (scored[-1][0] if free is None else free[0]) - score)


def _plan_one(
    task: PlanTask,
    forecast: Forecast | None,
    load: Load | None,
    now: datetime,
    signal_low: bool,
    *,
    caution: float,
    pinned: tuple[int, tuple[float, int]] | None = None,
) -> Plan:
    caution = caution if task.caution is None else task.caution
    earliest = max(task.earliest, now)
    latest = task.latest_start
    if latest <= earliest:
        # Never after the latest start, and never before now: a latest start already passed
        # means at once.
        at = max(now, latest)
        expected = None
        if forecast is not None and forecast.covers(at, at + task.duration):
            expected = round(forecast.mean(at, task.duration), DECIMALS)
        if load is not None:
            load.take(at, at + task.duration)
        reason = f"no slack: the latest start {_t(latest)} is not after the earliest {_t(earliest)}"
        return Plan(task.task_id, at, expected, PlanKind.NO_SLACK, reason)
    if forecast is None or not forecast.covers(earliest, latest + task.duration):
        return threshold_plan(task, forecast, earliest, signal_low)

    span = task.duration // MICROSECOND
    if load is None:
        scored = forecast.scored_starts(forecast.offset(earliest), forecast.offset(latest), span, caution)
        if task.planned is not None and earliest < task.planned <= latest:
            kept = forecast.offset(task.planned)
            scored.append((forecast.score(kept, span, -caution), kept))
        # Lowest score first, and of equal scores the earliest start.
        return forecast_plan(task, forecast, min(scored)[1], earliest)
    if pinned is not None and load.fits(
        forecast.time_of(pinned[0]), forecast.time_of(pinned[0]) + task.duration, firm_only=True
    ):
        # The auction's start (it had room for it).
        (offset, (best_score, best)) = pinned
        at = forecast.time_of(offset)
        load.take(at, at + task.duration)
        full = "" if offset == best else f"; the pool is wanted more at {_t(forecast.time_of(best))} ({best_score:g})"
        return forecast_plan(task, forecast, offset, earliest, note=full)
    scored = _starts(task, forecast, load, earliest, caution)
    best_score, best = scored[0]
    shift = load.shift(forecast.origin)
    # The cheapest start with room, counting as dear the room expected work was planned in.
    chosen: tuple[float, int] | None = None
    ahead = iter(scored)

    def cheaper(start: tuple[float, int]) -> bool:
        return chosen is None or start[0] < chosen[0]

    # Each start with room, lowest score first, until the scores reach the cheapest cost found.
    while (fit := load.first_fit(takewhile(cheaper, ahead), shift, span, firm_only=True)) is not None:
        score, offset = fit
        cost = round(score + load.price_at(offset + shift, offset + shift + span), DECIMALS)
        chosen = min(chosen or (cost, offset), (cost, offset))
    if chosen is not None:
        at = forecast.time_of(chosen[1])
        load.take(at, at + task.duration)
        full = "" if chosen[1] == best else f"; the pool is full at {_t(forecast.time_of(best))} ({best_score:g})"
        return forecast_plan(task, forecast, chosen[1], earliest, note=full)
    # No room anywhere in the window: release where the load is least (the earliest such start),
    # so the task queues for a slot before its latest start instead of being planned past it.
    offset = load.least_loaded((o for _, o in scored), shift, span, firm_only=True)
    at = forecast.time_of(offset)
    load.take(at, at + task.duration)
    value = round(forecast.mean(at, task.duration), DECIMALS)
    reason = f"the pool (capacity {load.capacity}) is full throughout [{_t(earliest)}, {_t(latest)}]"
    return Plan(task.task_id, at, value, PlanKind.FORECAST, reason + "; released where it is least loaded", True)


def forecast_plan(task: PlanTask, forecast: Forecast, offset: int, earliest: datetime, *, note: str = "") -> Plan:
    at = forecast.time_of(offset)
    value = round(forecast.mean_of(offset, task.duration // MICROSECOND), DECIMALS)
    window = f"[{_t(earliest)}, {_t(task.latest_start)}]"
    reason = f"lowest forecast mean {value:g} over {format_duration(task.duration)} for a start in {window}"
    if forecast.spreads:
        reason = f"lowest forecast mean {value:g} (allowing for its expected error) over"
        reason += f" {format_duration(task.duration)} for a start in {window}"
    return Plan(task.task_id, at, value, PlanKind.FORECAST, reason + note)


def threshold_plan(task: PlanTask, forecast: Forecast | None, earliest: datetime, signal_low: bool) -> Plan:
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
