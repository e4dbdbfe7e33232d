"""Slot holds for fixed starts, in this replica.

Shortly before a fixed start — from start - hold_lead, hold_lead following the pool's recent run
times — a slot of a worker in the task's pool is kept idle for it; if no slot is free then, the
first to free up is held before any queued task can take it. At the start a timer wakes the
holder, which claims the task ahead of regular work. Holds live in memory: after a restart they
are planned again from the database within a refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lowtide.config import Config
from lowtide.errors import DatabaseUnavailable
from scheduler_service.domain.fixed import FixedStart, hold_from, p90
from scheduler_service.fleet.sessions import Registry, WorkerSession
from scheduler_service.rows.tasks import UnblockedRow
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.fixed")

REFRESH = 1.0  # seconds between reads of upcoming fixed starts
SAMPLES = 200  # recent regular run times kept per pool


@dataclass
class Upcoming:
    task_id: int
    pool: str
    queue: str
    activity_type: str
    fixed: FixedStart
    holder: WorkerSession | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def runnable_by(self, session: WorkerSession) -> bool:
        return (
            session.pool == self.pool
            and self.queue in session.queues
            and self.activity_type in session.activity_types
            and not session.closed
        )


def _now() -> datetime:
    return datetime.now(UTC)


class DuePools:
    """Pools where a fixed-start task may be due now (a start, a retry, a late run). Made before
    the store, which marks a pool due when the last dependency of a fixed start completes."""

    def __init__(self, registry: Registry, clock: Callable[[], datetime] = _now) -> None:
        self._registry = registry
        self._clock = clock
        self.pools: set[str] = set()

    def mark(self, pool: str, at: datetime | None = None) -> None:
        """Something fixed may be due in the pool now, or at `at` (a retry's backoff)."""
        if at is None or at <= self._clock():
            self.pools.add(pool)
            for session in self._registry:
                if session.pool == pool:
                    session.wake.set()
            return
        delay = (at - self._clock()).total_seconds()
        asyncio.get_running_loop().call_later(delay, self.mark, pool, None)

    def unblocked(self, rows: list[UnblockedRow]) -> None:
        """Tasks whose last dependency completed: every worker looks again; a fixed start among
        them is due in its pool at its start."""
        self._registry.wake_all()
        for row in rows:
            if row.start_at is not None:
                self.mark(row.pool, row.start_at)


class FixedStarts:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        config: Config,
        due: DuePools,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self._store = store
        self._registry = registry
        self._config = config
        self._clock = clock
        self.upcoming: dict[int, Upcoming] = {}
        self._runtimes: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=SAMPLES))
        self._due = due
        # Pools where a fixed-start task may be due now (a start, a retry, a late run).
        self.due = due.pools
        self.refresh_now = asyncio.Event()

    def record_run(self, pool: str, seconds: float) -> None:
        """A regular (not fixed-start) task of the pool ran this long."""
        self._runtimes[pool].append(seconds)

    def p90(self, pool: str) -> float | None:
        return p90(list(self._runtimes[pool]))

    def held_slots(self, pool: str | None = None) -> int:
        return sum(1 for u in self.upcoming.values() if u.holder is not None and (pool is None or u.pool == pool))

    def held_slots_for(self, task_id: int) -> int:
        """1 when a slot is held for this task, else 0."""
        upcoming = self.upcoming.get(task_id)
        return 1 if upcoming is not None and upcoming.holder is not None else 0

    def mark_due(self, pool: str, at: datetime | None = None) -> None:
        """Something fixed may be due in the pool now, or at `at` (a retry's backoff)."""
        self._due.mark(pool, at)

    def dispatched(self, task_ids: list[int]) -> None:
        for task_id in task_ids:
            upcoming = self.upcoming.pop(task_id, None)
            if upcoming is not None:
                self._release(upcoming)

    def offer_slots(self, session: WorkerSession) -> None:
        """A slot of `session` is free: hold it for an upcoming start that wants one first."""
        now = self._clock()
        for upcoming in sorted(self.upcoming.values(), key=lambda u: u.fixed.start_at):
            if session.free <= 0:
                return
            if upcoming.holder is None and upcoming.runnable_by(session) and self._hold_due(upcoming, now):
                self._hold(upcoming, session)

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except DatabaseUnavailable as error:
                log.warning("fixed.refresh_failed", extra={"error": str(error)})
            self.plan()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.refresh_now.wait(), REFRESH)
            self.refresh_now.clear()

    async def refresh(self) -> None:
        pools = sorted({s.pool for s in self._registry})
        if not pools:
            for upcoming in list(self.upcoming.values()):
                self._release(upcoming)
            self.upcoming.clear()
            return
        longest = max(self._config.pool(p).max_hold for p in pools)
        rows = await self._store.upcoming_fixed(pools, self._clock() + longest + timedelta(seconds=REFRESH))
        seen = set()
        for row in rows:
            seen.add(row.id)
            if row.id in self.upcoming:
                continue
            upcoming = Upcoming(row.id, row.pool, row.queue, row.activity_type, row.fixed)
            self.upcoming[row.id] = upcoming
            self._arm(upcoming)
        for task_id in set(self.upcoming) - seen:
            self._release(self.upcoming.pop(task_id))

    def plan(self) -> None:
        """Holds a slot for every upcoming start whose hold is due and that has none yet."""
        now = self._clock()
        for upcoming in sorted(self.upcoming.values(), key=lambda u: u.fixed.start_at):
            if upcoming.holder is not None and upcoming.holder.closed:
                self._release(upcoming)
            if upcoming.holder is None and self._hold_due(upcoming, now):
                candidates = [s for s in self._registry if upcoming.runnable_by(s) and s.free > 0]
                if candidates:
                    self._hold(upcoming, max(candidates, key=lambda s: s.free))

    def _hold_due(self, upcoming: Upcoming, now: datetime) -> bool:
        pool = self._config.pool(upcoming.pool)
        return now >= hold_from(upcoming.fixed, self.p90(upcoming.pool), pool.max_hold)

    def _hold(self, upcoming: Upcoming, session: WorkerSession) -> None:
        upcoming.holder = session
        session.held.add(upcoming.task_id)
        log.info(
            "fixed.slot_held",
            extra={
                "task_id": upcoming.task_id,
                "worker_id": session.worker_id,
                "start_at": str(upcoming.fixed.start_at),
            },
        )

    def _release(self, upcoming: Upcoming) -> None:
        if upcoming.holder is not None:
            upcoming.holder.held.discard(upcoming.task_id)
            upcoming.holder.wake.set()
            upcoming.holder = None
        if upcoming.timer is not None:
            upcoming.timer.cancel()
            upcoming.timer = None

    def _arm(self, upcoming: Upcoming) -> None:
        """Wakes the pool's dispatchers at the start time (the first scheduling step at or after it)."""
        delay = max(0.0, (upcoming.fixed.start_at - self._clock()).total_seconds())
        loop = asyncio.get_running_loop()
        upcoming.timer = loop.call_later(delay, self._start, upcoming)
        # Re-plan when the hold becomes due, not only on the next refresh.
        lead_at = hold_from(upcoming.fixed, self.p90(upcoming.pool), self._config.pool(upcoming.pool).max_hold)
        loop.call_later(max(0.0, (lead_at - self._clock()).total_seconds()), self.plan)

    def _start(self, upcoming: Upcoming) -> None:
        upcoming.timer = None
        self.mark_due(upcoming.pool)
