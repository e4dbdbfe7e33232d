"""Named resources: a task runs only when its amounts are free; a fixed start waits for them on
its held slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest

from lowtide_client import Client, TaskState, Worker, task_spec
from scheduler_service.server import Scheduler, start_scheduler
from tests.fixed.conftest import fixed_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


@pytest.fixture
async def with_gpus(database_url: str) -> AsyncIterator[Scheduler]:
    config = replace(fixed_config(), resources={"gpu": 2, "license": 1})
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)


def measuring_worker(scheduler: Scheduler, pool: str, slots: int, log: list[tuple[str, str]]) -> Worker:
    worker = Worker(target=scheduler.target, pool=pool, slots=slots)

    async def run(payload: bytes) -> bytes:
        name, _, seconds = payload.decode().partition(":")
        log.append(("start", name))
        await asyncio.sleep(float(seconds or 0))
        log.append(("end", name))
        return payload

    worker.register("job", run)
    return worker


def most_at_once(log: list[tuple[str, str]], prefix: str) -> int:
    running = peak = 0
    for event, name in log:
        if name.startswith(prefix):
            running += 1 if event == "start" else -1
            peak = max(peak, running)
    return peak


async def test_tasks_never_use_more_than_the_resource_capacity(with_gpus: Scheduler) -> None:
    log: list[tuple[str, str]] = []
    async with Client(with_gpus.target) as client, measuring_worker(with_gpus, "default", 8, log):
        submitted = await client.submit_many(
            [task_spec("job", f"gpu-{i}:0.3", resources={"gpu": 1}) for i in range(6)]
            + [task_spec("job", f"plain-{i}:0.3") for i in range(4)]
        )
        for task in submitted:
            assert (await client.wait(task.id, timeout=timedelta(seconds=15))).state == COMPLETED
    assert most_at_once(log, "gpu") == 2
    assert most_at_once(log, "plain") >= 3


async def test_unknown_resources_and_impossible_amounts_are_refused(with_gpus: Scheduler) -> None:
    async with Client(with_gpus.target) as client:
        for resources, message in (({"tpu": 1}, "unknown resource 'tpu'"), ({"gpu": 3}, "more than the capacity 2")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.submit("job", resources=resources)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (caught.value.details() or "")


async def test_a_fixed_start_waits_for_its_resources_keeping_its_slot(with_gpus: Scheduler) -> None:
    log: list[tuple[str, str]] = []
    async with Client(with_gpus.target) as client, measuring_worker(with_gpus, "two", 3, log):
        holder = await client.submit("job", "license-holder:3", resources={"license": 1})
        await eventually(lambda: _started(log, "license-holder"))
        fixed = await client.submit(
            "job",
            "fixed",
            pool="two",
            resources={"license": 1},
            start_in=timedelta(milliseconds=300),
            start_tolerance=timedelta(milliseconds=100),
            estimated_duration=timedelta(seconds=1),
        )
        # Past its start, still waiting for the license: its slot stays held. (The holder runs
        # for 3 s, far past this read even on a slow machine; the read is checked to be inside it.)
        await asyncio.sleep(0.8)
        status = await client.status()
        holder_ended_before_the_read = ("end", "license-holder") in log
        [pool] = [p for p in status.pools if p.name == "two"]
        done = await client.wait(fixed.id, timeout=timedelta(seconds=10))
        assert (await client.get(holder.id)).state == COMPLETED
    assert not holder_ended_before_the_read
    assert pool.held_slots == 1
    assert done.state == COMPLETED
    assert log.index(("start", "fixed")) > log.index(("end", "license-holder"))


async def _started(log: list[tuple[str, str]], name: str) -> bool:
    return ("start", name) in log
