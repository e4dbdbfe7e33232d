"""A single submit while a slot of the replica idles is handed to it in the insert that stores it
(scheduler_service/dispatch/handoff.py): it answers running, and still a paused queue, a
concurrency limit and older due work of its queue and type come first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta

import psycopg

from lowtide.config import Config, TypeConfig
from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually

# Far off: whatever starts here was handed or woken, never polled.
NO_POLL = timedelta(minutes=10)
RUNNING = TaskState.Value("TASK_STATE_RUNNING")
PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


@asynccontextmanager
async def _serving(database_url: str, config: Config, slots: int) -> AsyncIterator[tuple[Scheduler, asyncio.Event]]:
    """A scheduler and one worker whose `gated` and `limited` activities run until the event is set."""
    scheduler = await start_scheduler(config, database_url=database_url)
    gate = asyncio.Event()
    worker = Worker(target=scheduler.target, slots=slots, worker_id="idle")

    async def gated(payload: bytes) -> bytes:
        await gate.wait()
        return payload

    worker.register("gated", gated)
    worker.register("limited", gated)

    async def idle() -> bool:
        # Connected, and the claim its arrival asked for is done (it holds the slots meanwhile).
        groups = scheduler.registry.groups()
        return len(scheduler.registry) == 1 and len(groups) == 1 and groups[0].claims == 0

    try:
        async with worker:
            await eventually(idle, within=30)
            yield scheduler, gate
    finally:
        gate.set()
        await scheduler.stop(grace=1.0)


async def test_a_task_submitted_while_a_slot_idles_answers_running_and_runs(database_url: str) -> None:
    config = make_config(poll_interval=NO_POLL)
    async with _serving(database_url, config, 2) as (scheduler, gate), Client(scheduler.target) as client:
        task = await client.submit("gated", b"now")
        assert (task.state, task.attempt, task.worker_id) == (RUNNING, 1, "idle")
        gate.set()
        done = await client.wait(task.id, timeout=timedelta(seconds=20))
    assert (done.state, done.result, done.attempt) == (COMPLETED, b"now", 1)


async def test_a_paused_queue_s_task_waits_for_its_resume(database_url: str) -> None:
    config = make_config(poll_interval=NO_POLL)
    async with _serving(database_url, config, 2) as (scheduler, gate), Client(scheduler.target) as client:
        gate.set()
        await client.pause_queue("default")
        task = await client.submit("gated", b"later")
        assert task.state == PENDING
        await client.resume_queue("default")
        done = await client.wait(task.id, timeout=timedelta(seconds=20))
    assert done.state == COMPLETED


async def test_a_type_at_its_concurrency_limit_is_not_handed_past_it(database_url: str) -> None:
    config = replace(make_config(poll_interval=NO_POLL), types={"limited": TypeConfig(max_concurrency=1)})
    async with _serving(database_url, config, 4) as (scheduler, gate), Client(scheduler.target) as client:
        submitted = await asyncio.gather(*(client.submit("limited", b"%d" % i) for i in range(3)))
        assert [t.state for t in submitted].count(RUNNING) <= 1

        async def one_running() -> bool:
            return [(await client.get(t.id)).state for t in submitted].count(RUNNING) == 1

        await eventually(one_running, within=20)
        gate.set()
        done = [await client.wait(t.id, timeout=timedelta(seconds=20)) for t in submitted]
    assert [t.state for t in done] == [COMPLETED] * 3


async def test_older_due_work_of_the_same_type_goes_first(database_url: str) -> None:
    async with (
        _serving(database_url, make_config(poll_interval=NO_POLL), 1) as (scheduler, gate),
        Client(scheduler.target) as client,
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn,
    ):
        await client.pause_queue("default")
        older = await client.submit("gated", b"older")
        # Resumed behind the scheduler's back: the older task is due, and nothing woke dispatch
        # for it, so the slot still idles when the next one comes.
        await conn.execute("UPDATE lowtide.queues SET paused = false WHERE name = 'default'")
        newer = await client.submit("gated", b"newer")
        assert newer.state == PENDING

        async def older_running() -> bool:
            return (await client.get(older.id)).state == RUNNING

        await eventually(older_running, within=20)
        gate.set()
        first = await client.wait(older.id, timeout=timedelta(seconds=20))
        second = await client.wait(newer.id, timeout=timedelta(seconds=20))
    assert (first.state, second.state) == (COMPLETED, COMPLETED)
    assert first.started_at.ToDatetime() <= second.started_at.ToDatetime()


async def test_one_task_at_a_time_on_an_idle_replica_runs_without_a_claim(database_url: str) -> None:
    # Each task is handed as it is stored, and the slot its result frees claims nothing, since
    # nothing waits for it: the queue costs no claim statement at all.
    async with _serving(database_url, make_config(poll_interval=NO_POLL), 2) as (scheduler, gate):
        gate.set()
        claims = scheduler.dispatcher.claims_run
        async with Client(scheduler.target) as client:
            for i in range(10):
                task = await client.submit("gated", b"%d" % i)
                done = await client.wait(task.id, timeout=timedelta(seconds=20))
                assert (done.state, done.result) == (COMPLETED, b"%d" % i)
        assert scheduler.dispatcher.claims_run == claims
