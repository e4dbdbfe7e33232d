"""Retry decisions: backoff growth and cap, non-retryable failures, attempts running out, and what
an operator may run again (RetryTask)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.model import Attempt, Failure, RetryPolicy, State
from scheduler_service.domain.retry import (
    RetryVerdict,
    after_failure,
    after_success,
    backoff,
    retry_refusal,
    retry_verdict,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(seconds=3), ("Fatal",))


def test_backoff_grows_by_the_coefficient_and_stops_at_the_maximum() -> None:
    assert [backoff(POLICY, n) for n in (1, 2, 3, 4)] == [
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=3),
        timedelta(seconds=3),
    ]


def test_a_failed_attempt_with_attempts_left_is_retried_after_its_backoff() -> None:
    outcome = after_failure(Attempt(7, 2, POLICY), Failure("Boom", "x"), NOW)
    assert (outcome.state, outcome.run_at) == (State.PENDING, NOW + timedelta(seconds=2))


def test_the_last_attempt_fails_the_task() -> None:
    assert after_failure(Attempt(7, 3, POLICY), Failure("Boom", "x"), NOW).state is State.FAILED


def test_a_timeout_on_the_last_attempt_ends_timed_out() -> None:
    outcome = after_failure(Attempt(7, 3, POLICY), Failure("StartToCloseTimeout", "late"), NOW)
    assert outcome.state is State.TIMED_OUT


def test_non_retryable_failures_end_the_task_at_once() -> None:
    assert after_failure(Attempt(7, 1, POLICY), Failure("Boom", "x", non_retryable=True), NOW).state is State.FAILED
    assert after_failure(Attempt(7, 1, POLICY), Failure("Fatal", "x"), NOW).state is State.FAILED


def test_success_completes_with_the_result() -> None:
    outcome = after_success(Attempt(7, 1, POLICY), b"ok")
    assert (outcome.state, outcome.result) == (State.COMPLETED, b"ok")


@given(
    attempt=st.integers(1, 10_000),
    coefficient=st.floats(1.0, 100.0),
    initial_ms=st.integers(0, 10**6),
    max_ms=st.integers(0, 10**8),
)
def test_backoff_is_never_negative_nor_over_the_maximum(
    attempt: int, coefficient: float, initial_ms: int, max_ms: int
) -> None:
    policy = RetryPolicy(10, timedelta(milliseconds=initial_ms), coefficient, timedelta(milliseconds=max_ms))
    wait = backoff(policy, attempt)
    assert timedelta(0) <= wait <= policy.max_backoff


@pytest.mark.parametrize(
    ("state", "fixed_start", "dependencies", "refused"),
    [
        ("failed", False, {}, None),
        ("timed_out", False, {}, None),
        ("cancelled", False, {}, None),
        ("shed", False, {}, None),
        ("failed", False, {4: "completed", 5: "running", 6: "pending"}, None),
        ("pending", False, {}, "the task is pending"),
        ("running", False, {}, "the task is running"),
        ("completed", False, {}, "the task completed"),
        ("skipped", True, {}, "a fixed start is not retried"),
        ("cancelled", True, {}, "a fixed start is not retried"),
        ("failed", False, {9: "completed", 7: "cancelled", 8: "failed"}, "depends on task 7, which ended cancelled"),
    ],
)
def test_what_may_be_retried(state: str, fixed_start: bool, dependencies: dict[int, str], refused: str | None) -> None:
    reason = retry_refusal(state, fixed_start=fixed_start, dependencies=dependencies)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


ONLY_ENDED = "only a task that ended without completing is retried"


@pytest.mark.parametrize(
    ("state", "attempt", "if_attempt", "expected"),
    [
        # The end the caller saw is still there: retried.
        ("failed", 2, 2, RetryVerdict()),
        ("cancelled", 0, 0, RetryVerdict()),
        # Moved on since (retried already, or by its own policy): answered as it is.
        ("pending", 2, 2, RetryVerdict(as_is=True)),
        ("pending", 0, 0, RetryVerdict(as_is=True)),
        ("running", 3, 2, RetryVerdict(as_is=True)),
        ("completed", 3, 2, RetryVerdict(as_is=True)),
        ("failed", 3, 2, RetryVerdict(as_is=True)),
        # Not given: refused as before.
        (
            "pending",
            2,
            None,
            RetryVerdict(refused="the task is pending: only a task that ended without completing is retried"),
        ),
        # Still at that attempt, but not ended: nothing it may have seen end.
        (
            "running",
            2,
            2,
            RetryVerdict(refused="the task is running: only a task that ended without completing is retried"),
        ),
        ("completed", 2, 2, RetryVerdict(refused="the task completed: submit it again to run it again")),
        ("failed", 1, 2, RetryVerdict(refused="it has not reached attempt 2 (it is at attempt 1)")),
    ],
)
def test_a_retry_that_names_the_end_it_saw(
    state: str, attempt: int, if_attempt: int | None, expected: RetryVerdict
) -> None:
    assert retry_verdict(state, attempt, fixed_start=False, dependencies={}, if_attempt=if_attempt) == expected
