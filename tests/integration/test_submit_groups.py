"""Single submits arriving together are stored together (scheduler_service.submit_groups): each
caller still gets its own task, as stored, under its own name, and its own error."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest

from lowtide.auth import hash_token
from lowtide.config import TokenEntry
from lowtide_client import Client
from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.rows.tasks import TaskRow
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.security.conftest import AUTH, TOKENS

OTHER = "s-secret-other"


async def test_concurrent_single_submits_each_answer_with_their_own_task(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        answers = await asyncio.gather(
            *(client.submit("echo", f"task {i}".encode(), queue=f"q{i % 3}", priority=i % 7) for i in range(200))
        )
        stored = [await client.get(a.id) for a in answers]
    assert len({a.id for a in answers}) == 200
    for i, (answer, row) in enumerate(zip(answers, stored, strict=True)):
        assert (answer.payload, answer.queue, answer.priority) == (f"task {i}".encode(), f"q{i % 3}", i % 7)
        assert answer == row


async def test_concurrent_submitters_each_own_the_tasks_they_submitted(database_url: str) -> None:
    auth = replace(AUTH, tokens=(*AUTH.tokens, TokenEntry("other-submitter", "submitter", hash_token(OTHER))))
    scheduler = await start_scheduler(replace(make_config(), auth=auth), database_url=database_url)
    try:
        async with (
            Client(scheduler.target, token=TOKENS["submitter"]) as mine,
            Client(scheduler.target, token=OTHER) as theirs,
        ):
            submitted = await asyncio.gather(
                *(client.submit("echo", b"x") for _ in range(50) for client in (mine, theirs))
            )
            my_tasks, their_tasks = submitted[0::2], submitted[1::2]
            # A submitter may cancel what it submitted, and only that.
            await mine.cancel(my_tasks[-1].id)
            await theirs.cancel(their_tasks[-1].id)
            for task in their_tasks[:5]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await mine.cancel(task.id)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            for task in my_tasks[:5]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await theirs.cancel(task.id)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await scheduler.stop(grace=0.5)


def _task(payload: bytes, headers: dict[str, str] | None = None) -> NewTask:
    retry = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(seconds=10))
    return NewTask("default", Kind.ACTIVITY, "echo", payload, 0, None, retry, None, None, None, headers=headers or {})


async def test_a_task_the_database_refuses_fails_alone_in_its_group(scheduler: Scheduler) -> None:
    # The API refuses such a header before it reaches the database; here the submission is
    # handed one directly, so the database refuses it inside a group of three.
    submission = scheduler.parts.api.submission
    rows: list[dict[int, TaskRow]] = [{}, {}, {}]
    results = await asyncio.gather(
        submission.submit([_task(b"first")], None, rows[0]),
        submission.submit([_task(b"bad", {"h": "\x00"})], None, rows[1]),
        submission.submit([_task(b"third")], None, rows[2]),
        return_exceptions=True,
    )
    assert isinstance(results[1], Exception) and not rows[1]
    first, third = results[0], results[2]
    assert isinstance(first, list) and isinstance(third, list)
    assert rows[0][first[0].id].payload == b"first" and rows[2][third[0].id].payload == b"third"
    async with Client(scheduler.target) as client:
        listed = await client.list(page_size=10)
    # Listings leave payloads out: the two stored are those two.
    assert sorted(t.id for t in listed.tasks) == sorted([first[0].id, third[0].id])
