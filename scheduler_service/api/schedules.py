"""SchedulerService's schedule methods: create, list, pause, resume and delete. A mixin that
SchedulerApi inherits; thin like the rest: proto in, validation, store call, proto out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import grpc

from lowtide.config import Config
from lowtide.errors import InvalidArgument, TooLarge
from lowtide.grpc_status import handles_errors
from lowtide_proto.lowtide.v1 import schedule_pb2
from scheduler_service.domain import cron
from scheduler_service.rows.schedules import NewSchedule, ScheduleRow
from scheduler_service.store import Store
from scheduler_service.tasks.schedules import Schedules
from scheduler_service.wire import inbound

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

MAX_CRON = 200


def time_zone(value: str) -> ZoneInfo:
    name = value or "UTC"
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument("time_zone", f"unknown time zone {name!r} (an IANA name such as Europe/London)") from None


def new_schedule(spec: schedule_pb2.ScheduleSpec, config: Config) -> NewSchedule:
    """A CreateSchedule request, validated; InvalidArgument names the field that is wrong."""
    name = inbound.name("name", spec.name)
    if len(spec.cron) > MAX_CRON:
        raise InvalidArgument("cron", f"must be at most {MAX_CRON} characters")
    try:
        cron.parse(spec.cron)
    except ValueError as error:
        raise InvalidArgument("cron", str(error)) from None
    time_zone(spec.time_zone)
    activity_type = inbound.name("activity_type", spec.activity_type)
    if len(spec.payload) > config.scheduler.max_payload_bytes:
        limit = config.scheduler.max_payload_bytes
        raise TooLarge(f"payload: {len(spec.payload)} bytes is over the limit of {limit} bytes")
    tolerance = inbound.DEFAULT_TOLERANCE
    if spec.HasField("start_tolerance"):
        tolerance = inbound.duration("start_tolerance", spec.start_tolerance)
    if spec.on_miss not in inbound.MISS_POLICIES:
        raise InvalidArgument("on_miss", f"unknown miss policy {spec.on_miss}")
    estimate = inbound.optional_duration("", spec, "estimated_duration")
    type_config = config.types.get(activity_type)
    if estimate is None and type_config is not None:
        estimate = type_config.estimated_duration
    if estimate is None:
        raise InvalidArgument(
            "estimated_duration",
            "is required for a schedule (or configure [types.NAME] estimated_duration): each occurrence "
            "reserves capacity for as long as it runs",
        )
    return NewSchedule(
        name=name,
        cron=" ".join(spec.cron.split()),
        time_zone=spec.time_zone or "UTC",
        activity_type=activity_type,
        queue=inbound.name("queue", spec.queue, default="default"),
        pool=inbound.name("pool", spec.pool, default="default"),
        payload=spec.payload,
        priority=spec.priority,
        tolerance=tolerance,
        on_miss=inbound.MISS_POLICIES[spec.on_miss],
        estimated_duration=estimate,
    )


def schedule_message(row: ScheduleRow) -> schedule_pb2.Schedule:
    message = schedule_pb2.Schedule(
        id=row.id,
        name=row.name,
        cron=row.cron,
        time_zone=row.time_zone,
        activity_type=row.activity_type,
        queue=row.queue,
        pool=row.pool,
        payload=row.payload,
        priority=row.priority,
        on_miss=inbound.MISS_TO_PROTO[row.miss_policy],
        paused=row.paused,
        last_task_id=row.last_task_id or 0,
        last_conflict=row.last_conflict or "",
        conflicts=row.conflicts,
    )
    message.start_tolerance.FromTimedelta(row.tolerance)
    message.estimated_duration.FromTimedelta(row.estimated_duration)
    message.next_fire_at.FromDatetime(row.next_fire_at)
    message.created_at.FromDatetime(row.created_at)
    for field, value in (("last_fire_at", row.last_fire_at), ("last_conflict_at", row.last_conflict_at)):
        if value is not None:
            getattr(message, field).FromDatetime(value)
    return message


class ScheduleApi:
    """The schedule RPCs of SchedulerService; the class that mixes this in provides the store
    and the config."""

    _store: Store
    _config: Config

    @property
    def _schedules(self) -> Schedules:
        return Schedules(self._store)

    @handles_errors
    async def CreateSchedule(
        self, request: schedule_pb2.CreateScheduleRequest, context: Context
    ) -> schedule_pb2.CreateScheduleResponse:
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        schedule = new_schedule(request.schedule, self._config)
        first = cron.next_fire(schedule.cron, datetime.now(UTC), time_zone(schedule.time_zone))
        row = await self._schedules.create(schedule, first)
        return schedule_pb2.CreateScheduleResponse(schedule=schedule_message(row))

    @handles_errors
    async def ListSchedules(
        self, request: schedule_pb2.ListSchedulesRequest, context: Context
    ) -> schedule_pb2.ListSchedulesResponse:
        rows = await self._schedules.list_all()
        return schedule_pb2.ListSchedulesResponse(schedules=[schedule_message(r) for r in rows])

    @handles_errors
    async def PauseSchedule(
        self, request: schedule_pb2.PauseScheduleRequest, context: Context
    ) -> schedule_pb2.PauseScheduleResponse:
        row, cancelled = await self._schedules.pause(inbound.name("name", request.name))
        return schedule_pb2.PauseScheduleResponse(schedule=schedule_message(row), cancelled_task_ids=cancelled)

    @handles_errors
    async def ResumeSchedule(
        self, request: schedule_pb2.ResumeScheduleRequest, context: Context
    ) -> schedule_pb2.ResumeScheduleResponse:
        row = await self._schedules.resume(inbound.name("name", request.name), datetime.now(UTC))
        return schedule_pb2.ResumeScheduleResponse(schedule=schedule_message(row))

    @handles_errors
    async def DeleteSchedule(
        self, request: schedule_pb2.DeleteScheduleRequest, context: Context
    ) -> schedule_pb2.DeleteScheduleResponse:
        row, cancelled = await self._schedules.delete(inbound.name("name", request.name))
        return schedule_pb2.DeleteScheduleResponse(schedule=schedule_message(row), cancelled_task_ids=cancelled)
