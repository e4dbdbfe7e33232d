"""The state diagram of the docs (docs/explanation/task-states.md) against the code: every
transition the code makes is drawn, and every state of the API is in it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lowtide.db import load_queries
from lowtide_client import TaskState
from scheduler_service.domain.model import (
    HEARTBEAT_TIMEOUT,
    START_TO_CLOSE_TIMEOUT,
    WORKER_LOST,
    Attempt,
    Failure,
    RetryPolicy,
)
from scheduler_service.domain.retry import RETRYABLE_ENDS, after_failure, after_success

STATES = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "task-states.md"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(seconds=10), ("Fatal",))
Q = load_queries("scheduler_service.sql")


def drawn() -> set[tuple[str, str]]:
    text = STATES.read_text()
    block = text[text.index("```mermaid\nstateDiagram-v2") :]
    block = block[: block.index("```", 3)]
    return {(a, b) for a, b in re.findall(r"^\s*(\S+) --> ([^\s:]+)", block, re.M)}


def test_every_state_of_the_api_is_drawn() -> None:
    names = [name for name, _ in TaskState.items() if name != "TASK_STATE_UNSPECIFIED"]
    states = {name.removeprefix("TASK_STATE_").lower() for name in names}
    edges = drawn()
    assert states <= {a for a, _ in edges} | {b for _, b in edges}


@pytest.mark.parametrize("attempt", [1, 3])
@pytest.mark.parametrize(
    "failure",
    [
        Failure("ValueError", "boom"),
        Failure("Fatal", "listed non-retryable"),
        Failure("ValueError", "boom", non_retryable=True),
        Failure(WORKER_LOST, "lost"),
        Failure(START_TO_CLOSE_TIMEOUT, "too long"),
        Failure(HEARTBEAT_TIMEOUT, "silent"),
    ],
    ids=lambda f: f"{f.error_type}{'-non-retryable' if f.non_retryable else ''}",
)
def test_what_follows_a_failed_attempt_is_drawn(failure: Failure, attempt: int) -> None:
    # A timeout on the last attempt ends timed_out, not failed: the diagram must say so.
    outcome = after_failure(Attempt(1, attempt, POLICY), failure, NOW)
    assert ("running", outcome.state.value) in drawn()


def test_success_is_drawn() -> None:
    assert ("running", after_success(Attempt(1, 1, POLICY), b"").state.value) in drawn()


# Transitions made in SQL: the query, the state it leaves and the state it sets.
SQL_TRANSITIONS = [
    ("claim_tasks", "pending", "running"),
    ("unclaim_tasks", "running", "pending"),
    ("expire_schedule_to_start", "pending", "timed_out"),
    ("fail_dependents", "pending", "failed"),
    ("cancel_task", "pending", "cancelled"),
    ("cancel_task", "running", "cancelled"),
    ("mark_missed", "pending", "skipped"),
    ("shed_lowest", "pending", "shed"),
    ("shed_oldest", "pending", "shed"),
]


@pytest.mark.parametrize(("query", "before", "after"), SQL_TRANSITIONS)
def test_what_the_queries_do_is_drawn(query: str, before: str, after: str) -> None:
    sql = Q[query]
    assert f"'{before}'" in sql and f"'{after}'" in sql
    assert (before, after) in drawn()


@pytest.mark.parametrize("ended", sorted(RETRYABLE_ENDS))
def test_a_retry_is_drawn_from_every_end_it_takes(ended: str) -> None:
    assert "state = 'pending'" in Q["retry_task"]
    assert (ended, "pending") in drawn()
