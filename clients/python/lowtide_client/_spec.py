"""Building ``TaskSpec`` messages from plain Python values.

The options of a task are declared once, in ``TaskOptions``; ``task_spec`` and
``Client.submit`` both take them as keywords typed by it (``**options: Unpack[TaskOptions]``),
so a type checker checks every keyword of either, and one function fills the message, so
``Client.submit`` and callers that prepare a batch for ``Client.submit_many`` cannot drift
apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypedDict, Unpack

from google.protobuf import duration_pb2

from lowtide_proto.durations import duration_to_proto
from lowtide_proto.lowtide.v1 import task_pb2

__all__ = ["TaskOptions", "task_spec"]


class TaskOptions(TypedDict, total=False):
    """The keyword options of ``task_spec`` and ``Client.submit``; every one may be left out.

    Left out (or ``None``), an option stays unset in the message so that the scheduler's
    default applies. The defaults of the others: ``queue="default"``, ``kind`` an activity,
    ``priority=0``, no ``pool`` and ``on_miss`` unspecified (the scheduler's policy).
    """

    queue: str
    kind: task_pb2.TaskKind.ValueType | int
    priority: int
    idempotency_key: str | None
    # The retry policy, sent only when one of its fields is given.
    max_attempts: int | None
    initial_backoff: timedelta | None
    backoff_coefficient: float | None
    max_backoff: timedelta | None
    non_retryable_error_types: Sequence[str]
    # Timeouts.
    schedule_to_start_timeout: timedelta | None
    start_to_close_timeout: timedelta | None
    heartbeat_timeout: timedelta | None
    max_defer: timedelta | None
    # A fixed start: start_at (an aware datetime) or start_in, admitted against the pool's
    # reservations or refused (see ``reservation_conflict``).
    pool: str
    start_at: datetime | None
    start_in: timedelta | None
    start_tolerance: timedelta | None
    on_miss: str | task_pb2.MissPolicy.ValueType
    estimated_duration: timedelta | None
    # Dependencies, resources and the cost planner's window.
    depends_on: Sequence[int]
    resources: Mapping[str, int] | None
    deadline: datetime | None
    latest_start: datetime | None
    # The pools it may run in (each a configured [pools.NAME]); none: any that runs its type. A
    # deferrable task with a latest start and several pools runs where and when it is cheapest.
    pools: Sequence[str]
    # Carried to the worker of every attempt (a trace context, say); see TaskSpec.headers.
    headers: Mapping[str, str] | None


def task_spec(activity_type: str, payload: bytes | str = b"", **options: Unpack[TaskOptions]) -> task_pb2.TaskSpec:
    """Describe one task to submit; the options are those of ``TaskOptions``.

    ``payload`` is opaque to the scheduler; a ``str`` is UTF-8 encoded. Options left at
    ``None`` stay unset in the message so that the scheduler's defaults apply (rather than
    this library hard-coding its own); the retry policy is only sent when one of its fields
    is given. Only mistakes the scheduler could not report more clearly are checked here:
    an empty activity type, a negative duration, and a lone string passed as the
    non-retryable error types (which would otherwise be split into characters).
    """
    if not activity_type:
        raise ValueError("activity_type must not be empty")
    for listed in ("non_retryable_error_types", "pools"):
        if isinstance(options.get(listed), str):
            raise TypeError(f"{listed} must be a sequence of str, not a single str")
    spec = task_pb2.TaskSpec(
        queue=options.get("queue", "default"),
        kind=task_pb2.TaskKind.ValueType(options.get("kind", task_pb2.TASK_KIND_ACTIVITY)),
        activity_type=activity_type,
        payload=payload.encode() if isinstance(payload, str) else bytes(payload),
        priority=options.get("priority", 0),
        idempotency_key=options.get("idempotency_key") or "",
    )
    retry = _retry_policy(options)
    if retry is not None:
        spec.retry_policy.CopyFrom(retry)
    timeouts = (
        ("schedule_to_start_timeout", options.get("schedule_to_start_timeout")),
        ("start_to_close_timeout", options.get("start_to_close_timeout")),
        ("heartbeat_timeout", options.get("heartbeat_timeout")),
        ("max_defer", options.get("max_defer")),
    )
    for name, timeout in timeouts:
        if timeout is not None:
            getattr(spec, name).CopyFrom(_duration(name, timeout))
    spec.depends_on.extend(options.get("depends_on", ()))
    spec.pools.extend(options.get("pools", ()))
    for name, moment in (("deadline", options.get("deadline")), ("latest_start", options.get("latest_start"))):
        if moment is not None:
            if moment.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
            getattr(spec, name).FromDatetime(moment)
    for name, amount in (options.get("resources") or {}).items():
        spec.resources[name] = amount
    spec.headers.update(options.get("headers") or {})
    _fixed_start(spec, options)
    return spec


def _retry_policy(options: TaskOptions) -> task_pb2.RetryPolicy | None:
    """The retry policy of the options, or None when none of its fields is given."""
    retry = task_pb2.RetryPolicy()
    has_retry = False
    max_attempts = options.get("max_attempts")
    if max_attempts is not None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (1 means never retry)")
        retry.max_attempts = max_attempts
        has_retry = True
    backoffs = (("initial_backoff", options.get("initial_backoff")), ("max_backoff", options.get("max_backoff")))
    for name, backoff in backoffs:
        if backoff is not None:
            getattr(retry, name).CopyFrom(_duration(name, backoff))
            has_retry = True
    coefficient = options.get("backoff_coefficient")
    if coefficient is not None:
        retry.backoff_coefficient = coefficient
        has_retry = True
    error_types = options.get("non_retryable_error_types", ())
    if error_types:
        retry.non_retryable_error_types.extend(error_types)
        has_retry = True
    return retry if has_retry else None


_MISS_POLICIES = {"run_late": task_pb2.MISS_POLICY_RUN_LATE, "skip": task_pb2.MISS_POLICY_SKIP}


def _miss_policy(on_miss: str | task_pb2.MissPolicy.ValueType) -> task_pb2.MissPolicy.ValueType:
    """``on_miss`` by its name (``run_late``, ``skip``) or as the enum value."""
    if isinstance(on_miss, str):
        if on_miss not in _MISS_POLICIES:
            raise ValueError(f"on_miss must be one of {', '.join(_MISS_POLICIES)}, not {on_miss!r}")
        return _MISS_POLICIES[on_miss]
    return on_miss


def _fixed_start(spec: task_pb2.TaskSpec, options: TaskOptions) -> None:
    """A fixed start: ``start_at`` (an aware datetime) or ``start_in``; the scheduler admits it
    against the pool's reservations or refuses it (see ``reservation_conflict``)."""
    spec.pool = options.get("pool", "")
    start_at = options.get("start_at")
    if start_at is not None:
        if start_at.tzinfo is None:
            raise ValueError("start_at must be timezone-aware (e.g. datetime.now(UTC) + ...)")
        spec.start_at.FromDatetime(start_at)
    start_in = options.get("start_in")
    if start_in is not None:
        spec.start_in.CopyFrom(_duration("start_in", start_in))
    tolerance = options.get("start_tolerance")
    if tolerance is not None:
        spec.start_tolerance.CopyFrom(_duration("start_tolerance", tolerance))
    spec.on_miss = _miss_policy(options.get("on_miss", task_pb2.MISS_POLICY_UNSPECIFIED))
    estimated = options.get("estimated_duration")
    if estimated is not None:
        spec.estimated_duration.CopyFrom(_duration("estimated_duration", estimated))


def _duration(name: str, value: timedelta) -> duration_pb2.Duration:
    """``value`` as a protobuf Duration, refusing what is not a timedelta or is negative."""
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, not {type(value).__name__}")
    if value < timedelta(0):
        raise ValueError(f"{name} must not be negative")
    return duration_to_proto(value)
