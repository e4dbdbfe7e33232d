"""What follows an attempt: success, a retry after backoff, or the end."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler_service.domain.model import TIMEOUT_ERRORS, Attempt, Failure, Outcome, RetryPolicy, State
from scheduler_service.domain.submission import ENDED_UNCOMPLETED


def backoff(policy: RetryPolicy, attempt: int) -> timedelta:
    """The wait before the attempt after `attempt` (1-based): initial x coefficient^(attempt-1), capped."""
    initial = policy.initial_backoff.total_seconds()
    cap = policy.max_backoff.total_seconds()
    if initial <= 0 or cap <= 0:
        return timedelta(0) if initial <= 0 else policy.max_backoff
    # Compared in log space: the coefficient raised to a large attempt number overflows a float.
    exponent = max(0, attempt - 1)
    if math.log(initial) + exponent * math.log(policy.backoff_coefficient) >= math.log(cap):
        return policy.max_backoff
    return timedelta(seconds=initial * policy.backoff_coefficient**exponent)


def after_success(attempt: Attempt, result: bytes) -> Outcome:
    return Outcome(attempt.task_id, attempt.attempt, State.COMPLETED, result=result)


def after_failure(attempt: Attempt, failure: Failure, now: datetime) -> Outcome:
    """Retries with backoff unless the failure is non-retryable or attempts are used up.

    A task whose last attempt timed out ends TIMED_OUT, any other FAILED.
    """
    policy = attempt.retry
    retryable = not failure.non_retryable and failure.error_type not in policy.non_retryable_error_types
    if retryable and attempt.attempt < policy.max_attempts:
        run_at = now + backoff(policy, attempt.attempt)
        return Outcome(attempt.task_id, attempt.attempt, State.PENDING, failure=failure, run_at=run_at)
    final = State.TIMED_OUT if failure.error_type in TIMEOUT_ERRORS else State.FAILED
    return Outcome(attempt.task_id, attempt.attempt, final, failure=failure)


# What a task may be retried from (RetryTask): it ended without completing, and not as a fixed
# start skipped at its miss (a fixed start is not run again at another time: submit a new one).
RETRYABLE_ENDS = frozenset({"failed", "timed_out", "cancelled", "shed"})


def retry_refusal(state: str, *, fixed_start: bool, dependencies: Mapping[int, str]) -> str | None:
    """Why a task in `state` cannot be run again now (None: it can). `dependencies`: the state of
    each task it depends on; one that ended without completing would fail it again at once."""
    if state in ("pending", "running"):
        return f"the task is {state}: only a task that ended without completing is retried"
    if state == "completed":
        return "the task completed: submit it again to run it again"
    if fixed_start:
        return "a fixed start is not retried at another time: submit it again with a new start"
    if state not in RETRYABLE_ENDS:
        return f"a {state} task is not retried"
    for dependency, ended in sorted(dependencies.items()):
        if ended in ENDED_UNCOMPLETED:
            return f"it depends on task {dependency}, which ended {ended}: retry that one first"
    return None


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    """What a RetryTask call does: run the task again (neither field set), refuse it (`refused`,
    why), or answer it as it is (`as_is`: the run the caller saw end was retried already)."""

    refused: str | None = None
    as_is: bool = False


def retry_verdict(
    state: str, attempt: int, *, fixed_start: bool, dependencies: Mapping[int, str], if_attempt: int | None = None
) -> RetryVerdict:
    """retry_refusal, for a caller that may say which end it saw (`if_attempt`: the task ended at
    that attempt). A task that has moved on from it since (pending again, or a later attempt)
    was retried already, by an earlier call whose answer was lost or by its own policy: the call
    changes nothing and is no error, so it may be resent."""
    if if_attempt is not None:
        if attempt < if_attempt:
            return RetryVerdict(refused=f"it has not reached attempt {if_attempt} (it is at attempt {attempt})")
        if attempt > if_attempt or state == "pending":
            return RetryVerdict(as_is=True)
    return RetryVerdict(refused=retry_refusal(state, fixed_start=fixed_start, dependencies=dependencies))
