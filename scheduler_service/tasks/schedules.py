"""Recurring schedules: what creating, pausing and deleting one does, and the materializer that
turns fire times into tasks (their rows through store/schedules.py).

Why it works this way: docs/architecture/tasks.md.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from lowtide.config import Config
from lowtide.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, TooLarge
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.domain.cron import next_fire
from scheduler_service.domain.fixed import Refused, reservation_capacity
from scheduler_service.rows.schedules import NewSchedule, ScheduleRow
from scheduler_service.store import Store
from scheduler_service.tasks.submission import store_tasks
from scheduler_service.wire import inbound

log = logging.getLogger("lowtide.scheduler.schedules")

# Past the pool's max_hold: a task must exist before its slot hold is first planned.
LOOKAHEAD_MARGIN = timedelta(minutes=1)
# Schedules read per tick, and tasks created per schedule per tick: a bound on one tick's work,
# not on throughput (the next tick goes on where this one stopped).
BATCH = 100


def occurrence_key(row: ScheduleRow, fire_at: datetime) -> str:
    return f"schedule:{row.id}:{row.generation}:{fire_at.astimezone(UTC).isoformat()}"


class Schedules:
    """The schedules table, and what pausing and deleting do to the tasks already created."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def create(self, schedule: NewSchedule, next_fire_at: datetime) -> ScheduleRow:
        row = await self._store.create_schedule(schedule, next_fire_at)
        if row is None:
            raise AlreadyExists(f"schedule {schedule.name!r} exists already")
        return row

    async def list_all(self) -> list[ScheduleRow]:
        return await self._store.schedules()

    async def get(self, name: str) -> ScheduleRow:
        row = await self._store.schedule_named(name)
        if row is None:
            raise NotFound(f"schedule {name!r} not found")
        return row

    async def pause(self, name: str) -> tuple[ScheduleRow, list[int]]:
        """Pauses the schedule and cancels the tasks it created that have not reached their start;
        returns the schedule and those tasks' ids."""
        row = await self._store.pause_schedule(name)
        if row is None:
            raise NotFound(f"schedule {name!r} not found")
        return row, await self._cancel_unstarted(row.id)

    async def resume(self, name: str, now: datetime) -> ScheduleRow:
        """Resumes from the first fire time after `now`: the occurrences of the pause are not made up."""
        row = await self.get(name)
        if not row.paused:
            return row
        try:
            upcoming = next_fire(row.cron, now, ZoneInfo(row.time_zone))
        except (ValueError, ZoneInfoNotFoundError) as error:
            problem = f"schedule {name!r} cannot be resumed: {error}; delete it and create it again"
            raise FailedPrecondition(problem) from None
        resumed = await self._store.resume_schedule(row.id, upcoming)
        # Resumed by someone else meanwhile: theirs is as good as ours.
        return resumed or await self.get(name)

    async def delete(self, name: str) -> tuple[ScheduleRow, list[int]]:
        """Deletes the schedule and cancels the tasks it created that have not reached their start."""
        deleted = await self._store.delete_schedule(name)
        if deleted is None:
            raise NotFound(f"schedule {name!r} not found")
        row, unstarted = deleted
        for task in unstarted:
            await self._store.cancel(task.id)
        return row, [task.id for task in unstarted]

    async def _cancel_unstarted(self, schedule_id: int) -> list[int]:
        unstarted = await self._store.unstarted_schedule_tasks(schedule_id)
        for task in unstarted:
            await self._store.cancel(task.id)
        return [task.id for task in unstarted]


class ScheduleMaterializer:
    """Creates the tasks of due fire times. `tick(now)` is called by the maintenance leader."""

    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self._config = config

    def lookahead(self, pool: str) -> timedelta:
        return self._config.pool(pool).max_hold + LOOKAHEAD_MARGIN

    def _capacity(self, pool: str) -> int:
        settings = self._config.pool(pool)
        return reservation_capacity(settings.max_workers, settings.reservable_fraction)

    def horizon(self, now: datetime) -> datetime:
        """The latest fire time a tick at `now` materializes (the widest lookahead of any pool)."""
        return now + max([self.lookahead(p) for p in self._config.pools] + [self.lookahead("default")])

    async def tick(self, now: datetime | None = None) -> int:
        """Creates the tasks of every fire time within its pool's lookahead; returns how many."""
        now = now or datetime.now(UTC)
        rows = await self._store.due_schedules(self.horizon(now), BATCH)
        created = 0
        for row in rows:
            try:
                created += await self._materialize(row, now)
            except (ValueError, ZoneInfoNotFoundError) as error:
                # Validated at creation, so only a tzdata update that dropped its zone gets here.
                # Paused with the reason, so one broken schedule neither stops the leader's other
                # time-driven work nor logs on every tick.
                message = f"paused: cannot compute its fire times: {error}"
                log.error("schedule.broken", extra={"schedule": row.name, "detail": message})
                await self._store.break_schedule(row.id, message)
        return created

    async def _materialize(self, row: ScheduleRow, now: datetime) -> int:
        zone = ZoneInfo(row.time_zone)
        horizon = now + self.lookahead(row.pool)
        created = 0
        fire_at = row.next_fire_at
        for _ in range(BATCH):
            if fire_at > horizon:
                break
            tolerance = row.tolerance
            passed = fire_at + tolerance < now
            # Past fire times are jumped over at once: the first one left is still startable.
            upcoming = next_fire(row.cron, now - tolerance if passed else fire_at, zone)
            params = {"id": row.id, "generation": row.generation, "fire_at": fire_at, "next_fire_at": upcoming}
            if passed:
                # The scheduler was down (or no replica led) past these starts: nothing is left
                # to promise, so the occurrences are skipped rather than created as misses.
                log.warning(
                    "schedule.occurrences_passed",
                    extra={"schedule": row.name, "from": fire_at.isoformat(), "to": upcoming.isoformat()},
                )
                advanced = await self._store.skip_occurrence(params)
            else:
                advanced, made = await self._occur(row, fire_at, params, now)
                created += made
            if not advanced:
                # Another replica moved the schedule on, or it was paused or deleted: stop here.
                break
            fire_at = upcoming
        return created

    async def _occur(
        self, row: ScheduleRow, fire_at: datetime, params: dict[str, object], now: datetime
    ) -> tuple[bool, int]:
        """Submits one occurrence; returns whether the schedule's compare-and-set moved it on, and 1
        if a task was made."""
        try:
            task = inbound.new_task(
                self._spec(row, fire_at),
                defaults=self._config.retry,
                max_payload=self._config.scheduler.max_payload_bytes,
                type_defaults=self._config.types,
                now=now,
            )
            [submitted] = await store_tasks(self._store, [task], capacity=self._capacity)
        except Refused as refused:
            message = conflict_message(refused, fire_at)
            log.info("schedule.conflict", extra={"schedule": row.name, "detail": message})
            return await self._store.refuse_occurrence(params, message), 0
        except (InvalidArgument, TooLarge) as error:
            # The configuration changed under the schedule (a smaller payload limit, say).
            message = f"occurrence at {fire_at.isoformat()} refused: {error}"
            return await self._store.refuse_occurrence(params, message), 0
        advanced = await self._store.advance_schedule(params, submitted.id)
        if not advanced and submitted.created and not await self._still_wanted(row):
            # Paused, resumed or deleted between our read and our task: pause and delete have
            # already looked for tasks to cancel, so this one is ours to cancel.
            await self._store.cancel(submitted.id)
            return False, 0
        if submitted.created:
            log.info("schedule.task_created", extra={"schedule": row.name, "task_id": submitted.id})
        return advanced, int(submitted.created)

    async def _still_wanted(self, row: ScheduleRow) -> bool:
        current = await self._store.schedule_of(row.id)
        return current is not None and not current.paused and current.generation == row.generation

    @staticmethod
    def _spec(row: ScheduleRow, fire_at: datetime) -> task_pb2.TaskSpec:
        spec = task_pb2.TaskSpec(
            queue=row.queue,
            activity_type=row.activity_type,
            payload=row.payload,
            priority=row.priority,
            idempotency_key=occurrence_key(row, fire_at),
            pool=row.pool,
            on_miss=inbound.MISS_TO_PROTO[row.miss_policy],
        )
        spec.start_at.FromDatetime(fire_at)
        spec.start_tolerance.FromMilliseconds(row.start_tolerance_ms)
        spec.estimated_duration.FromMilliseconds(row.estimated_duration_ms)
        return spec


def conflict_message(refused: Refused, fire_at: datetime) -> str:
    conflict = refused.conflict
    ids = ", ".join(map(str, conflict.task_ids))
    return (
        f"occurrence at {fire_at.isoformat()} refused: reservation conflict in pool {refused.pool}: at most "
        f"{conflict.capacity} reservation(s) may overlap, and {len(conflict.task_ids)} already do from "
        f"{conflict.conflict.start.isoformat()} to {conflict.conflict.end.isoformat()} (requested window "
        f"{conflict.window.start.isoformat()} to {conflict.window.end.isoformat()}; conflicting tasks {ids})"
    )
