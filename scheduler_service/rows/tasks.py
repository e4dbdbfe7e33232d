"""The task side's rows: a task as the API shows it, the attempts the scheduler ends, and the
small rows of a submission's and a settlement's statements.

`TaskRow` is the one whole task (get_task, list_tasks, cancel_task select the same column list,
the `_task_row` fragment of sql/tasks.sql); a task column is a field here and a name there. The
other classes are the few columns one statement returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: int
    queue: str
    kind: str
    activity_type: str
    # Empty in a listing (list_tasks leaves payloads and results out).
    payload: bytes
    priority: int
    idempotency_key: str | None
    state: str
    attempt: int
    max_attempts: int
    initial_backoff_ms: int
    backoff_coefficient: float
    max_backoff_ms: int
    non_retryable_error_types: list[str]
    schedule_to_start_ms: int | None
    start_to_close_ms: int | None
    heartbeat_ms: int | None
    created_at: datetime
    run_at: datetime
    schedule_to_start_deadline: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    close_deadline: datetime | None
    heartbeat_deadline: datetime | None
    result: bytes | None
    error_type: str | None
    error_message: str | None
    error_non_retryable: bool | None
    cancel_requested: bool
    max_defer_ms: int | None
    hold_deadline: datetime | None
    released_by: str | None
    signal_at_submit: float | None
    signal_at_dispatch: float | None
    pool: str
    start_at: datetime | None
    start_tolerance_ms: int | None
    on_miss: str | None
    estimated_duration_ms: int | None
    missed: bool
    miss_reason: str | None
    start_hit: bool | None
    deps_pending: int
    has_dependents: bool
    shed_reason: str | None
    resources: dict[str, Any] | None
    latest_start: datetime | None
    planned_release_at: datetime | None
    planned_intensity: float | None
    plan_reason: str | None
    submitted_by: str | None
    headers: dict[str, str]
    # The newest heartbeat details its activity reported; None for none (and in a listing).
    heartbeat_details: bytes | None
    pools: list[str] | None
    planned_pool: str | None
    # The tasks this one depends on, ascending; None for none. (The fields above are the
    # table's columns in its order: the group insert's rows fill them as they come.)
    depends_on: list[int] | None


@dataclass(frozen=True, slots=True)
class CancelledRow(TaskRow):
    """A task cancel_task ended (or found ended), with the state it had before."""

    previous_state: str


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """A running attempt, with what decides its retry (running_attempts_of_worker, adopt_attempts)."""

    id: int
    attempt: int
    max_attempts: int
    initial_backoff_ms: int
    backoff_coefficient: float
    max_backoff_ms: int
    non_retryable_error_types: list[str]
    start_at: datetime | None


@dataclass(frozen=True, slots=True)
class ExpiredRow(AttemptRow):
    """A running attempt past a deadline or whose worker's lease is gone, and which of these."""

    worker_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class EndedRow:
    """A task a statement just ended (or requeued), for settling its dependents."""

    id: int
    state: str
    has_dependents: bool


class FinishedRow(NamedTuple):
    """An attempt finish_attempts applied, with its labels and run time for the task metrics
    (and, like an EndedRow, what settling its dependents needs). A NamedTuple, made per task on
    the hot path: its fields are the statement's columns, in order."""

    id: int
    attempt: int
    state: str
    has_dependents: bool
    queue: str
    activity_type: str
    # None only for an attempt that never recorded its start.
    run_time: timedelta | None


@dataclass(frozen=True, slots=True)
class UnblockedRow:
    """A pending task whose dependencies release_dependents counted down (due once none is left)."""

    id: int
    queue: str
    activity_type: str
    pool: str
    start_at: datetime | None
    deps_pending: int


@dataclass(frozen=True, slots=True)
class KeyedRow:
    """A task stored under an idempotency key (insert_tasks, tasks_by_idempotency_key)."""

    id: int
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class TaskId:
    """A task id (next_task_id)."""

    id: int


@dataclass(frozen=True, slots=True)
class StateRow:
    """A task a submission depends on, and its state (lock_dependencies)."""

    id: int
    state: str


@dataclass(frozen=True, slots=True)
class ReservationRow:
    """A fixed start's booked window (overlapping_reservations)."""

    task_id: int
    window_start: datetime
    window_end: datetime


@dataclass(frozen=True, slots=True)
class DepthRow:
    """How many tasks of a queue count against its max_depth (claimable_depth)."""

    depth: int
