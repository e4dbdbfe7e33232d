"""Proto in, domain out (with validation), and rows back to proto.

Validation is pure: a bad field raises InvalidArgument naming the field and what is wrong, or
TooLarge for a payload over the limit, before anything is stored.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2

from lowtide.config import RetryConfig, TypeConfig
from lowtide.errors import InvalidArgument, TooLarge
from lowtide_proto.durations import format_duration
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.domain.fixed import FixedStart, MissPolicy
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy, State
from scheduler_service.domain.resources import validate as validate_resources

MAX_NAME = 200
MAX_KEY = 500
MAX_DURATION = timedelta(days=366)
MAX_ATTEMPTS = 10_000
# Error types a retry policy may name as non-retryable: each is checked on submit and stored on the task.
MAX_ERROR_TYPES = 100

STATE_TO_PROTO = {state: getattr(task_pb2, f"TASK_STATE_{state.name}") for state in State}
PROTO_TO_STATE = {v: k for k, v in STATE_TO_PROTO.items()}
KIND_TO_PROTO = {Kind.ACTIVITY: task_pb2.TASK_KIND_ACTIVITY, Kind.WORKFLOW: task_pb2.TASK_KIND_WORKFLOW}
# The same by the column's text ("activity"): a row's kind without an Enum call per row.
KIND_OF_COLUMN = {kind.value: proto for kind, proto in KIND_TO_PROTO.items()}
PROTO_TO_KIND = {
    task_pb2.TASK_KIND_UNSPECIFIED: Kind.ACTIVITY,
    task_pb2.TASK_KIND_ACTIVITY: Kind.ACTIVITY,
    task_pb2.TASK_KIND_WORKFLOW: Kind.WORKFLOW,
}


def duration(field: str, value: duration_pb2.Duration) -> timedelta:
    if value.seconds < 0 or value.nanos < 0:
        raise InvalidArgument(field, "must not be negative")
    if not 0 <= value.nanos < 1_000_000_000:
        raise InvalidArgument(field, "nanos out of range")
    if value.seconds > MAX_DURATION.total_seconds():
        raise InvalidArgument(field, f"must be at most {MAX_DURATION.days} days")
    return timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


def optional_duration(field: str, message: Any, name: str, *, positive: bool = True) -> timedelta | None:
    if not message.HasField(name):
        return None
    value = duration(f"{field}.{name}" if field else name, getattr(message, name))
    if positive and value <= timedelta(0):
        raise InvalidArgument(f"{field}.{name}" if field else name, "must be greater than zero")
    return value


_CONTROL = re.compile(r"[\x00-\x1f]")


def name(field: str, value: str, *, default: str | None = None) -> str:
    if not value:
        if default is None:
            raise InvalidArgument(field, "must not be empty")
        return default
    if len(value) > MAX_NAME:
        raise InvalidArgument(field, f"must be at most {MAX_NAME} characters")
    if value != value.strip() or _CONTROL.search(value):
        raise InvalidArgument(field, "must not contain control characters or surrounding spaces")
    return value


@functools.lru_cache(maxsize=16)
def _default_policy(defaults: RetryConfig) -> RetryPolicy:
    """The policy of a task that sets none: the same for every such task of a config, made once."""
    return _policy(task_pb2.RetryPolicy(), defaults)


def retry_policy(spec: task_pb2.RetryPolicy | None, defaults: RetryConfig) -> RetryPolicy:
    return _default_policy(defaults) if spec is None else _policy(spec, defaults)


def _policy(spec: task_pb2.RetryPolicy, defaults: RetryConfig) -> RetryPolicy:
    field = "retry_policy"
    if spec.max_attempts > MAX_ATTEMPTS:
        raise InvalidArgument(f"{field}.max_attempts", f"must be at most {MAX_ATTEMPTS}")
    coefficient = spec.backoff_coefficient
    if math.isnan(coefficient) or math.isinf(coefficient):
        raise InvalidArgument(f"{field}.backoff_coefficient", "must be a finite number")
    if coefficient != 0 and not 1.0 <= coefficient <= 100.0:
        raise InvalidArgument(f"{field}.backoff_coefficient", "must be between 1 and 100")
    initial = optional_duration(field, spec, "initial_backoff", positive=False)
    maximum = optional_duration(field, spec, "max_backoff", positive=False)
    if len(spec.non_retryable_error_types) > MAX_ERROR_TYPES:
        raise InvalidArgument(
            f"{field}.non_retryable_error_types",
            f"must name at most {MAX_ERROR_TYPES} error types, not {len(spec.non_retryable_error_types):,}",
        )
    policy = RetryPolicy(
        max_attempts=spec.max_attempts or defaults.max_attempts,
        initial_backoff=defaults.initial_backoff if initial is None else initial,
        backoff_coefficient=coefficient or defaults.backoff_coefficient,
        max_backoff=defaults.max_backoff if maximum is None else maximum,
        non_retryable_error_types=tuple(
            name(f"{field}.non_retryable_error_types", t) for t in spec.non_retryable_error_types
        ),
    )
    if maximum is not None and policy.initial_backoff > policy.max_backoff:
        raise InvalidArgument(f"{field}.max_backoff", "must not be less than initial_backoff")
    if maximum is None and policy.max_backoff < policy.initial_backoff:
        policy = RetryPolicy(
            policy.max_attempts,
            policy.initial_backoff,
            policy.backoff_coefficient,
            policy.initial_backoff,
            policy.non_retryable_error_types,
        )
    return policy


MISS_POLICIES = {
    task_pb2.MISS_POLICY_UNSPECIFIED: MissPolicy.RUN_LATE,
    task_pb2.MISS_POLICY_RUN_LATE: MissPolicy.RUN_LATE,
    task_pb2.MISS_POLICY_SKIP: MissPolicy.SKIP,
}
MISS_TO_PROTO = {MissPolicy.RUN_LATE: task_pb2.MISS_POLICY_RUN_LATE, MissPolicy.SKIP: task_pb2.MISS_POLICY_SKIP}
DEFAULT_TOLERANCE = timedelta(seconds=1)


DEFAULT_DURATION = timedelta(minutes=30)


def latest_start(
    spec: task_pb2.TaskSpec, type_config: TypeConfig | None, max_defer: timedelta | None, now: datetime
) -> tuple[datetime | None, timedelta | None]:
    """The latest start of a task that may be deferred, and its estimated run time."""
    if spec.HasField("deadline") and spec.HasField("latest_start"):
        raise InvalidArgument("deadline", "give deadline or latest_start, not both")
    duration = optional_duration("", spec, "estimated_duration")
    if duration is None and type_config is not None:
        duration = type_config.estimated_duration
    latest: datetime | None = None
    for field_name in ("deadline", "latest_start"):
        if spec.HasField(field_name):
            stamp = getattr(spec, field_name)
            if not 0 <= stamp.nanos < 1_000_000_000 or not 0 < stamp.seconds < 253402300800:
                raise InvalidArgument(field_name, "is not a valid timestamp")
            latest = stamp.ToDatetime(tzinfo=UTC)
            if latest < now:
                # Named first: no estimate of the run time makes a past deadline possible.
                raise InvalidArgument(field_name, f"{latest.isoformat()} is in the past")
            if field_name == "deadline":
                if duration is None:
                    raise InvalidArgument("estimated_duration", "is required with a deadline (the latest finish)")
                latest -= duration
            if latest < now:
                raise InvalidArgument(field_name, "leaves no time to run: it is in the past")
            if latest - now > MAX_DURATION:
                raise InvalidArgument(field_name, f"must be at most {MAX_DURATION.days} days ahead")
    if max_defer is not None:
        bound = now + max_defer
        latest = bound if latest is None else min(latest, bound)
    return latest, (duration or DEFAULT_DURATION) if latest is not None else duration


def fixed_start(spec: task_pb2.TaskSpec, type_config: TypeConfig | None, now: datetime) -> FixedStart | None:
    """The fixed start a spec asks for, validated; None for a regular task."""
    has_at, has_in = spec.HasField("start_at"), spec.HasField("start_in")
    if not (has_at or has_in):
        if spec.HasField("start_tolerance"):
            raise InvalidArgument("start_tolerance", "only for a fixed start: set start_at or start_in too")
        if spec.on_miss != task_pb2.MISS_POLICY_UNSPECIFIED:
            raise InvalidArgument("on_miss", "only for a fixed start: set start_at or start_in too")
        return None
    if has_at and has_in:
        raise InvalidArgument("start_at", "give start_at or start_in, not both")
    if has_at:
        if not 0 <= spec.start_at.nanos < 1_000_000_000 or not 0 < spec.start_at.seconds < 253402300800:
            raise InvalidArgument("start_at", "is not a valid timestamp")
        start = spec.start_at.ToDatetime(tzinfo=UTC)
    else:
        start = now + duration("start_in", spec.start_in)
    tolerance = DEFAULT_TOLERANCE
    if spec.HasField("start_tolerance"):
        tolerance = duration("start_tolerance", spec.start_tolerance)
    # The bound ahead comes first: a start near the end of year 9999 plus anything at all is past
    # the last datetime Python can hold (OverflowError); everything below adds to a start within it.
    if start - now > MAX_DURATION:
        raise InvalidArgument("start_at", f"must be at most {MAX_DURATION.days} days ahead")
    if start < now - tolerance:
        raise InvalidArgument("start_at", f"{start.isoformat()} is in the past")
    if spec.on_miss not in MISS_POLICIES:
        raise InvalidArgument("on_miss", f"unknown miss policy {spec.on_miss}")
    estimate = optional_duration("", spec, "estimated_duration")
    if estimate is None:
        estimate = type_config.estimated_duration if type_config else None
    if estimate is None:
        raise InvalidArgument(
            "estimated_duration",
            "is required for a fixed start (or configure [types.NAME] estimated_duration): "
            "the reservation must know how long the task occupies its slot",
        )
    return FixedStart(start, tolerance, MISS_POLICIES[spec.on_miss], estimate)


MAX_HEADERS = 32
MAX_HEADER_KEY = 128
MAX_HEADER_VALUE = 1024
MAX_HEADERS_BYTES = 8192
_HEADER_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def headers(values: Mapping[str, str]) -> dict[str, str]:
    """A task's headers, within their bounds (see TaskSpec.headers)."""
    if not values:
        return {}
    if len(values) > MAX_HEADERS:
        raise InvalidArgument("headers", f"{len(values)} headers is over the limit of {MAX_HEADERS}")
    total = 0
    for key, value in sorted(values.items()):
        shown = key if len(key) <= 40 else key[:40] + "..."
        if not _HEADER_KEY.fullmatch(key):
            raise InvalidArgument(
                "headers", f"key {shown!r}: must be letters, digits, '-', '_' or '.', starting with a letter or digit"
            )
        if len(key) > MAX_HEADER_KEY:
            raise InvalidArgument("headers", f"key {shown!r}: {len(key)} bytes is over the limit of {MAX_HEADER_KEY}")
        size = len(value.encode())
        if size > MAX_HEADER_VALUE:
            raise InvalidArgument(f"headers[{key}]", f"{size} bytes is over the limit of {MAX_HEADER_VALUE}")
        if any(ch < " " or ch == "\x7f" for ch in value):
            raise InvalidArgument(f"headers[{key}]", "must not contain control characters")
        total += len(key) + size
    if total > MAX_HEADERS_BYTES:
        raise InvalidArgument("headers", f"{total} bytes of keys and values is over the limit of {MAX_HEADERS_BYTES}")
    return dict(values)


MAX_DEPENDENCIES = 1000
# Dependencies one SubmitTasks may name in all: each is a row written in the submit's transaction
# (a batch of 1,000 tasks of 1,000 each took 19 s and paused the event loop 0.3 s).
MAX_BATCH_DEPENDENCIES = 100_000


def dependencies(ids: Sequence[int]) -> tuple[int, ...]:
    if not ids:
        return ()
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidArgument("depends_on", f"at most {MAX_DEPENDENCIES} dependencies")
    if any(i <= 0 for i in ids):
        raise InvalidArgument("depends_on", "task ids are positive")
    return tuple(sorted(set(ids)))


# The most pools one task may name.
MAX_POOLS = 16


def task_pools(names: Sequence[str], known: Collection[str]) -> tuple[str, ...]:
    """The pools a task may run in, each a configured one ("default" is always known), at most
    MAX_POOLS, in the order named without repeats."""
    if len(names) > MAX_POOLS:
        raise InvalidArgument("pools", f"{len(names)} pools is over the limit of {MAX_POOLS}")
    out: list[str] = []
    for value in names:
        pool = name("pools", value)
        if pool != "default" and pool not in known:
            shown = ", ".join(sorted({"default", *known}))
            raise InvalidArgument("pools", f"no pool {pool!r} is configured (known: {shown})")
        if pool not in out:
            out.append(pool)
    return tuple(out)


def new_task(
    spec: task_pb2.TaskSpec,
    *,
    defaults: RetryConfig,
    max_payload: int,
    type_defaults: Mapping[str, TypeConfig] | None = None,
    now: datetime | None = None,
    resources: Mapping[str, int] | None = None,
    pools: Collection[str] = (),
) -> NewTask:
    # The key first: a spec refused for any other field may still name a stored task by its key
    # (a re-submit whose answer was lost), looked up only once the key itself is known to be good.
    if len(spec.idempotency_key) > MAX_KEY:
        raise InvalidArgument("idempotency_key", f"must be at most {MAX_KEY} characters")
    if "\x00" in spec.idempotency_key:
        raise InvalidArgument("idempotency_key", "must not contain NUL characters")
    if spec.kind not in PROTO_TO_KIND:
        raise InvalidArgument("kind", f"unknown task kind {spec.kind}")
    if len(spec.payload) > max_payload:
        raise TooLarge(f"payload: {len(spec.payload)} bytes is over the limit of {max_payload} bytes")
    activity_type = name("activity_type", spec.activity_type)
    type_config = (type_defaults or {}).get(activity_type)
    max_defer = optional_duration("", spec, "max_defer")
    schedule_to_start = optional_duration("", spec, "schedule_to_start_timeout")
    if type_config is not None:
        max_defer = type_config.max_defer if max_defer is None else max_defer
        schedule_to_start = type_config.schedule_to_start if schedule_to_start is None else schedule_to_start
    moment = now or datetime.now(UTC)
    fixed = fixed_start(spec, type_config, moment)
    latest, duration = (None, None) if fixed else latest_start(spec, type_config, max_defer, moment)
    if fixed and (spec.HasField("deadline") or spec.HasField("latest_start")):
        raise InvalidArgument("deadline", "a fixed start has no deadline: its start is fixed")
    if fixed and spec.pools:
        raise InvalidArgument("pools", "a fixed start runs in the pool it reserves (pool), not in several")
    return NewTask(
        queue=name("queue", spec.queue, default="default"),
        kind=PROTO_TO_KIND[spec.kind],
        activity_type=activity_type,
        payload=spec.payload,
        priority=spec.priority,
        idempotency_key=spec.idempotency_key or None,
        retry=retry_policy(spec.retry_policy if spec.HasField("retry_policy") else None, defaults),
        schedule_to_start=schedule_to_start,
        start_to_close=optional_duration("", spec, "start_to_close_timeout"),
        heartbeat=heartbeat_timeout(spec),
        max_defer=max_defer,
        pool=name("pool", spec.pool, default="default"),
        fixed=fixed,
        depends_on=dependencies(spec.depends_on),
        resources=validate_resources(dict(spec.resources), resources or {}) or None,
        latest_start=latest,
        duration=duration,
        headers=headers(spec.headers),
        pools=task_pools(spec.pools, pools) if spec.pools else (),
    )


# Workers beat every third of a heartbeat timeout (at most every 50 ms) and the scheduler writes
# the beats of a 100 ms window at once: a shorter timeout than this would lose live attempts.
MIN_HEARTBEAT_TIMEOUT = timedelta(seconds=1)


def heartbeat_timeout(spec: task_pb2.TaskSpec) -> timedelta | None:
    timeout = optional_duration("", spec, "heartbeat_timeout")
    if timeout is not None and timeout < MIN_HEARTBEAT_TIMEOUT:
        raise InvalidArgument(
            "heartbeat_timeout",
            f"must be at least {MIN_HEARTBEAT_TIMEOUT.total_seconds():g}s, not {format_duration(timeout)}: a worker "
            "heartbeats every third of it, and a shorter one would time out attempts whose worker is alive",
        )
    return timeout


def optional_name(field: str, value: str) -> str | None:
    """A filter: empty means no filter, anything else must be a valid name."""
    return name(field, value) if value else None


def stored_text(value: str, limit: int) -> str:
    """Text a worker reports, made storable: PostgreSQL text cannot hold NUL, and size is capped."""
    return value.replace("\x00", "\\0")[:limit]


def state_filter(value: int) -> str | None:
    if value == task_pb2.TASK_STATE_UNSPECIFIED:
        return None
    if value not in PROTO_TO_STATE:
        raise InvalidArgument("state", f"unknown task state {value}")
    return PROTO_TO_STATE[value].value
