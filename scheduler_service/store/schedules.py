"""Recurring schedules' rows: created, read, paused, resumed, deleted, and moved on by the
materializer with a compare-and-set on (generation, fire time)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from scheduler_service.rows.schedules import NewSchedule, ScheduleRow, ScheduleTask
from scheduler_service.store.base import Q, StoreBase


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


class ScheduleStore(StoreBase):
    async def create_schedule(self, schedule: NewSchedule, next_fire_at: datetime) -> ScheduleRow | None:
        """The new schedule; None when one of that name exists."""
        params = {
            "name": schedule.name,
            "cron": schedule.cron,
            "time_zone": schedule.time_zone,
            "activity_type": schedule.activity_type,
            "queue": schedule.queue,
            "pool": schedule.pool,
            "payload": schedule.payload,
            "priority": schedule.priority,
            "start_tolerance_ms": _ms(schedule.tolerance),
            "on_miss": schedule.on_miss.value,
            "estimated_duration_ms": _ms(schedule.estimated_duration),
            "next_fire_at": next_fire_at,
        }
        return await self.db.fetch_one_as(ScheduleRow, Q["insert_schedule"], params)

    async def schedules(self) -> list[ScheduleRow]:
        return await self.db.fetch_as(ScheduleRow, Q["list_schedules"])

    async def schedule_named(self, name: str) -> ScheduleRow | None:
        return await self.db.fetch_one_as(ScheduleRow, Q["get_schedule_by_name"], {"name": name})

    async def schedule_of(self, schedule_id: int) -> ScheduleRow | None:
        return await self.db.fetch_one_as(ScheduleRow, Q["get_schedule"], {"id": schedule_id})

    async def pause_schedule(self, name: str) -> ScheduleRow | None:
        return await self.db.fetch_one_as(ScheduleRow, Q["pause_schedule"], {"name": name})

    async def resume_schedule(self, schedule_id: int, next_fire_at: datetime) -> ScheduleRow | None:
        """None when it was resumed (or deleted) by someone else meanwhile."""
        params = {"id": schedule_id, "next_fire_at": next_fire_at}
        return await self.db.fetch_one_as(ScheduleRow, Q["resume_schedule"], params)

    async def delete_schedule(self, name: str) -> tuple[ScheduleRow, list[ScheduleTask]] | None:
        """Deletes the schedule; returns it with the tasks it made that have not started (None: no
        such schedule)."""
        async with self.db.transaction() as tx:
            # Locked, so the materializer cannot link a task that the delete would then orphan.
            row = await tx.fetch_one_as(ScheduleRow, Q["lock_schedule"], {"name": name})
            if row is None:
                return None
            unstarted = await tx.fetch_as(ScheduleTask, Q["unstarted_schedule_tasks"], {"id": row.id})
            await tx.execute(Q["delete_schedule"], {"id": row.id})
        return row, unstarted

    async def unstarted_schedule_tasks(self, schedule_id: int) -> list[ScheduleTask]:
        return await self.db.fetch_as(ScheduleTask, Q["unstarted_schedule_tasks"], {"id": schedule_id})

    async def due_schedules(self, horizon: datetime, limit: int) -> list[ScheduleRow]:
        return await self.db.fetch_as(ScheduleRow, Q["due_schedules"], {"horizon": horizon, "limit": limit})

    async def break_schedule(self, schedule_id: int, message: str) -> None:
        await self.db.execute(Q["break_schedule"], {"id": schedule_id, "message": message})

    async def skip_occurrence(self, occurrence: Mapping[str, object]) -> bool:
        """Moves the schedule past passed fire times; False when another replica moved it first.
        `occurrence`: id, generation, fire_at, next_fire_at."""
        return await self.db.execute(Q["skip_occurrence"], dict(occurrence)) > 0

    async def refuse_occurrence(self, occurrence: Mapping[str, object], message: str) -> bool:
        return await self.db.execute(Q["refuse_occurrence"], {**occurrence, "message": message}) > 0

    async def advance_schedule(self, occurrence: Mapping[str, object], task_id: int) -> bool:
        return await self.db.execute(Q["advance_schedule"], {**occurrence, "task_id": task_id}) > 0
