"""Rows out as proto messages: a task as the API returns it, and the assignment that hands a
claimed attempt to its worker (inbound.py takes the protos in)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.domain.fixed import MissPolicy
from scheduler_service.domain.model import State
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.rows.tasks import TaskRow
from scheduler_service.wire.inbound import KIND_OF_COLUMN, MISS_TO_PROTO, STATE_TO_PROTO

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms_duration(ms: int | None) -> duration_pb2.Duration | None:
    if ms is None:
        return None
    if ms < 0:
        out = duration_pb2.Duration()
        out.FromMilliseconds(ms)  # seconds and nanos of the same sign
        return out
    seconds, rest = divmod(ms, 1000)
    return duration_pb2.Duration(seconds=seconds, nanos=rest * 1_000_000)


def _timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """What Timestamp.FromDatetime makes (a naive value taken as UTC), in integer arithmetic:
    every assignment carries one, and this is 1.5 us of the 5 its message took."""
    if value is None:
        return None
    since = (value if value.tzinfo is not None else value.replace(tzinfo=UTC)) - _EPOCH
    return timestamp_pb2.Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1000)


def task_message(row: TaskRow) -> task_pb2.Task:
    failure = None
    if row.error_type is not None:
        failure = task_pb2.TaskFailure(
            error_type=row.error_type,
            message=row.error_message or "",
            non_retryable=bool(row.error_non_retryable),
        )
    return task_pb2.Task(
        id=row.id,
        queue=row.queue,
        kind=KIND_OF_COLUMN[row.kind],
        activity_type=row.activity_type,
        payload=row.payload or b"",
        priority=row.priority,
        idempotency_key=row.idempotency_key or "",
        state=STATE_TO_PROTO[State(row.state)],
        attempt=row.attempt,
        retry_policy=task_pb2.RetryPolicy(
            max_attempts=row.max_attempts,
            initial_backoff=_ms_duration(row.initial_backoff_ms),
            backoff_coefficient=row.backoff_coefficient,
            max_backoff=_ms_duration(row.max_backoff_ms),
            non_retryable_error_types=row.non_retryable_error_types,
        ),
        schedule_to_start_timeout=_ms_duration(row.schedule_to_start_ms),
        start_to_close_timeout=_ms_duration(row.start_to_close_ms),
        heartbeat_timeout=_ms_duration(row.heartbeat_ms),
        created_at=_timestamp(row.created_at),
        # While dependencies are pending the task is not due at any time yet.
        run_at=_timestamp(row.run_at) if not row.deps_pending else None,
        started_at=_timestamp(row.started_at),
        finished_at=_timestamp(row.finished_at),
        result=row.result or b"",
        last_failure=failure,
        worker_id=row.worker_id or "",
        cancel_requested=row.cancel_requested,
        max_defer=_ms_duration(row.max_defer_ms),
        released_by=row.released_by or "",
        signal_at_submit=row.signal_at_submit,
        signal_at_dispatch=row.signal_at_dispatch,
        pool=row.pool,
        start_at=_timestamp(row.start_at),
        start_tolerance=_ms_duration(row.start_tolerance_ms),
        on_miss=MISS_TO_PROTO[MissPolicy(row.on_miss)] if row.on_miss else task_pb2.MISS_POLICY_UNSPECIFIED,
        estimated_duration=_ms_duration(row.estimated_duration_ms),
        missed=row.missed,
        miss_reason=row.miss_reason or "",
        start_hit=row.start_hit,
        depends_on=row.depends_on or [],
        dependencies_pending=max(0, row.deps_pending),
        shed_reason=row.shed_reason or "",
        resources=row.resources or {},
        latest_start=_timestamp(row.latest_start),
        planned_release_at=_timestamp(row.planned_release_at),
        planned_intensity=row.planned_intensity,
        plan_reason=row.plan_reason or "",
        headers=row.headers,
        heartbeat_details=row.heartbeat_details or b"",
        pools=row.pools or [],
        planned_pool=row.planned_pool or "",
    )


def assignment(row: ClaimedRow) -> worker_pb2.Assignment:
    """The message that hands a claimed attempt to its worker."""
    message = worker_pb2.Assignment(
        task=task_pb2.TaskRef(task_id=row.id, attempt=row.attempt),
        queue=row.queue,
        kind=KIND_OF_COLUMN[row.kind],
        activity_type=row.activity_type,
        payload=row.payload,
        start_to_close_deadline=_timestamp(row.close_deadline),
        heartbeat_timeout=_ms_duration(row.heartbeat_ms),
    )
    if row.headers:
        # Only when there are some: an empty dict goes through MutableMapping.update all the same.
        message.headers.update(row.headers)
    return message
