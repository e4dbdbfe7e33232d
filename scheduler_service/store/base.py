"""What every part of the store shares: the queries, the database, rows into domain values."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from lowtide.db import Database, load_queries
from scheduler_service.domain.model import Attempt, RetryPolicy
from scheduler_service.rows.tasks import UnblockedRow

Q = load_queries("scheduler_service.sql")

SEPARATOR = "\x1f"


def ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


class AttemptColumns(Protocol):
    """The columns of a row that make an Attempt: a started claim's, an AttemptRow's, an ExpiredRow's."""

    @property
    def id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def initial_backoff_ms(self) -> int: ...
    @property
    def backoff_coefficient(self) -> float: ...
    @property
    def max_backoff_ms(self) -> int: ...
    @property
    def non_retryable_error_types(self) -> list[str]: ...
    @property
    def start_at(self) -> datetime | None: ...


def retry_policy_of(row: AttemptColumns) -> RetryPolicy:
    return _retry_policy(
        row.max_attempts,
        row.initial_backoff_ms,
        row.backoff_coefficient,
        row.max_backoff_ms,
        tuple(row.non_retryable_error_types),
    )


@functools.lru_cache(maxsize=4096)
def _retry_policy(
    max_attempts: int, initial_ms: int, coefficient: float, max_ms: int, non_retryable: tuple[str, ...]
) -> RetryPolicy:
    # Shared between the attempts that have the same policy (most do): one frozen value, not one
    # per claimed task.
    return RetryPolicy(
        max_attempts=max_attempts,
        initial_backoff=timedelta(milliseconds=initial_ms),
        backoff_coefficient=coefficient,
        max_backoff=timedelta(milliseconds=max_ms),
        non_retryable_error_types=non_retryable,
    )


def attempt_of(row: AttemptColumns) -> Attempt:
    return Attempt(row.id, row.attempt, retry_policy_of(row), fixed=row.start_at is not None)


class StoreBase:
    """The state the store's parts share; Store (scheduler_service.store) sets it up."""

    db: Database
    # Told (after commit) about tasks whose last dependency completed, so dispatch wakes.
    on_unblocked: Callable[[list[UnblockedRow]], None]
    # Queues this replica has recorded in lowtide.queues (see SubmissionStore.submitting).
    registered_queues: set[str]
