"""Which pool each task goes to when it may run in several: one auction (Bertsekas' forward
auction, scheduler_service.domain.assignment, as `planning.plan` shares one pool) over the starts
of every pool each task may run in, each start taking a slot of that pool's grid. When the
cleanest places are too small for every task, the tasks that lose least by going to a dearer hour
or place are the ones that go (scheduler_service.domain.placement plans each pool after it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from scheduler_service.domain.assignment import Bidder, auction
from scheduler_service.domain.forecast import MICROSECOND, Forecast
from scheduler_service.domain.planning import AUCTION_WORK, BIDS_PER_TASK, EPSILON, Capacity, PlanTask, caution_of
from scheduler_service.domain.pool_load import Load
from scheduler_service.domain.pool_share import contended_share
from scheduler_service.domain.starts import starts as _starts


class Pool(Protocol):
    """A pool as placement.Region gives it."""

    @property
    def name(self) -> str: ...
    @property
    def forecast(self) -> Forecast | None: ...
    @property
    def capacity(self) -> Capacity: ...
    @property
    def caution(self) -> float | Callable[[timedelta], float]: ...


@dataclass(frozen=True, slots=True)
class Bid:
    """A task and the pools it may run in; `last` is the pool of its last placement (its
    `planned` start is a start there only). Expected work is `droppable`: left out when the room
    is worth more to the others than its dearest start."""

    task: PlanTask
    pools: tuple[str, ...]
    last: str | None = None
    droppable: bool = False


def share(
    bids: Sequence[Bid],
    pools: Sequence[Pool],
    fixed: Mapping[int, str],
    *,
    now: datetime,
    resolution: timedelta,
) -> dict[int, str] | None:
    """The pool each bid won, by index into `bids` (a bid with no start any of `pools` covers,
    left out, or in `fixed` is missing); None when there are more starts than one auction weighs
    (planning.AUCTION_WORK). `pools` are those that may take work (open, with a forecast);
    `fixed` are bids with no choice of start, by index, in the pool they run in: they take their
    room at once before the others bid."""
    loads: dict[str, tuple[Load, int]] = {}
    # The share of its caution a task keeps in each pool (as `planning.plan` plans a pool, over
    # every task that may go there).
    shares: dict[str, float] = {}
    for pool in pools:
        members = [b.task for b in bids if pool.name in b.pools]
        if members:
            loads[pool.name] = (Load.covering(members, pool.capacity, now, resolution), 0)
            shares[pool.name] = _share(members, pool, now, resolution)
    for i, name in fixed.items():
        if name in loads:
            task = bids[i].task
            at = max(now, task.latest_start)
            loads[name][0].add(at, at + task.duration)
    room: list[int] = []
    for name, (load, _) in loads.items():
        loads[name] = (load, len(room))
        room.extend(load.room())
    by_name = {p.name: p for p in pools}
    bidders: list[Bidder] = []
    places: list[list[str]] = []
    work = 0
    for n, bid in enumerate(bids):
        if n in fixed:
            continue
        earliest = max(bid.task.earliest, now)
        options: list[tuple[float, range]] = []
        where: list[str] = []
        # Its last place first: of equal bids the first is taken, so a re-plan keeps it on a tie.
        for name in sorted(bid.pools, key=lambda m: m != bid.last):
            if name not in loads:
                continue
            pool, (load, base) = by_name[name], loads[name]
            forecast = pool.forecast
            if forecast is None or not forecast.covers(earliest, bid.task.latest_start + bid.task.duration):
                continue
            task = bid.task if bid.last == name else replace(bid.task, planned=None)
            caution = caution_of(task, pool.caution, now) * shares[name]
            task = replace(task, caution=caution)
            span, shift = task.duration // MICROSECOND, load.shift(forecast.origin)
            for score, offset in _starts(task, forecast, load, earliest, caution):
                slots = load.slots_at(offset + shift, offset + shift + span)
                options.append((score, range(base + slots.start, base + slots.stop)))
                where.append(name)
        work += sum(len(slots) for _, slots in options)
        if work > AUCTION_WORK:
            return None
        if options:
            bidders.append(Bidder(n, options, droppable=bid.droppable))
            places.append(where)
    scale = max((abs(v) for p in pools if p.forecast is not None for v in p.forecast.values), default=0.0) or 1.0
    got = auction(bidders, room, epsilon=EPSILON * scale, max_bids=BIDS_PER_TASK * len(bidders))
    return {b.key: where[got[b.key]] for b, where in zip(bidders, places, strict=True) if b.key in got}


def _share(members: Sequence[PlanTask], pool: Pool, now: datetime, resolution: timedelta) -> float:
    """1 in a pool with room for every task at once; else the share of its caution a task keeps
    there (`contended_share`, as `planning.plan` scales it in a pool too small for its tasks)."""
    if pool.forecast is None or Load.for_tasks(members, pool.capacity, now, resolution) is None:
        return 1.0
    return contended_share(members, pool.capacity.max_running, now, pool.forecast)
