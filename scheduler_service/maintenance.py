"""Time-driven work, done once across replicas by the holder of the leader lease: ending attempts
past their start_to_close or heartbeat deadline or whose worker's lease is gone, timing out tasks
past their schedule_to_start deadline, deleting finished tasks past their retention, and
forgetting workers whose lease ran out and queues idle for the retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from lowtide.errors import DatabaseUnavailable
from scheduler_service.domain.fixed import Miss, miss_reason
from scheduler_service.domain.model import Failure, Outcome
from scheduler_service.domain.retry import after_failure
from scheduler_service.fleet.leadership import Leadership
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.fixed_starts import FixedStarts
from scheduler_service.rows.fleet import MissedFixed
from scheduler_service.store import Store, attempt_of, retries_due

if TYPE_CHECKING:
    from scheduler_service.dispatch.adaptive import AdaptiveLimits
    from scheduler_service.holds.release_planning import ReleasePlanner
    from scheduler_service.observe.metrics import SchedulerMetrics
    from scheduler_service.tasks.schedules import ScheduleMaterializer

log = logging.getLogger("lowtide.scheduler.maintenance")

LEADER = "scheduler.maintenance"
# Every this many ticks the leader forgets expired workers and long-gone replicas.
HOUSEKEEPING = 10
# The most finished tasks a tick deletes (the longest-finished first): at the default 500 ms
# interval 10,000 a second, each delete about 100 ms of the tick (10,000 took 190 ms in a table
# of 2,300,000), so timeouts are not held up behind a long catch-up.
PURGE_BATCH = 5_000
# The most idle queues one housekeeping round forgets.
QUEUE_BATCH = 1_000

_MESSAGES = {
    "StartToCloseTimeout": "the attempt ran past its start_to_close timeout",
    "HeartbeatTimeout": "no heartbeat for the attempt within its heartbeat timeout",
    "WorkerLost": "the worker running the attempt was lost (no heartbeat within its lease)",
}


class Maintenance:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        holder: str,
        interval: timedelta,
        lease: timedelta,
        retention: timedelta,
        kept_queues: frozenset[str],
        on_requeued: Callable[[], None],
        on_retry: Callable[[datetime, set[tuple[str, str]]], None],
        on_replicas: Callable[[bool], None],
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        schedules: ScheduleMaterializer,
        planner: ReleasePlanner,
        adaptive: AdaptiveLimits,
        leadership: Leadership,
    ) -> None:
        self._fixed = fixed
        # Timeouts are samples of adaptive types too.
        self._adaptive = adaptive
        self._metrics = metrics
        # Recurring schedules: their fire times become tasks on the leader.
        self.schedules = schedules
        # Planned release of held tasks with a latest start, on the forecast.
        self.planner = planner
        self._store = store
        self._registry = registry
        self._holder = holder
        self._interval = interval.total_seconds()
        self._lease = lease
        # Finished tasks are deleted this long after they finished (0: kept for ever), and queues
        # idle this long are forgotten, but for these (configured).
        self._retention = retention
        self._kept_queues = kept_queues
        self._on_requeued = on_requeued
        # Told when each retry of an attempt it ended is due (Dispatcher.wake_at).
        self._on_retry = on_retry
        # Told every tick whether another replica runs (see Waiters.others).
        self._on_replicas = on_replicas
        self._leadership = leadership
        self._ticks = 0

    @property
    def leading(self) -> bool:
        return self._leadership.leading

    async def run(self) -> None:
        try:
            while True:
                try:
                    # A sign of life every interval (a miss while no replica ran says so), and the
                    # leader lease taken or kept, in one statement.
                    check = await self._store.seen_and_lead(LEADER, self._holder, self._lease)
                    self._leadership.leading = check.leading
                    self._on_replicas(check.others)
                    if self.leading:
                        await self.tick()
                except DatabaseUnavailable as error:
                    self._leadership.leading = False
                    log.warning("maintenance.database_unavailable", extra={"error": str(error)})
                await asyncio.sleep(self._interval)
        finally:
            with contextlib.suppress(DatabaseUnavailable, asyncio.CancelledError):
                await asyncio.shield(self._stopped())

    async def _stopped(self) -> None:
        await self._store.replica_stopped(self._holder)
        if self.leading:
            await self._store.resign(LEADER, self._holder)

    async def tick(self, now: datetime | None = None) -> None:
        """One round of the leader's time-driven work. One statement first says which of the
        others may find anything due; only those run, so an idle tick costs that one statement."""
        now = now or datetime.now(UTC)
        due = await self._store.maintenance_due(self.schedules.horizon(now), self._retention)
        if due.schedules:
            await self.schedules.tick(now)
        await self.planner.tick()
        if due.start_deadlines:
            await self._store.expire_schedule_to_start()
        if due.misses:
            await self._apply_misses()
        expired = await self._store.expired_attempts() if due.expired_attempts else []
        if expired:
            outcomes: list[tuple[Outcome, str | None]] = []
            for row in expired:
                failure = Failure(row.reason, _MESSAGES[row.reason])
                outcomes.append((after_failure(attempt_of(row), failure, now), None))
            applied = await self._store.finish(outcomes)
            self._adaptive.record(
                (o, applied[(o.task_id, o.attempt)]) for o, _ in outcomes if (o.task_id, o.attempt) in applied
            )
            for row in expired:
                ref = (row.id, row.attempt)
                if ref in applied:
                    # Found by its worker: a look through every session for each was O(workers)
                    # per attempt, a pause of the event loop when many expire at once.
                    holder = self._registry.holding(row.worker_id, ref)
                    if holder is not None:
                        holder.cancel([ref])
            log.info("maintenance.attempts_ended", extra={"count": len(applied)})
            self._on_requeued()
            for at, pairs in retries_due((o for o, _ in outcomes), applied).items():
                self._on_retry(at, pairs)
        if due.purge:
            # Every tick while tasks finish steadily: counted, logged at debug only.
            purged = await self._store.purge_finished(self._retention, PURGE_BATCH)
            self._metrics.purged.add(purged)
            log.debug("maintenance.tasks_purged", extra={"count": purged})
        self._ticks += 1
        if self._ticks % HOUSEKEEPING == 0:
            # Rows nothing reads any more (expired workers are filtered out everywhere): no hurry.
            await self._store.delete_expired_workers()
            await self._store.forget_replicas()
            await self._forget_idle_queues()

    async def _forget_idle_queues(self) -> None:
        """Queues idle (no task due or running) for the retention, with no task pending or running
        at all, are forgotten: lowtide.queues, and the gauges of every queue it knows, would grow
        with every queue name ever submitted to otherwise."""
        busy = self._metrics.busy_queues()
        if busy is None or not self._retention:
            return
        forgotten = await self._store.forget_idle_queues(
            busy=busy, kept=self._kept_queues, retention=self._retention, limit=QUEUE_BATCH
        )
        if forgotten:
            log.info("maintenance.queues_forgotten", extra={"count": forgotten})

    async def _apply_misses(self) -> None:
        """Fixed starts not started by start + tolerance: skip, or run late (due at once)."""
        fixed = self._fixed

        def reason(missed: MissedFixed) -> Miss:
            held = fixed.held_slots(missed.pool) - fixed.held_slots_for(missed.id)
            return miss_reason(missed.facts(held_for_others=max(0, held)))

        applied = await self._store.apply_misses(reason, lease=self._lease)
        for miss in applied:
            log.info("fixed.missed", extra={"task_id": miss.id, "pool": miss.pool, "reason": miss.reason})
            self._metrics.misses.add(1, {"pool": miss.pool, "reason": miss.kind})
            if miss.state == "pending":
                fixed.mark_due(miss.pool)
            else:
                fixed.dispatched([miss.id])
