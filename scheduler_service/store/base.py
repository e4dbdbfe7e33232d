"""What every part of the store shares: the queries, the database, rows into domain values."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from lowtide.db import Database, load_queries
from lowtide.db.connector import Row
from scheduler_service.domain.model import Attempt, RetryPolicy

Q = load_queries("scheduler_service.sql")

SEPARATOR = "\x1f"


def ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


def retry_policy_of(row: Mapping[str, Any]) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=row["max_attempts"],
        initial_backoff=timedelta(milliseconds=row["initial_backoff_ms"]),
        backoff_coefficient=row["backoff_coefficient"],
        max_backoff=timedelta(milliseconds=row["max_backoff_ms"]),
        non_retryable_error_types=tuple(row["non_retryable_error_types"]),
    )


def attempt_of(row: Mapping[str, Any]) -> Attempt:
    return Attempt(row["id"], row["attempt"], retry_policy_of(row), fixed=row.get("start_at") is not None)


class StoreBase:
    """The state the store's parts share; Store (scheduler_service.store) sets it up."""

    db: Database
    # Told (after commit) about tasks whose last dependency completed, so dispatch wakes.
    on_unblocked: Callable[[list[Row]], None]
    # Queues this replica has recorded in lowtide.queues (see SubmissionStore.submitting).
    registered_queues: set[str]
