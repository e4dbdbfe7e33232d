"""The rows of recurring schedules (sql/schedules.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler_service.domain.fixed import MissPolicy


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule, as `_schedule_columns` reads it from lowtide.schedules."""

    id: int
    name: str
    cron: str
    time_zone: str
    activity_type: str
    queue: str
    pool: str
    payload: bytes
    priority: int
    start_tolerance_ms: int
    on_miss: str
    estimated_duration_ms: int
    paused: bool
    # Bumped on each resume; part of its tasks' idempotency keys.
    generation: int
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_task_id: int | None
    last_conflict: str | None
    last_conflict_at: datetime | None
    conflicts: int
    created_at: datetime

    @property
    def tolerance(self) -> timedelta:
        return timedelta(milliseconds=self.start_tolerance_ms)

    @property
    def estimated_duration(self) -> timedelta:
        return timedelta(milliseconds=self.estimated_duration_ms)

    @property
    def miss_policy(self) -> MissPolicy:
        return MissPolicy(self.on_miss)


@dataclass(frozen=True, slots=True)
class ScheduleTask:
    """A task a schedule created (`unstarted_schedule_tasks`)."""

    id: int


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A validated CreateSchedule request."""

    name: str
    cron: str
    time_zone: str
    activity_type: str
    queue: str
    pool: str
    payload: bytes
    priority: int
    tolerance: timedelta
    on_miss: MissPolicy
    estimated_duration: timedelta
