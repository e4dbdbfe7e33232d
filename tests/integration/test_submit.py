"""Submitting, reading, listing and cancelling tasks through a real scheduler and database."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from lowtide_client import Client, TaskState, task_spec
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.server import Scheduler


async def test_submit_then_get_returns_the_stored_task(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("echo", b"hi", queue="q1", priority=3)
        got = await client.get(task.id)
    assert got.id == task.id
    assert got.state == TaskState.Value("TASK_STATE_PENDING")
    assert (got.queue, got.activity_type, got.payload, got.priority, got.attempt) == (
        "q1",
        "echo",
        b"hi",
        3,
        0,
    )


async def test_a_submit_answers_with_the_task_exactly_as_stored(scheduler: Scheduler) -> None:
    # A plain task comes back from its insert, a keyed or dependent one is read back after its
    # transaction: either way the answer is what GetTask reads (no worker runs anything here).
    async with Client(scheduler.target) as client:

        async def submit(payload: bytes, key: str | None = None, after: Sequence[int] = ()) -> task_pb2.Task:
            return await client.submit(
                "echo",
                payload,
                queue="q1",
                priority=7,
                max_attempts=4,
                initial_backoff=timedelta(seconds=2),
                start_to_close_timeout=timedelta(minutes=3),
                headers={"tenant": "acme"},
                idempotency_key=key,
                depends_on=after,
            )

        plain = await submit(b"plain")
        keyed = await submit(b"keyed", "answer-1")
        again = await submit(b"ignored", "answer-1")
        dependent = await submit(b"after", after=[plain.id])
        for answer in (plain, keyed, again, dependent):
            assert answer == await client.get(answer.id)
    assert again.id == keyed.id and again.payload == b"keyed"
    assert list(dependent.depends_on) == [plain.id]
    assert (plain.payload, plain.priority, dict(plain.headers)) == (b"plain", 7, {"tenant": "acme"})


async def test_same_idempotency_key_returns_the_first_task(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        first = await client.submit("echo", b"1", idempotency_key="order-42")
        second = await client.submit("echo", b"2", idempotency_key="order-42")
        batch = await client.submit_many(
            [
                task_spec("echo", b"3", idempotency_key="order-42"),
                task_spec("echo", idempotency_key="new"),
                task_spec("echo", idempotency_key="new"),
            ]
        )
        listed = await client.list(page_size=100)
    assert second.id == first.id and second.payload == b"1"
    assert [(t.id == first.id, t.created) for t in batch[:1]] == [(True, False)]
    assert batch[1].created and not batch[2].created and batch[2].id == batch[1].id
    assert len(listed.tasks) == 2


async def test_a_resubmit_answers_the_stored_task_after_its_dependency_ended(scheduler: Scheduler) -> None:
    # A client resending a submit whose answer it lost, once the task's dependency has failed
    # or been cancelled meanwhile, gets its task back: the refusal a new task would get (it
    # could never run) is not for the one stored under the key.
    async with Client(scheduler.target) as client:
        parent = await client.submit("echo", b"parent")
        spec = task_spec("echo", b"child", depends_on=[parent.id], idempotency_key="child-of-parent")
        [first] = await client.submit_many([spec])
        await client.cancel(parent.id)
        [again] = await client.submit_many([spec])
        alone = await client.submit("echo", b"child", depends_on=[parent.id], idempotency_key="child-of-parent")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.submit("echo", b"new", depends_on=[parent.id], idempotency_key="a-new-child")
    assert (again.id, again.created) == (first.id, False)
    assert alone.id == first.id
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_resubmit_answers_the_stored_task_once_its_deadline_has_passed(scheduler: Scheduler) -> None:
    # Sent again after a lost answer, a submit whose deadline has passed meanwhile gets its
    # task back; only a new task is refused for a deadline in the past.
    deadline = datetime.now(UTC) + timedelta(seconds=1)
    options: dict[str, Any] = {"deadline": deadline, "estimated_duration": timedelta(milliseconds=100)}
    spec = task_spec("echo", b"late", idempotency_key="late-resend", **options)
    async with Client(scheduler.target) as client:
        [first] = await client.submit_many([spec])
        await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()))  # until it has passed
        alone = await client.submit("echo", b"late", idempotency_key="late-resend", **options)
        batch = await client.submit_many([spec, task_spec("echo", b"fresh")])
        with pytest.raises(grpc.aio.AioRpcError) as single:
            await client.submit("echo", b"new", idempotency_key="a-new-one", **options)
        with pytest.raises(grpc.aio.AioRpcError) as in_batch:
            await client.submit_many([task_spec("echo"), task_spec("echo", idempotency_key="another", **options)])
    assert (alone.id, alone.payload) == (first.id, b"late")
    assert [(t.id == first.id, t.created) for t in batch] == [(True, False), (False, True)]
    assert single.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "deadline" in (single.value.details() or "")
    assert in_batch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (in_batch.value.details() or "").startswith("tasks[1].deadline")


async def test_cancel_pending_task_ends_it(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        task = await client.submit("echo")
        cancelled = await client.cancel(task.id)
        again = await client.get(task.id)
    assert cancelled.state == again.state == TaskState.Value("TASK_STATE_CANCELLED")


async def test_unknown_task_is_not_found(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.get(987654)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "987654" in (caught.value.details() or "")


async def test_list_pages_through_everything(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        ids = [s.id for s in await client.submit_many([task_spec("echo") for _ in range(25)])]
        seen: list[int] = []
        token = ""
        while True:
            page = await client.list(page_size=10, page_token=token)
            seen += [t.id for t in page.tasks]
            token = page.next_page_token
            if not token:
                break
    assert seen == sorted(ids, reverse=True)


async def test_submit_many_splits_batches_that_would_name_too_many_dependencies(scheduler: Scheduler) -> None:
    # The scheduler takes at most 100,000 dependencies over one SubmitTasks; 150 tasks of 1,000
    # each go in batches that stay under it, and every task is stored with all of its own.
    async with Client(scheduler.target) as client:
        firsts = [t.id for t in await client.submit_many(task_spec("nothing-runs-this") for _ in range(1000))]
        then = await client.submit_many(task_spec("nothing-runs-this", depends_on=firsts) for _ in range(150))
        assert len(then) == 150 and all(t.created for t in then)
        for task in (then[0], then[-1]):
            stored = await client.get(task.id)
            assert sorted(stored.depends_on) == firsts
