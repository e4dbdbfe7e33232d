"""Building ``TaskSpec`` messages from plain Python values.

One function builds every spec, so ``Client.submit`` and callers that prepare a batch for
``Client.submit_many`` cannot drift apart in how they fill the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from google.protobuf import duration_pb2

from lowtide_proto.durations import duration_to_proto
from lowtide_proto.lowtide.v1 import task_pb2

__all__ = ["task_spec"]


def task_spec(
    activity_type: str,
    payload: bytes | str = b"",
    *,
    queue: str = "default",
    kind: task_pb2.TaskKind.ValueType | int = task_pb2.TASK_KIND_ACTIVITY,
    priority: int = 0,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    initial_backoff: timedelta | None = None,
    backoff_coefficient: float | None = None,
    max_backoff: timedelta | None = None,
    non_retryable_error_types: Sequence[str] = (),
    schedule_to_start_timeout: timedelta | None = None,
    start_to_close_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    max_defer: timedelta | None = None,
    pool: str = "",
    start_at: datetime | None = None,
    start_in: timedelta | None = None,
    start_tolerance: timedelta | None = None,
    on_miss: str | task_pb2.MissPolicy.ValueType = task_pb2.MISS_POLICY_UNSPECIFIED,
    estimated_duration: timedelta | None = None,
    depends_on: Sequence[int] = (),
    resources: Mapping[str, int] | None = None,
    deadline: datetime | None = None,
    latest_start: datetime | None = None,
) -> task_pb2.TaskSpec:
    """Describe one task to submit.

    ``payload`` is opaque to the scheduler; a ``str`` is UTF-8 encoded. Options left at
    ``None`` stay unset in the message so that the scheduler's defaults apply (rather than
    this library hard-coding its own); the retry policy is only sent when one of its fields
    is given. Only mistakes the scheduler could not report more clearly are checked here:
    an empty activity type, a negative duration, and a lone string passed as the
    non-retryable error types (which would otherwise be split into characters).
    """
    if not activity_type:
        raise ValueError("activity_type must not be empty")
    if isinstance(non_retryable_error_types, str):
        raise TypeError("non_retryable_error_types must be a sequence of str, not a single str")
    spec = task_pb2.TaskSpec(
        queue=queue,
        kind=task_pb2.TaskKind.ValueType(kind),
        activity_type=activity_type,
        payload=payload.encode() if isinstance(payload, str) else bytes(payload),
        priority=priority,
        idempotency_key=idempotency_key or "",
    )
    retry = task_pb2.RetryPolicy()
    has_retry = False
    if max_attempts is not None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (1 means never retry)")
        retry.max_attempts = max_attempts
        has_retry = True
    if initial_backoff is not None:
        retry.initial_backoff.CopyFrom(_duration("initial_backoff", initial_backoff))
        has_retry = True
    if backoff_coefficient is not None:
        retry.backoff_coefficient = backoff_coefficient
        has_retry = True
    if max_backoff is not None:
        retry.max_backoff.CopyFrom(_duration("max_backoff", max_backoff))
        has_retry = True
    if non_retryable_error_types:
        retry.non_retryable_error_types.extend(non_retryable_error_types)
        has_retry = True
    if has_retry:
        spec.retry_policy.CopyFrom(retry)
    if schedule_to_start_timeout is not None:
        spec.schedule_to_start_timeout.CopyFrom(_duration("schedule_to_start_timeout", schedule_to_start_timeout))
    if start_to_close_timeout is not None:
        spec.start_to_close_timeout.CopyFrom(_duration("start_to_close_timeout", start_to_close_timeout))
    if heartbeat_timeout is not None:
        spec.heartbeat_timeout.CopyFrom(_duration("heartbeat_timeout", heartbeat_timeout))
    if max_defer is not None:
        spec.max_defer.CopyFrom(_duration("max_defer", max_defer))
    spec.depends_on.extend(depends_on)
    for field_name, moment in (("deadline", deadline), ("latest_start", latest_start)):
        if moment is not None:
            if moment.tzinfo is None:
                raise ValueError(f"{field_name} must be timezone-aware")
            getattr(spec, field_name).FromDatetime(moment)
    for name, amount in (resources or {}).items():
        spec.resources[name] = amount
    _fixed_start(
        spec,
        pool=pool,
        start_at=start_at,
        start_in=start_in,
        tolerance=start_tolerance,
        on_miss=on_miss,
        estimated_duration=estimated_duration,
    )
    return spec


_MISS_POLICIES = {"run_late": task_pb2.MISS_POLICY_RUN_LATE, "skip": task_pb2.MISS_POLICY_SKIP}


def _fixed_start(
    spec: task_pb2.TaskSpec,
    *,
    pool: str,
    start_at: datetime | None,
    start_in: timedelta | None,
    tolerance: timedelta | None,
    on_miss: str | task_pb2.MissPolicy.ValueType,
    estimated_duration: timedelta | None,
) -> None:
    """A fixed start: ``start_at`` (an aware datetime) or ``start_in``; the scheduler admits it
    against the pool's reservations or refuses it (see ``reservation_conflict``)."""
    spec.pool = pool
    if start_at is not None:
        if start_at.tzinfo is None:
            raise ValueError("start_at must be timezone-aware (e.g. datetime.now(UTC) + ...)")
        spec.start_at.FromDatetime(start_at)
    if start_in is not None:
        spec.start_in.CopyFrom(_duration("start_in", start_in))
    if tolerance is not None:
        spec.start_tolerance.CopyFrom(_duration("start_tolerance", tolerance))
    if isinstance(on_miss, str):
        if on_miss not in _MISS_POLICIES:
            raise ValueError(f"on_miss must be one of {', '.join(_MISS_POLICIES)}, not {on_miss!r}")
        on_miss = _MISS_POLICIES[on_miss]
    spec.on_miss = on_miss
    if estimated_duration is not None:
        spec.estimated_duration.CopyFrom(_duration("estimated_duration", estimated_duration))


def _duration(name: str, value: timedelta) -> duration_pb2.Duration:
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, not {type(value).__name__}")
    if value < timedelta(0):
        raise ValueError(f"{name} must not be negative")
    return duration_to_proto(value)
