"""Where and when: the pool (a place, with the signal of its grid) and the start of each held task
that may run in several pools.

Each pool is planned as `scheduler_service.domain.planning.plan` plans one: on its forecast (its
expected error weighed with the planner's caution) and its capacity. Which task goes to which pool
is chosen for all of them at once: one auction (as `plan` shares one pool, Bertsekas' forward
auction of scheduler_service.domain.assignment) over the starts of every pool each task may run
in, each start taking a slot of that pool's grid, so that when the cleanest places are too small
for everyone the tasks that lose least by going to a dearer hour or place are the ones that go.
Each pool is then planned with its capacity for the tasks it got. Choosing each task's best place
as if it were alone, and then moving those planned worse than another place could give them, sent
the tasks that overflowed one pool to the other all at once, where they met again. The latest
start is the task's own whatever the place: the planner never plans past it, and at it dispatch
may start the task in any allowed pool with room. A placement too large for one auction falls back
to those two rounds.

Past `planning.EXACT_TASKS` tasks, only the most urgent are placed so; the others each take
their cheapest start with room (scheduler_service.domain.placement_bound), so that one
placement's work is bounded whatever the backlog.

A pool with no capacity (no workers) is planned around: a task goes there only when no pool it
may run in has any, and then to its last place (or the first it names).

Work expected to be submitted later (the last day's, as in `planning.plan`) bids in the same
auction, in the pools it may run in, and may be left out (it never takes a given task's room):
a clean hour that later work would have no other chance at is left to it when a given task loses
less by going later or elsewhere.

Work naming no pool may run in any pool whose workers run its type, and is planned on its type's
signal beside the placed tasks: the runs placed in a pool are commitments of the room it is
planned with (`beside_placed`), so no slot is promised both to a placed task and to other work.
Placed tasks are planned first, as they can run in fewer places. Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from scheduler_service.domain import placement_bound, planning
from scheduler_service.domain.forecast import MICROSECOND, Forecast
from scheduler_service.domain.planning import CAUTION, EXACT_TASKS, Capacity, Commitment, Plan, PlanKind, PlanTask, plan
from scheduler_service.domain.pool_auction import Bid, share

__all__ = ["PlaceTask", "Placement", "Region", "beside_placed", "place", "placed_runs"]

# Room enough for every task: the first round asks what a place could give, not what it has.
_ROOMY = 10**6


@dataclass(frozen=True, slots=True)
class Region:
    """A pool in a place: its forecast (None: none yet), its capacity, and what its threshold
    hold says now (for a task its forecast does not cover)."""

    name: str
    forecast: Forecast | None
    capacity: Capacity
    signal_low: bool = False
    # The caution its signal's calibration found to pay: the same for every task, or by the
    # window a task has left (see `planning.plan`).
    caution: float | Callable[[timedelta], float] = CAUTION
    unit: str = ""
    # Work expected to be submitted to this pool later (see scheduler_service.domain.demand).
    expected: tuple[PlanTask, ...] = ()


@dataclass(frozen=True, slots=True)
class PlaceTask:
    """A held task and the pools it may run in (none named: every one given). `region` is the
    pool its last placement chose; its `task.planned` is kept only there."""

    task: PlanTask
    regions: tuple[str, ...] = ()
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    task_id: int
    region: str
    plan: Plan
    # The pessimistic forecast mean of the planned run there (None when no forecast covers it).
    score: float | None
    reason: str
    # The score of the best start each allowed pool could give, by name (None: no forecast).
    options: Mapping[str, float | None] = field(default_factory=dict)


def place(
    tasks: Iterable[PlaceTask],
    regions: Sequence[Region],
    now: datetime,
    *,
    resolution: timedelta,
    expected: Sequence[PlaceTask] = (),
    exact: int | None = None,
) -> list[Placement]:
    """One placement per task, in the order given. `expected` is work expected to be submitted
    later (see scheduler_service.domain.demand), naming the pools it may run in: each expected
    task is counted in the pool the placement gives it, as that pool's `Region.expected`, and
    takes room there beside the given tasks (never a given task's). `exact` bounds the work: past
    that many tasks (planning.EXACT_TASKS by default), the most urgent are placed so and
    the others each at its cheapest start with room (see scheduler_service.domain.placement_bound)."""
    given = list(tasks)
    exact = EXACT_TASKS if exact is None else exact
    if len(given) > exact:
        urgent, rest = placement_bound.split(given, now, exact)
        most = [given[i] for i in urgent]
        first = place(most, regions, now, resolution=resolution, expected=expected, exact=len(most))
        # The others, each at its cheapest start with room in the room the most urgent left.
        by_name = {r.name: r for r in regions}
        greedy = placement_bound.greedily(
            [given[i] for i in rest],
            regions,
            placed_runs(most, first),
            now=now,
            resolution=resolution,
            exact=exact,
            choose=lambda t, names, best: _choose(t, names, best, by_name),  # type: ignore[arg-type]
        )
        then = [
            _placement(given[i], by_name[name], p, best=best, by_name=by_name, now=now)
            for i, (name, p, best) in zip(rest, greedy, strict=True)
        ]
        out = dict(zip([*urgent, *rest], [*first, *then], strict=True))
        return [out[i] for i in range(len(given))]
    if given:
        # Only the expected work that competes with a given task is worth placing (as `plan`
        # keeps of it): arriving later than now, and no later than the last latest start.
        last = max(t.task.latest_start for t in given)
        expected = [e for e in expected if now < e.task.earliest <= last]
    if not (expected and given):
        return _place(given, regions, (), now, resolution)
    beside = _place(given, regions, expected, now, resolution)
    if not any(p.plan.over_capacity for p in beside):
        return beside
    # Expected work may move a task to another pool as well as to a dearer hour in its own: a
    # placement beside it that leaves a given task without the room it has in a placement of the
    # given tasks alone is not made (as planning.plan within one pool).
    alone = _place(given, regions, (), now, resolution)
    if any(b.plan.over_capacity and not a.plan.over_capacity for b, a in zip(beside, alone, strict=True)):
        return alone
    return beside


def _place(
    given: list[PlaceTask],
    regions: Sequence[Region],
    expected: Sequence[PlaceTask],
    now: datetime,
    resolution: timedelta,
) -> list[Placement]:
    by_name = {r.name: r for r in regions}
    if len(by_name) != len(regions):
        raise ValueError("pool names must be distinct")
    allowed: list[tuple[str, ...]] = []
    for t in given:
        names = t.regions or tuple(by_name)
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"task {t.task.task_id}: no such pool {unknown[0]!r}")
        allowed.append(names)
    if not given:
        return []
    # What each place could give each task, room for all (the options `explain` shows).
    best = _could_give(regions, given, allowed, now, resolution)
    jointly = _homes(given, allowed, best, regions, expected=expected, now=now, resolution=resolution)
    if jointly is not None:
        home, planned_in = jointly
        plans = _plan_all(planned_in, given, home, now, resolution)
        return [
            _placement(given[i], by_name[home[i]], plans[i], best=best[i], by_name=by_name, now=now)
            for i in range(len(given))
        ]
    # Too many starts for one auction: round one, each task to its best place, room for all.
    regions = _expecting(regions, expected, now, resolution) if expected else regions
    home = [_choose(given[i], allowed[i], best[i], by_name) for i in range(len(given))]
    plans = _plan_all(regions, given, home, now, resolution)
    # Round two: a task planned worse where it is than another allowed place could give it moves.
    moves: list[tuple[float, int, str]] = []
    for i, (where, p) in enumerate(zip(home, plans, strict=True)):
        here = _score(by_name[where], p, given[i].task, now)
        elsewhere = [(s, n) for n, s in best[i].items() if n != where and _open(by_name[n])]
        if elsewhere:
            score, name = min(elsewhere)
            if score < here:
                moves.append((here - score, i, name))
    if moves:
        for _, i, name in sorted(moves, reverse=True):
            home[i] = name
        plans = _plan_all(regions, given, home, now, resolution)
    return [
        _placement(given[i], by_name[home[i]], plans[i], best=best[i], by_name=by_name, now=now)
        for i in range(len(given))
    ]


def _homes(
    given: Sequence[PlaceTask],
    allowed: Sequence[tuple[str, ...]],
    best: Sequence[Mapping[str, float]],
    regions: Sequence[Region],
    *,
    expected: Sequence[PlaceTask],
    now: datetime,
    resolution: timedelta,
) -> tuple[list[str], list[Region]] | None:
    """The pool of each given task, chosen with every other's by `pool_auction.share` over the
    open pools with a forecast, the expected work bidding beside them (and left out when it is
    worth less than the room). Returns the given tasks' pools and the regions with the expected
    work each won counted as theirs; None when the plan is too large for one auction. A task
    with no choice of start takes its room first in its best place (`_choose`), and so does a
    task that won no room anywhere (it will queue)."""
    by_name = {r.name: r for r in regions}
    bids = [Bid(t.task, names, t.region) for t, names in zip(given, allowed, strict=True)]
    coming = [t for t in expected if t.task.latest_start > max(t.task.earliest, now)]
    bids += [Bid(t.task, tuple(n for n in t.regions if n in by_name) or tuple(by_name), droppable=True) for t in coming]
    # Expected work a region was given already may run there only, and stays there.
    kept = [(r.name, e) for r in regions for e in r.expected]
    bids += [Bid(e, (name,), droppable=True) for name, e in kept]
    fixed = {
        i: _choose(t, allowed[i], best[i], by_name)
        for i, t in enumerate(given)
        if t.task.latest_start <= max(t.task.earliest, now)
    }
    pools = [r for r in regions if _open(r) and r.forecast is not None]
    won = share(bids, pools, fixed, now=now, resolution=resolution)
    if won is None:
        return None
    homes: dict[str, list[PlanTask]] = {}
    for n, t in enumerate(coming, start=len(given)):
        if n in won:
            homes.setdefault(won[n], []).append(t.task)
    for name, e in kept:
        homes.setdefault(name, []).append(e)
    chosen = [fixed.get(i) or won.get(i) or _choose(given[i], allowed[i], best[i], by_name) for i in range(len(given))]
    return chosen, [replace(r, expected=tuple(homes.get(r.name, ()))) for r in regions]


def _could_give(
    regions: Sequence[Region],
    tasks: Sequence[PlaceTask],
    allowed: Sequence[tuple[str, ...]],
    now: datetime,
    resolution: timedelta,
) -> list[dict[str, float]]:
    """What each place could give each task at best (the score of its best start there, as if
    the pool had room for all of them), by the names of the pools it may run in."""
    best: list[dict[str, float]] = [{} for _ in tasks]
    for region in regions:
        members = [i for i, names in enumerate(allowed) if region.name in names]
        if not members:
            continue
        roomy = replace(region, capacity=Capacity(_ROOMY), expected=())
        for i, p in zip(members, _plan_in(roomy, [tasks[i] for i in members], now, resolution), strict=True):
            best[i][region.name] = _score(region, p, tasks[i].task, now)
    return best


def _expecting(
    regions: Sequence[Region], expected: Sequence[PlaceTask], now: datetime, resolution: timedelta
) -> list[Region]:
    """The regions with each expected task counted in the `expected` of the pool it would be
    placed in on its own (the open pool, of those it names, that could give it the best start)."""
    by_name = {r.name: r for r in regions}
    allowed = [tuple(n for n in t.regions if n in by_name) or tuple(by_name) for t in expected]
    best = _could_give(regions, expected, allowed, now, resolution)
    homes: dict[str, list[PlanTask]] = {}
    for task, names, scores in zip(expected, allowed, best, strict=True):
        homes.setdefault(_choose(task, names, scores, by_name), []).append(task.task)
    return [replace(r, expected=(*r.expected, *homes.get(r.name, ()))) for r in regions]


def _open(region: Region) -> bool:
    return region.capacity.max_running > 0


def _choose(task: PlaceTask, names: tuple[str, ...], best: Mapping[str, float], by_name: Mapping[str, Region]) -> str:
    open_ = [n for n in names if _open(by_name[n])]
    if not open_:
        return task.region if task.region in names else names[0]
    # The lowest best score; the last place on a tie, then the order named.
    return min(open_, key=lambda n: (best[n], n != task.region, names.index(n)))


def _plan_all(
    regions: Sequence[Region], given: Sequence[PlaceTask], home: Sequence[str], now: datetime, resolution: timedelta
) -> list[Plan]:
    plans: list[Plan | None] = [None] * len(given)
    for region in regions:
        members = [i for i, where in enumerate(home) if where == region.name]
        if members:
            for i, p in zip(members, _plan_in(region, [given[i] for i in members], now, resolution), strict=True):
                plans[i] = p
    return [p for p in plans if p is not None]


def _plan_in(region: Region, tasks: Sequence[PlaceTask], now: datetime, resolution: timedelta) -> list[Plan]:
    # A task's last planned start is a start in its last place only.
    planned = [t.task if t.region == region.name else replace(t.task, planned=None) for t in tasks]
    capacity = region.capacity if _open(region) else Capacity(_ROOMY)
    return plan(
        planned,
        region.forecast,
        capacity,
        now,
        signal_low=region.signal_low,
        resolution=resolution,
        caution=region.caution,
        expected=region.expected,
    )


def _score(region: Region, p: Plan, task: PlanTask, now: datetime) -> float:
    """The pessimistic mean of the planned run (a start now at the known value), or infinity
    when the place's forecast does not cover it: a place seen is preferred to one unseen."""
    forecast = region.forecast
    if p.expected_intensity is None or forecast is None or p.kind is PlanKind.THRESHOLD:
        return math.inf
    span, caution = max(1, task.duration // MICROSECOND), planning.caution_of(task, region.caution, now)
    return forecast.score(forecast.offset(p.release_at), span, caution)


def _placement(
    task: PlaceTask,
    region: Region,
    p: Plan,
    *,
    best: Mapping[str, float],
    by_name: Mapping[str, Region],
    now: datetime,
) -> Placement:
    score = _score(region, p, task.task, now)
    options = {n: (None if math.isinf(s) else s) for n, s in best.items()}
    unit = f" {region.unit}" if region.unit else ""
    at = p.release_at.astimezone(UTC)
    # With its date once it is not today's (a forecast runs up to two days ahead).
    when = (
        "now"
        if p.release_at <= now
        else at.strftime("%H:%M" if at.date() == now.astimezone(UTC).date() else "%Y-%m-%d %H:%M")
    )
    if p.expected_intensity is None:
        reason = f"{region.name}: {p.reason}"
    else:
        head = f"{region.name} at {when}: {p.expected_intensity:g}{unit}"
        others = [
            f"{_now_value(by_name[n]):g}{unit} in {n} now"
            for n in best
            if n != region.name and _now_value(by_name[n]) is not None
        ]
        closed = [n for n in best if n != region.name and not _open(by_name[n])]
        reason = head + (f" against {', '.join(others)}" if others else "")
        if closed:
            reason += f" ({', '.join(closed)} has no workers)"
        if not _open(region):
            reason += f" (no pool it may run in has workers: held for {region.name})"
        reason += f"; {p.reason}"
    return Placement(task.task.task_id, region.name, p, None if math.isinf(score) else score, reason, options)


def _now_value(region: Region) -> float | None:
    forecast = region.forecast
    if forecast is None or not forecast.values:
        return None
    return forecast.values[0]


def placed_runs(tasks: Sequence[PlaceTask], placements: Sequence[Placement]) -> dict[str, tuple[Commitment, ...]]:
    """The room the placements take in each pool: a slot over each planned run, by pool. A task
    the threshold hold releases has no planned run and takes none (as in planning.plan)."""
    runs: dict[str, list[Commitment]] = {}
    for task, placement in zip(tasks, placements, strict=True):
        if placement.plan.kind is PlanKind.THRESHOLD:
            continue
        start = placement.plan.release_at
        runs.setdefault(placement.region, []).append(Commitment(start, start + task.task.duration))
    return {pool: tuple(r) for pool, r in runs.items()}


def beside_placed(
    slots: Mapping[str, int], runs: Mapping[str, Sequence[Commitment]], committed: Sequence[Commitment] = ()
) -> Capacity:
    """The room work naming no pool is planned with: the slots of the pools that may run it
    (`slots`, by pool), less the fixed starts' windows (`committed`) and the runs placed in
    those pools (`runs`, from placed_runs). A pool that does not run the work gives it no slots,
    and the runs placed there take none of its room."""
    placed = tuple(run for pool, rs in sorted(runs.items()) if slots.get(pool, 0) > 0 for run in rs)
    return Capacity(max(1, sum(max(0, n) for n in slots.values())), (*committed, *placed))
