"""The bound on one placement's work (scheduler_service.domain.placement): the `exact` most urgent
tasks (no choice of start first, then the earliest latest start) are placed as a placement of
them alone is, beside the work expected later; each of the others, most urgent first, then takes
the cheapest start with room (in the room the urgent ones and the others before it left) in any
pool it may run in, with no expected work and no auction. A placement's cost then grows with the
backlog by one greedy look a task, not with the two rounds' (5,000 tasks in two pools over 24 h,
placed exactly: 7.4 s of CPU, against about 1 s so). The tasks past the bound are the ones that
can wait longest: they are placed again on every pass, and exactly once they are among the most
urgent, long before their latest start. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol

from scheduler_service.domain import pool_auction
from scheduler_service.domain.forecast import DECIMALS, MICROSECOND
from scheduler_service.domain.planning import (
    Capacity,
    Commitment,
    Plan,
    PlanKind,
    PlanTask,
    caution_of,
    forecast_plan,
    threshold_plan,
    urgency,
)
from scheduler_service.domain.pool_load import Load
from scheduler_service.domain.starts import starts


class Task(Protocol):
    """A task to place (placement.PlaceTask)."""

    @property
    def task(self) -> PlanTask: ...
    @property
    def regions(self) -> tuple[str, ...]: ...
    @property
    def region(self) -> str | None: ...


class Pool(pool_auction.Pool, Protocol):
    """A pool (placement.Region): the auction's, and whether its signal is low."""

    @property
    def signal_low(self) -> bool: ...


def split(given: Sequence[Task], now: datetime, exact: int) -> tuple[list[int], list[int]]:
    """The indexes of the tasks placed exactly and of the others (most urgent first): the `exact`
    most urgent, and every task with no choice of start whatever their number."""
    order = sorted(range(len(given)), key=lambda i: urgency(given[i].task, now))
    cut = max(exact, sum(1 for i in order if not urgency(given[i].task, now)[0]))
    return order[:cut], order[cut:]


def greedily(
    tasks: Sequence[Task],
    pools: Sequence[Pool],
    runs: Mapping[str, Sequence[Commitment]],
    *,
    now: datetime,
    resolution: timedelta,
    exact: int,
    choose: Callable[[Task, tuple[str, ...], Mapping[str, float]], str],
) -> list[tuple[str, Plan, dict[str, float]]]:
    """The pool, plan and what each allowed pool could give (the score of its best start, room
    for all) of each task (given most urgent first): the cheapest start with room of the pools it
    may run in, beside the `runs` already placed there (by pool). With room in none it goes to the
    pool `choose` picks (placement's choice by what each could give), at its cheapest start in a
    pool with no workers, else held to its latest start; it is placed again on the next pass."""
    by_name = {p.name: p for p in pools}
    loads: dict[str, tuple[Load, int]] = {}
    for pool in pools:
        if pool.capacity.max_running > 0 and pool.forecast is not None:
            room = Capacity(pool.capacity.max_running, (*pool.capacity.committed, *runs.get(pool.name, ())))
            load = Load.covering([t.task for t in tasks], room, now, resolution)
            loads[pool.name] = (load, load.shift(pool.forecast.origin))
    note = f"; past the {exact} most urgent tasks: the cheapest start with room in any pool it may run in"
    out = []
    for t in tasks:
        task = replace(t.task, planned=None)
        names = t.regions or tuple(by_name)
        earliest, span = max(task.earliest, now), task.duration // MICROSECOND
        best: dict[str, float] = dict.fromkeys(names, math.inf)
        # The cheapest start with room in each open pool, and each closed pool's cheapest start.
        found: list[tuple[float, bool, int, str, int]] = []
        roomy: dict[str, int] = {}
        for rank, name in enumerate(names):
            forecast, caution = by_name[name].forecast, caution_of(task, by_name[name].caution, now)
            if forecast is None or not forecast.covers(earliest, task.latest_start + task.duration):
                continue
            if name not in loads:
                lo, hi = forecast.offset(earliest), forecast.offset(task.latest_start)
                best[name], roomy[name] = min(forecast.scored_starts(lo, hi, span, caution))
                continue
            load, shift = loads[name]
            scored = starts(task, forecast, load, earliest, caution)
            best[name] = scored[0][0]
            free = load.first_fit(scored, shift, span)
            if free is not None:
                found.append((free[0], name != t.region, rank, name, free[1]))
        if found:
            _, _, _, name, offset = min(found)
            forecast = by_name[name].forecast
            assert forecast is not None
            at = forecast.time_of(offset)
            loads[name][0].take(at, at + task.duration)
            p = forecast_plan(task, forecast, offset, earliest, note=note)
        else:
            name = choose(t, names, best)
            forecast = by_name[name].forecast
            if name in roomy and forecast is not None:
                p = forecast_plan(task, forecast, roomy[name], earliest, note=note)
            else:
                p = _held(task, by_name[name], earliest, note)
        out.append((name, p, best))
    return out


def _held(task: PlanTask, pool: Pool, earliest: datetime, note: str) -> Plan:
    """No room in any pool it may run in (or no forecast): held to its latest start."""
    forecast = pool.forecast
    if forecast is None or not forecast.covers(earliest, task.latest_start + task.duration):
        return threshold_plan(task, forecast, earliest, pool.signal_low)
    value = round(forecast.mean(task.latest_start, task.duration), DECIMALS)
    reason = "no pool it may run in has room in its window; held to its latest start" + note
    return Plan(task.task_id, task.latest_start, value, PlanKind.FORECAST, reason, over_capacity=True)
