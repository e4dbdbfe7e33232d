"""RetryTask: a task that ended without completing runs again — after the bug is fixed, the
downstream is back, the task was cancelled by mistake — with one more attempt if it had used all
of its own, and waiting for a dependency that is itself retried. What cannot be retried is refused
with FAILED_PRECONDITION naming why, and nothing about it changes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from lowtide_client import Client, Worker
from lowtide_proto.lowtide.v1.task_pb2 import TaskState
from scheduler_service.server import Scheduler
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
FAILED = TaskState.Value("TASK_STATE_FAILED")
PENDING = TaskState.Value("TASK_STATE_PENDING")
CANCELLED = TaskState.Value("TASK_STATE_CANCELLED")


async def _refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_a_task_that_failed_for_good_runs_again_and_completes(scheduler: Scheduler) -> None:
    fixed = False
    async with Client(scheduler.target) as client, Worker(target=scheduler.target, slots=2) as worker:

        @worker.activity("flaky")
        async def flaky(payload: bytes) -> bytes:
            if not fixed:
                raise RuntimeError("the downstream is down")
            return b"done"

        task = await client.submit("flaky", b"", max_attempts=1)
        failed = await client.wait(task.id)
        assert (failed.state, failed.attempt) == (FAILED, 1)

        fixed = True
        retried = await client.retry(task.id)
        # Pending, due now, one more attempt than it had; its last failure stays until then.
        assert (retried.state, retried.attempt, retried.retry_policy.max_attempts) == (PENDING, 1, 2)
        assert retried.last_failure.error_type == "RuntimeError"
        done = await client.wait(task.id)
    assert (done.state, done.attempt, done.result) == (COMPLETED, 2, b"done")


async def test_a_cancelled_task_runs_when_retried(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.cancel((await client.submit("echo", b"by mistake")).id)
        assert task.state == CANCELLED
        assert (await client.retry(task.id)).state == PENDING
        async with Worker(target=scheduler.target, slots=1) as worker:

            @worker.activity("echo")
            async def echo(payload: bytes) -> bytes:
                return payload

            done = await client.wait(task.id)
    assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"by mistake")


async def test_what_cannot_be_retried_is_refused_and_left_as_it_was(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        pending = await client.submit("nobody-runs-this")
        fixed = await client.submit(
            "nobody-runs-this", start_at=datetime.now(UTC) + timedelta(hours=1), estimated_duration=timedelta(minutes=1)
        )
        await client.cancel(fixed.id)
        async with Worker(target=scheduler.target, slots=1) as worker:

            @worker.activity("echo")
            async def echo(payload: bytes) -> bytes:
                return payload

            completed = await client.wait((await client.submit("echo", b"ok")).id)
        cases = {
            pending.id: (grpc.StatusCode.FAILED_PRECONDITION, "the task is pending"),
            completed.id: (grpc.StatusCode.FAILED_PRECONDITION, "the task completed: submit it again"),
            fixed.id: (grpc.StatusCode.FAILED_PRECONDITION, "a fixed start is not retried"),
            10**12: (grpc.StatusCode.NOT_FOUND, f"task {10**12} not found"),
            0: (grpc.StatusCode.INVALID_ARGUMENT, "id"),
        }
        for task_id, (code, words) in cases.items():
            refused = await _refused(client.retry(task_id))
            assert refused.code() == code, task_id
            assert words in (refused.details() or ""), task_id
        assert (await client.get(pending.id)).state == PENDING
        assert (await client.get(completed.id)).state == COMPLETED
        assert (await client.get(fixed.id)).state == CANCELLED


async def test_a_dependent_is_retried_after_its_dependency_and_waits_for_it(scheduler: Scheduler) -> None:
    fixed = False
    source_back = asyncio.Event()
    # The first attempt fails only once the dependent is in: a dependency already ended failed
    # refuses a new dependent at submit (a worker already connected may be that quick).
    dependent_in = asyncio.Event()
    async with Client(scheduler.target) as client, Worker(target=scheduler.target, slots=2) as worker:

        @worker.activity("extract")
        async def extract(payload: bytes) -> bytes:
            if not fixed:
                await dependent_in.wait()
                raise RuntimeError("source unreachable")
            await source_back.wait()
            return b"rows"

        @worker.activity("load")
        async def load(payload: bytes) -> bytes:
            return b"loaded"

        first = await client.submit("extract", max_attempts=1)
        then = await client.submit("load", depends_on=[first.id])
        dependent_in.set()
        assert (await client.wait(first.id)).state == FAILED
        skipped = await client.wait(then.id)
        assert (skipped.state, skipped.last_failure.error_type) == (FAILED, "DependencyFailed")

        # Its dependency ended failed: retrying the dependent alone would fail it again.
        refused = await _refused(client.retry(then.id))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"it depends on task {first.id}, which ended failed: retry that one first" in (refused.details() or "")

        fixed = True
        await client.retry(first.id)
        assert (await client.retry(then.id)).state == PENDING
        # Its dependency runs again: the dependent waits for it, and says so.
        await eventually(lambda: _running(client, first.id))
        explained = await client.explain(then.id)
        assert explained.task.state == PENDING and "dependenc" in explained.explanation, explained.explanation
        source_back.set()
        done = await client.wait(then.id)
        extracted = await client.get(first.id)
        assert (done.state, done.result, extracted.state) == (COMPLETED, b"loaded", COMPLETED)
        assert done.started_at.ToDatetime() >= extracted.finished_at.ToDatetime()


async def _running(client: Client, task_id: int) -> bool:
    return (await client.get(task_id)).state == TaskState.Value("TASK_STATE_RUNNING")


async def test_a_retry_sent_again_with_the_attempt_it_saw_changes_nothing_and_succeeds(scheduler: Scheduler) -> None:
    """A client that resends RetryTask after UNAVAILABLE cannot know whether its first call was
    carried out. Naming the attempt it saw the task end at (if_attempt) makes the call safe to
    send again: once the task has moved on, it answers the task as it is. Without it, the second
    call is refused as before."""
    async with Client(scheduler.target) as client:
        task = await client.cancel((await client.submit("nobody-runs-this")).id)
        first = await client.retry(task.id, if_attempt=task.attempt)
        again = await client.retry(task.id, if_attempt=task.attempt)
        assert (first.state, again.state) == (PENDING, PENDING)
        assert again.run_at == first.run_at and again.retry_policy == first.retry_policy
        refused = await _refused(client.retry(task.id))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        # An attempt the task has not reached is no end the caller can have seen.
        cancelled = await client.cancel(task.id)
        ahead = await _refused(client.retry(task.id, if_attempt=3))
        assert ahead.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "it has not reached attempt 3 (it is at attempt 0)" in (ahead.details() or "")
        assert (await client.get(task.id)).state == cancelled.state
