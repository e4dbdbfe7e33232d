"""The activity context of a Python worker against a real scheduler: attempt, deadline, task id
and headers; heartbeat details stored and shown by GetTask and `lowtide task get`; a cancel
seen by a running activity, async (CancelledError) and plain (the cancelled event)."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from lowtide_client import Client, Worker, activity
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.server import Scheduler
from tests.deploy.conftest import run_lowtide
from tests.helpers import eventually


@dataclass
class Progress:
    done: int
    of: int


async def test_an_activity_sees_its_attempt_and_its_heartbeat_details_are_stored(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[activity.ActivityContext] = []
    release = asyncio.Event()

    async def step(payload: bytes) -> bytes:
        ctx = activity.context()
        seen.append(ctx)
        ctx.logger.info("stepping")
        ctx.heartbeat(Progress(done=3, of=10))
        await release.wait()
        return b"ok"

    worker = Worker(target=scheduler.target, slots=1)
    worker.register("step", step)
    caplog.set_level(logging.INFO, logger="lowtide_client.activity")
    async with Client(scheduler.target) as client, worker:
        task = await client.submit(
            "step", b"", start_to_close_timeout=timedelta(minutes=5), headers={"x-run": "7"}, max_attempts=2
        )

        async def stored() -> bool:
            return (await client.get(task.id)).heartbeat_details == b'{"done":3,"of":10}'

        await eventually(stored)
        shown = await run_lowtide("task", "get", str(task.id), "--target", scheduler.target)
        release.set()
        done = await client.wait(task.id)
    assert shown.returncode == 0, shown.stderr
    assert 'heartbeat_details=\'{"done":3,"of":10}\'' in shown.stdout
    assert done.state == task_pb2.TASK_STATE_COMPLETED
    assert done.heartbeat_details == b'{"done":3,"of":10}'  # kept after the attempt
    ctx = seen[0]
    assert (ctx.task_id, ctx.attempt, ctx.activity_type) == (task.id, 1, "step")
    assert ctx.headers["x-run"] == "7"
    assert ctx.deadline is not None
    assert datetime.now(UTC) < ctx.deadline < datetime.now(UTC) + timedelta(minutes=6)
    record = next(r for r in caplog.records if r.name == "lowtide_client.activity")
    assert getattr(record, "task_id", None) == task.id
    assert f"task_id={task.id}" in record.getMessage()


async def test_a_cancel_reaches_running_activities_async_and_plain(scheduler: Scheduler) -> None:
    async_cancelled = asyncio.Event()
    plain_saw_cancel = threading.Event()
    started: set[str] = set()

    async def waits(payload: bytes) -> bytes:
        started.add("async")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            async_cancelled.set()
            raise
        return b""

    def spins(payload: bytes) -> bytes:
        ctx = activity.context()
        started.add("plain")
        if ctx.cancelled.wait(timeout=30):
            plain_saw_cancel.set()
            ctx.raise_if_cancelled()
        return b"not cancelled"

    worker = Worker(target=scheduler.target, slots=2)
    worker.register("waits", waits)
    worker.register("spins", spins)
    async with Client(scheduler.target) as client, worker:
        first = await client.submit("waits")
        second = await client.submit("spins")

        async def both_running() -> bool:
            return started == {"async", "plain"}

        await eventually(both_running)
        await client.cancel(first.id)
        await client.cancel(second.id)
        await asyncio.wait_for(async_cancelled.wait(), 10)
        await eventually(lambda: _is_set(plain_saw_cancel))
        assert async_cancelled.is_set()
        assert (await client.get(second.id)).state == task_pb2.TASK_STATE_CANCELLED


async def _is_set(event: threading.Event) -> bool:
    return event.is_set()


def test_context_outside_an_activity_says_so() -> None:
    with pytest.raises(LookupError, match="only available inside a running activity"):
        activity.context()
