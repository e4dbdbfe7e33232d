"""Limits a caller runs into, each with a clear error: tasks per batch, message size, and
concurrent streams per connection (one client's flood waits on itself, not on everyone)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import duration_pb2

from lowtide.config import load_config
from lowtide.errors import ConfigError
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually
from tests.integration.test_bad_input import count_tasks


@pytest.fixture
async def limited(database_url: str) -> AsyncIterator[Scheduler]:
    config = make_config(max_batch_tasks=3, max_message_bytes=64 * 1024, max_concurrent_streams=2)
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)


def _own_connection(target: str) -> grpc.aio.Channel:
    # Channels to one target share a connection unless told otherwise; these tests need two.
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


async def test_a_batch_over_the_cap_is_refused_whole(limited: Scheduler, database_url: str) -> None:
    async with _own_connection(limited.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        specs = [task_pb2.TaskSpec(activity_type="echo") for _ in range(4)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=specs))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4 tasks is over the limit of 3" in (refused.value.details() or "")
        assert await count_tasks(database_url) == 0
        accepted = await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=specs[:3]))
    assert len(accepted.tasks) == 3


async def test_a_message_over_the_size_limit_is_refused(limited: Scheduler, database_url: str) -> None:
    async with _own_connection(limited.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        big = task_pb2.TaskSpec(activity_type="echo", payload=b"x" * (65 * 1024))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=big))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details()
        assert await count_tasks(database_url) == 0
        small = task_pb2.TaskSpec(activity_type="echo", payload=b"x" * 1024)
        assert (await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=small))).task.id


async def test_streams_per_connection_are_capped_and_others_carry_on(limited: Scheduler) -> None:
    async with _own_connection(limited.target) as greedy, _own_connection(limited.target) as other:
        greedy_stub = scheduler_pb2_grpc.SchedulerServiceStub(greedy)
        submitted = await greedy_stub.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(task=task_pb2.TaskSpec(activity_type="nobody-runs-this"))
        )
        task_id = submitted.task.id
        wait = scheduler_pb2.WaitTaskRequest(id=task_id, timeout=duration_pb2.Duration(seconds=30))
        # Two calls held open use up the greedy connection's streams ...
        waits = [asyncio.ensure_future(greedy_stub.WaitTask(wait)) for _ in range(2)]
        # Both calls are open once the scheduler has a waiter for each.
        await eventually(lambda: asyncio.sleep(0, len(limited.parts.waiters) == 2), within=30)
        # ... so its third call waits for a free stream, and here times out;
        with pytest.raises(grpc.aio.AioRpcError) as waited:
            await greedy_stub.GetTask(scheduler_pb2.GetTaskRequest(id=task_id), timeout=1.0)
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # another connection is served at once.
        other_stub = scheduler_pb2_grpc.SchedulerServiceStub(other)
        got = await other_stub.GetTask(scheduler_pb2.GetTaskRequest(id=task_id), timeout=2.0)
        assert got.task.id == task_id
        for call in waits:
            call.cancel()
        # With its streams back, the greedy connection is served again.
        again = await greedy_stub.GetTask(scheduler_pb2.GetTaskRequest(id=task_id), timeout=5.0)
        assert again.task.id == task_id


def test_the_stream_limit_is_configurable_and_checked() -> None:
    assert load_config(env={}).scheduler.max_concurrent_streams == 10_000
    assert load_config(env={"LOWTIDE_SCHEDULER_MAX_CONCURRENT_STREAMS": "8"}).scheduler.max_concurrent_streams == 8
    with pytest.raises(ConfigError, match="max_concurrent_streams"):
        load_config(env={"LOWTIDE_SCHEDULER_MAX_CONCURRENT_STREAMS": "0"})
