"""The scheduler's vocabulary, free of protobuf and SQL."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from scheduler_service.domain.fixed import FixedStart


class State(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    SHED = "shed"

    @property
    def finished(self) -> bool:
        return self not in (State.PENDING, State.RUNNING)


class Kind(StrEnum):
    ACTIVITY = "activity"
    WORKFLOW = "workflow"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    initial_backoff: timedelta
    backoff_coefficient: float
    max_backoff: timedelta
    non_retryable_error_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated submission, ready to store."""

    queue: str
    kind: Kind
    activity_type: str
    payload: bytes
    priority: int
    idempotency_key: str | None
    retry: RetryPolicy
    schedule_to_start: timedelta | None
    start_to_close: timedelta | None
    heartbeat: timedelta | None
    max_defer: timedelta | None = None
    pool: str = "default"
    fixed: FixedStart | None = None
    depends_on: tuple[int, ...] = ()
    resources: Mapping[str, int] | None = None
    # The latest start (from a deadline, latest_start or max_defer) and its estimated run time.
    latest_start: datetime | None = None
    duration: timedelta | None = None
    # Set at submission when a forecast plans the release.
    planned_release_at: datetime | None = None
    planned_intensity: float | None = None
    plan_reason: str | None = None
    # The pools it may run in (empty: any), and the one its plan placed it in.
    pools: tuple[str, ...] = ()
    planned_pool: str | None = None
    # Sent to the worker of every attempt (a trace context, say); validated by wire.inbound.headers.
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failure:
    error_type: str
    message: str
    non_retryable: bool = False


# Failures the scheduler itself records when an attempt ends without a report.
WORKER_LOST = "WorkerLost"
START_TO_CLOSE_TIMEOUT = "StartToCloseTimeout"
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
SCHEDULE_TO_START_TIMEOUT = "ScheduleToStartTimeout"
TIMEOUT_ERRORS = frozenset({START_TO_CLOSE_TIMEOUT, HEARTBEAT_TIMEOUT, SCHEDULE_TO_START_TIMEOUT})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One running attempt, as the scheduler needs it to decide what follows it."""

    task_id: int
    attempt: int
    retry: RetryPolicy
    # A fixed-start task: its retries are claimed per pool, ahead of regular work.
    fixed: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What becomes of a task when one of its attempts ends.

    state is PENDING for a retry (run again at run_at), else the final state.
    """

    task_id: int
    attempt: int
    state: State
    result: bytes | None = None
    failure: Failure | None = None
    run_at: datetime | None = None
