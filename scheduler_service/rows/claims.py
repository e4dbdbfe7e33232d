"""The claims' rows: each attempt a claim started, with the worker it was recorded for.

Every claim (regular work, due fixed starts, work that needs resources) returns the same columns,
the `_started_attempt` fragment of sql/claims.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class ClaimedRow(NamedTuple):
    """An attempt a claim started: what its worker is sent, and what the scheduler keeps of it.
    A NamedTuple, as every claimed row is made on the hot path: its fields are the columns of
    `_started_attempt`, in that order (lowtide.db.connector.typed_row)."""

    id: int
    attempt: int
    # The worker the attempt was recorded for, in the same statement that started it.
    worker_id: str
    queue: str
    kind: str
    activity_type: str
    payload: bytes
    max_attempts: int
    initial_backoff_ms: int
    backoff_coefficient: float
    max_backoff_ms: int
    non_retryable_error_types: list[str]
    close_deadline: datetime | None
    heartbeat_ms: int | None
    priority: int
    run_at: datetime
    start_at: datetime | None
    start_tolerance_ms: int | None
    start_hit: bool | None
    pool: str
    # None when the task has none (an empty map is not parsed for every claimed row).
    headers: dict[str, str] | None
    # For the task histograms (observe/task_metrics.py).
    started_at: datetime
    released_by: str | None
    hold_deadline: datetime | None
    # A first attempt's submission when a planned release held it, else None.
    planned_since: datetime | None
    signal_at_dispatch: float | None
    # For the carbon totals (observe/carbon_totals.py).
    signal_at_submit: float | None


class RunningOn(NamedTuple):
    """An attempt recorded as running on a worker (running_on_workers, return_strays)."""

    id: int
    attempt: int
    worker_id: str


@dataclass(frozen=True, slots=True)
class RunningCount:
    """How many attempts of a concurrency-limited type run now."""

    activity_type: str
    running: int


@dataclass(frozen=True, slots=True)
class ResourceCandidate:
    """A due task that needs named resources (the resource path picks among them in Python)."""

    id: int
    resources: dict[str, int]
    fixed: bool


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """How much of a named resource running attempts hold."""

    name: str
    used: int
