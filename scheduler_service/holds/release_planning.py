"""Planned release of held tasks with a latest start, on the signal's forecast.

Why it works this way: docs/architecture/holds.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from lowtide.config import Config
from scheduler_service.domain.demand import LOOKBACK, Submitted, expected_arrivals
from scheduler_service.domain.model import NewTask
from scheduler_service.domain.placement import Placement, PlaceTask, beside_placed, placed_runs
from scheduler_service.domain.planning import (
    RELEASE_LEAD,
    Capacity,
    Commitment,
    Plan,
    PlanKind,
    PlanTask,
    plan,
    release_by,
)
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds import regions
from scheduler_service.holds.signals import HoldsSnapshot, SignalHolds
from scheduler_service.holds.snapshot import HoldSnapshot
from scheduler_service.rows.fleet import PlannableTask
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.planning")

# Plan again at least this often (forecasts drift even when their version does not move).
REPLAN_EVERY = 60.0
# How often the leader looks whether a pool gained or lost all its workers (pools bound to signals).
POOLS_EVERY = 1.0

T = TypeVar("T")


def plan_tasks(
    holds: HoldSnapshot,
    tasks: Sequence[PlanTask],
    capacity: Capacity,
    now: datetime | None = None,
    *,
    expected: Sequence[PlanTask] = (),
) -> list[Plan]:
    now = now or datetime.now(UTC)
    caution = holds.planning_caution
    plans = plan(tasks, holds.forecast, capacity, now, signal_low=holds.signal_low, caution=caution, expected=expected)
    # Which forecast a plan came from, so `task explain` can say so.
    origin = holds.origin
    return [replace(p, reason=f"{p.reason} (forecast: {origin})") if p.kind is PlanKind.FORECAST else p for p in plans]


def release_time(release: Plan) -> datetime | None:
    """When the plan moves the task's release; None for the threshold fallback, which leaves it
    to the hold (released when the signal falls, at the latest at the latest start)."""
    return None if release.kind is PlanKind.THRESHOLD else release.release_at


def deferrable(holds: SignalHolds, queue: str, activity_type: str, kind: str) -> bool:
    return kind == "activity" and activity_type in holds.config.for_queue(queue)


class ReleasePlanner:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        holds: SignalHolds,
        config: Config,
        *,
        wake_at: Callable[[datetime], None],
    ) -> None:
        self.wake_at = wake_at
        self._store = store
        self._registry = registry
        self._holds = holds
        self._config = config
        self._planned_version = -1
        self._planned_at = 0.0
        # The pools with room when the leader last placed tasks that name pools (a change plans
        # again: a pool whose workers went away is planned around), and when it last looked.
        self._open_pools: frozenset[str] | None = None
        self._pools_seen_at = 0.0
        # Placements made per pool, for the metrics.
        self.placed_by_pool: dict[str, int] = {}
        # A tick's planning (a second or more of CPU with thousands of tasks) runs here, off
        # the event loop, which meanwhile answers calls, feeds workers and renews leases. One
        # thread: two ticks never plan at once (one cancelled at a stop finishes in it alone).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lowtide-planning")

    def close(self) -> None:
        """Lets the thread end once a planning it runs is done (a stop does not wait for it)."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, work: Callable[[], T]) -> T:
        """`work` in the planner's thread. It must read only what nobody changes meanwhile (a
        snapshot taken on the loop, values made for it); what it returns is written back on the
        loop. Cancelled (a stop), the work still ends in the thread, and nothing is written."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    async def wake_for_upcoming(self) -> None:
        """Sets this replica's wake-ups for the planned releases due within REPLAN_EVERY (the
        leader announces each new plan, and plans again at least that often), so a worker
        connected to any replica is fed at the planned time, not a poll later."""
        for due in await self._store.upcoming_releases(timedelta(seconds=2 * REPLAN_EVERY)):
            self.wake_at(due)

    def capacity(self, types: Iterable[str]) -> int:
        """Slots of the connected workers that run any of these types."""
        wanted = set(types)
        return sum(s.slots for s in self._registry if wanted & set(s.activity_types))

    def pool_slots(self, types: Iterable[str] | None = None) -> dict[str, int]:
        """Slots of this replica's connected workers (those that run any of `types`, if given), by pool."""
        wanted = None if types is None else set(types)
        slots: dict[str, int] = {}
        for session in self._registry:
            if wanted is None or wanted & set(session.activity_types):
                slots[session.pool] = slots.get(session.pool, 0) + session.slots
        return slots

    def _place_submitted(self, task: NewTask, holds: HoldsSnapshot, now: datetime) -> tuple[Plan, str, str | None]:
        """A new task naming pools, placed on its own among them (see plan_submitted): its plan,
        why, and the pool chosen."""
        assert task.latest_start is not None and task.duration is not None
        alone = PlanTask(0, now, release_by(task.latest_start), task.duration)
        # This replica sees its own workers only: a pool with none here may have some at another
        # replica, so it is not planned around until the leader, which reads them all, says so.
        local = self.pool_slots()
        slots = {name: max(1, local.get(name, 0)) for name in task.pools}
        [placement] = regions.placed(
            self._config, holds, [(alone, task.pools, None, task.queue, task.activity_type)], slots, now
        )
        return placement.plan, placement.reason, regions.chosen_pool(placement)

    def plan_submitted(self, tasks: Sequence[NewTask]) -> list[NewTask]:
        """Plans the release of each new task that may wait for a cheaper window, on its own
        (the leader plans them all together, with the pool's capacity, on the next forecast);
        one that names pools is placed among them too."""
        out = []
        # On the loop, unlike a tick's planning: a task alone takes 0.1-1.5 ms (a window of up to
        # two days on a 5-minute forecast), placed among two pools up to 3.5 ms. The tasks of a
        # batch are planned at one moment, and those alike (the same signal or pools, latest start
        # and duration) have the same plan, made once: a batch of 1,000 alike held the loop for
        # up to 3.5 s, planning each anew.
        # The holds are read once, when a task is planned at all (most submits are not).
        snapshot: HoldsSnapshot | None = None
        now = datetime.now(UTC)
        made: dict[tuple[object, ...], tuple[Plan, str, str | None]] = {}
        for task in tasks:
            if task.latest_start is not None:
                # A held task runs by its latest start: be awake then, not a poll later.
                self.wake_at(release_by(task.latest_start))
            if task.latest_start is None or not deferrable(
                self._holds, task.queue, task.activity_type, task.kind.value
            ):
                out.append(task)
                continue
            if snapshot is None:
                snapshot = self._holds.snapshot()
            if task.pools and task.duration is not None:
                key: tuple[object, ...] = (
                    tuple(task.pools),
                    task.queue,
                    task.activity_type,
                    task.latest_start,
                    task.duration,
                )
                if key not in made:
                    made[key] = self._place_submitted(task, snapshot, now)
            else:
                # Planned on the forecast of the signal this type follows.
                holds = snapshot.following(task.queue, task.activity_type)
                if holds.forecast is None or task.duration is None:
                    out.append(task)
                    continue
                capacity = max(1, self.capacity([task.activity_type]))
                key = (id(holds), capacity, task.latest_start, task.duration)
                if key not in made:
                    alone = PlanTask(0, now, release_by(task.latest_start), task.duration)
                    [release] = plan_tasks(holds, [alone], Capacity(capacity), now)
                    made[key] = (release, release.reason, None)
            release, reason, pool = made[key]
            self.wake_at(release.release_at)
            out.append(
                replace(
                    task,
                    planned_release_at=release_time(release),
                    planned_intensity=release.expected_intensity,
                    plan_reason=reason,
                    planned_pool=pool,
                )
            )
        return out

    async def _pools_changed(self) -> bool:
        """Whether the pools with connected workers changed since the last look (at most every
        POOLS_EVERY, and only when some pool is bound to a signal)."""
        if not self._holds.config.pool_signals or time.monotonic() - self._pools_seen_at < POOLS_EVERY:
            return False
        self._pools_seen_at = time.monotonic()
        open_pools = frozenset(p.pool for p in await self._store.pools() if p.slots > 0)
        changed = self._open_pools is not None and open_pools != self._open_pools
        self._open_pools = open_pools
        return changed

    async def _recent_deferrable(self, types: set[str], *, named_pools: bool = False) -> list[Submitted]:
        """The deferrable work of the last day, which the plan expects again (one query): all of
        it, or with `named_pools` only the tasks that named pools (the work placed among them)."""
        rows = await self._store.recent_deferrable(sorted(types), LOOKBACK)
        default = 30 * 60 * 1000
        return [
            Submitted(
                r.at,
                timedelta(milliseconds=r.slack_ms) - RELEASE_LEAD,
                timedelta(milliseconds=r.estimated_duration_ms or default),
                r.count,
            )
            for r in rows
            if deferrable(self._holds, r.queue, r.activity_type, r.kind) and (r.named_pools or not named_pools)
        ]

    async def tick(self) -> None:
        """Plans again when the forecast changed, a pool gained or lost all its workers (with
        pools bound to signals), or a while has passed; leader only."""
        # Looked at on every tick (not only when nothing else plans), so a change is seen once.
        pools_changed = await self._pools_changed()
        fresh = self._holds.forecast_version != self._planned_version or pools_changed
        if not fresh and time.monotonic() - self._planned_at < REPLAN_EVERY:
            return
        self._planned_version = self._holds.forecast_version
        self._planned_at = time.monotonic()
        rows = [
            r for r in await self._store.plannable_tasks() if deferrable(self._holds, r.queue, r.activity_type, r.kind)
        ]
        # The tasks that name pools first (they can run in fewer places); the runs placed in a
        # pool take room the other work is planned with, so no slot is promised twice.
        runs = await self._place([r for r in rows if r.pools])
        # Each task is planned on the forecast of the signal its type follows, beside the
        # others that follow the same signal.
        by_signal: dict[str, list[PlannableTask]] = {}
        for r in rows:
            if r.pools:
                continue
            by_signal.setdefault(
                self._holds.config.signal_for(r.queue, r.activity_type, self._holds.default), []
            ).append(r)
        for name, group in sorted(by_signal.items()):
            await self._plan(name, group, runs)

    async def _place(self, rows: list[PlannableTask]) -> dict[str, tuple[Commitment, ...]]:
        """Places the tasks that name pools: each pool on its own signal's forecast, with the
        slots of its connected workers (any replica's); a pool without workers is planned around.
        Returns the runs placed, by pool."""
        if not rows:
            return {}
        # Any replica's workers, and this one's as it sees them now (a worker that just connected
        # here may not be in the table yet: a pool is not planned around for that).
        slots = {p.pool: p.slots for p in await self._store.pools()}
        for pool, mine in self.pool_slots().items():
            slots[pool] = max(slots.get(pool, 0), mine)
        # A task is placed only among the pools whose workers (any replica's, or this one's) run
        # its type on its queue: placed in one whose workers do not, it would wait there to its
        # latest start. Of a type no pool runs yet, among all it names (planned around as pools
        # without workers).
        types = sorted({r.activity_type for r in rows})
        running = await self._store.pool_types(types)
        for session in self._registry:
            for activity_type in set(session.activity_types) & set(types):
                for queue in session.queues:
                    running.setdefault((queue, activity_type), set()).add(session.pool)
        # Fixed starts were promised their pool's capacity: each pool's are left to them.
        committed: dict[str, list[Commitment]] = {}
        for r in await self._store.live_reservations():
            committed.setdefault(r.pool, []).append(Commitment(r.window_start, r.window_end))
        # The work that named pools over the last day, expected again: a cheap hour in a pool is
        # left to it when it would have no other (as _plan leaves one to the work expected there).
        signal_types: dict[str, set[str]] = {}
        for row in rows:
            signal = self._holds.config.signal_for(row.queue, row.activity_type, self._holds.default)
            signal_types.setdefault(signal, set()).add(row.activity_type)
        recent = {
            signal: await self._recent_deferrable(group, named_pools=True) for signal, group in signal_types.items()
        }
        # After the reads: a forecast that came meanwhile starts after an earlier `now`, and a
        # window starting before a forecast is not covered by it.
        now = datetime.now(UTC)
        holds, config = self._holds.snapshot(), self._config
        tasks = [
            (
                PlanTask(
                    r.id,
                    r.created_at,
                    release_by(r.latest_start),
                    timedelta(milliseconds=r.estimated_duration_ms or 30 * 60 * 1000),
                    # Planned afresh each time: a start kept from the last plan scores that start
                    # on the new forecast, and a spell that moved a little would send the task to
                    # another pool (the place it had wins ties, so it does not flip between equals).
                ),
                tuple(p for p in r.pools or () if p in running.get((r.queue, r.activity_type), ()))
                or tuple(r.pools or ()),
                r.planned_pool,
                r.queue,
                r.activity_type,
            )
            for r in rows
        ]

        def work() -> tuple[list[Placement], dict[str, tuple[Commitment, ...]]]:
            expected = {signal: expected_arrivals(submitted, now) for signal, submitted in recent.items()}
            placements = regions.placed(config, holds, tasks, slots, now, committed=committed, expected=expected)
            return placements, placed_runs([PlaceTask(task) for task, *_ in tasks], placements)

        placements, runs = await self._off_loop(work)
        await self._store.apply_plans(
            [(p.task_id, release_time(p.plan), p.plan.expected_intensity, p.reason) for p in placements],
            [regions.chosen_pool(p) for p in placements],
        )
        for (task, *_), placement in zip(tasks, placements, strict=True):
            self.wake_at(min(placement.plan.release_at, task.latest_start))
            self.placed_by_pool[placement.region] = self.placed_by_pool.get(placement.region, 0) + 1
        log.info("planning.placed", extra={"tasks": len(placements), "pools": sorted(slots)})
        return runs

    async def _plan(self, signal: str, rows: list[PlannableTask], runs: Mapping[str, Sequence[Commitment]]) -> None:
        """Plans the tasks that follow `signal`, on its forecast, in the room of the pools whose
        workers run them (any replica's) less the `runs` placed there."""
        # Planned within [submission, release_by(latest start)]: a plan never waits past the
        # moment the hold lets go anyway, so the release and the claim agree.
        tasks = [
            PlanTask(
                r.id,
                r.created_at,
                release_by(r.latest_start),
                timedelta(milliseconds=r.estimated_duration_ms or 30 * 60 * 1000),
                # The last plan is kept unless the new forecast shows a surely better start.
                r.planned_release_at,
            )
            for r in rows
        ]
        # Fixed starts were promised capacity at admission: a plan leaves their windows to them.
        committed = [Commitment(r.window_start, r.window_end) for r in await self._store.live_reservations()]
        # The slots of any replica's workers, and of this one's as it sees them now (as _place).
        types = sorted({r.activity_type for r in rows})
        slots = await self._store.pool_slots(types)
        for pool, mine in self.pool_slots(types).items():
            slots[pool] = max(slots.get(pool, 0), mine)
        recent = await self._recent_deferrable(set(types))
        # After the reads, as in _place.
        now = datetime.now(UTC)
        holds = self._holds.by_signal[signal].snapshot()

        def work() -> list[Plan]:
            expected = expected_arrivals(recent, now)
            return plan_tasks(holds, tasks, beside_placed(slots, runs, committed), now, expected=expected)

        plans = await self._off_loop(work)
        await self._store.apply_plans([(p.task_id, release_time(p), p.expected_intensity, p.reason) for p in plans])
        # Claimed when due, not a poll later: at the planned release, and at the latest start.
        for task, release in zip(tasks, plans, strict=True):
            self.wake_at(min(release.release_at, task.latest_start))
        log.info(
            "planning.planned",
            extra={"tasks": len(plans), "signal": holds.signal_name, "forecast": holds.source or "none"},
        )
