"""A task that names the pools it may run in: stored and shown with them, run only by workers of
those pools, and refused by name when it names a pool the scheduler does not know; from the
Python client and the command line alike. A task naming none runs in any pool, as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest

from lowtide.config import PoolConfig
from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually
from tests.integration.test_bad_input import count_tasks
from tests.integration.test_cli import lowtide

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


@pytest.fixture
async def pooled(database_url: str) -> AsyncIterator[Scheduler]:
    config = replace(make_config(), pools={"eu-west": PoolConfig(), "eu-central": PoolConfig()})
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=1.0)


def _worker(scheduler: Scheduler, pool: str, ran: dict[int, str]) -> Worker:
    worker = Worker(target=scheduler.target, pool=pool, slots=2)

    @worker.activity("job")
    async def job(payload: bytes) -> bytes:
        ran[int(payload or b"0")] = pool
        return payload

    return worker


async def test_a_task_naming_pools_runs_only_in_them(pooled: Scheduler) -> None:
    ran: dict[int, str] = {}
    async with Client(pooled.target) as client, _worker(pooled, "eu-west", ran):
        central = await client.submit("job", b"1", pools=["eu-central"])
        anywhere = await client.submit("job", b"2")
        assert list(central.pools) == ["eu-central"] and list(anywhere.pools) == []
        # The eu-west worker runs the task that names no pool, and leaves the other alone.
        done = await client.wait(anywhere.id)
        assert done.state == COMPLETED and ran == {2: "eu-west"}
        assert (await client.get(central.id)).state == PENDING
        async with _worker(pooled, "eu-central", ran):
            finished = await client.wait(central.id)
    assert finished.state == COMPLETED
    assert ran == {1: "eu-central", 2: "eu-west"}
    assert list(finished.pools) == ["eu-central"]


async def test_a_pool_the_scheduler_does_not_know_is_refused_by_name_and_nothing_is_stored(
    pooled: Scheduler, database_url: str
) -> None:
    before = await count_tasks(database_url)
    async with Client(pooled.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await client.submit("job", b"", pools=["eu-west", "eu-north"])
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "pools: no pool 'eu-north' is configured" in (unknown.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as many:
            await client.submit("job", b"", pools=["eu-west"] * 17)
        assert many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "17 pools is over the limit of 16" in (many.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as fixed:
            await client.submit(
                "job", b"", pools=["eu-west"], start_in=timedelta(minutes=5), estimated_duration=timedelta(minutes=1)
            )
        assert "a fixed start runs in the pool it reserves" in (fixed.value.details() or "")
    assert await count_tasks(database_url) == before


async def test_the_command_line_names_pools_with_a_repeated_pool_option(pooled: Scheduler) -> None:
    args = ["task", "submit", "job", "--pool", "eu-west", "--pool", "eu-central", "--no-wait", "--json"]
    run = await lowtide(*args, "--target", pooled.target)
    assert run.code == 0, run.err
    task = json.loads(run.out.splitlines()[0])
    assert task["pools"] == ["eu-west", "eu-central"]
    shown = await lowtide("task", "get", str(task["id"]), "--target", pooled.target)
    assert "queue=default pools=eu-west,eu-central attempt=0" in shown.out
    refused = await lowtide("task", "submit", "job", "--pool", "nowhere", "--no-wait", "--target", pooled.target)
    assert refused.code != 0 and "no pool 'nowhere' is configured" in refused.err
    ran: dict[int, str] = {}
    async with Client(pooled.target) as client, _worker(pooled, "eu-central", ran):
        await eventually(lambda: _completed(client, int(task["id"])))


async def _completed(client: Client, task_id: int) -> bool:
    return (await client.get(task_id)).state == COMPLETED
