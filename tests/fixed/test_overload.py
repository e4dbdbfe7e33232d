"""Overload: a queue's max_depth with reject, shed_lowest and shed_oldest; fixed starts and held
work are neither counted nor shed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest

from lowtide.config import CostConfig, QueueConfig
from lowtide_client import Client, TaskState, task_spec
from scheduler_service.server import Scheduler, start_scheduler
from tests.fixed.conftest import fixed_config

SHED = TaskState.Value("TASK_STATE_SHED")
PENDING = TaskState.Value("TASK_STATE_PENDING")

QUEUES = {
    "strict": QueueConfig(max_depth=3, overflow="reject"),
    "lowest": QueueConfig(max_depth=3, overflow="shed_lowest"),
    "oldest": QueueConfig(max_depth=3, overflow="shed_oldest"),
}


@pytest.fixture
async def limited(database_url: str) -> AsyncIterator[Scheduler]:
    # No signal service: the signal counts as high, so `train` is held everywhere.
    config = replace(fixed_config(), queues=QUEUES, cost=CostConfig(deferrable_activities=("train",)))
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)


async def test_reject_refuses_a_submit_past_max_depth(limited: Scheduler) -> None:
    async with Client(limited.target) as client:
        await client.submit_many([task_spec("job", queue="strict") for _ in range(3)])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.submit("job", queue="strict")
        # Held work and fixed starts do not count against the depth.
        await client.submit("train", queue="strict")
        await client.submit(
            "job", queue="strict", pool="ten", start_in=timedelta(minutes=5), estimated_duration=timedelta(minutes=1)
        )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue strict is full: 3 claimable tasks pending, max_depth 3" in (caught.value.details() or "")


async def test_shed_lowest_sheds_the_lowest_priority_and_says_why(limited: Scheduler) -> None:
    async with Client(limited.target) as client:
        low = await client.submit("job", queue="lowest", priority=0)
        await client.submit_many([task_spec("job", queue="lowest", priority=5) for _ in range(2)])
        fixed = await client.submit(
            "job", queue="lowest", pool="ten", start_in=timedelta(minutes=5), estimated_duration=timedelta(minutes=1)
        )
        await client.submit("job", queue="lowest", priority=9)
        shed, kept = await client.get(low.id), await client.get(fixed.id)
    assert (shed.state, shed.shed_reason) == (SHED, "queue lowest over max_depth 3 (shed_lowest)")
    assert kept.state == PENDING


async def test_shed_oldest_sheds_the_oldest(limited: Scheduler) -> None:
    async with Client(limited.target) as client:
        first = await client.submit("job", queue="oldest", priority=9)
        await client.submit_many([task_spec("job", queue="oldest") for _ in range(3)])
        listed = await client.list(queue="oldest", state=PENDING)
        shed = await client.get(first.id)
    assert shed.state == SHED
    assert len(listed.tasks) == 3
