"""The carbon figures of GetStatus are kept as totals: every replica's dispatches count (a first
attempt each), they show on any replica, and they stay when the tasks behind them are deleted,
as retention does: a status reads the totals, never the history of tasks."""

from __future__ import annotations

from datetime import timedelta

import psycopg

from lowtide_client import Client, TaskState, Worker, activity
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer
from tests.cost.conftest import Pair, cost_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def _train(payload: bytes) -> bytes:
    if payload == b"fail once" and activity.context().attempt == 1:
        raise RuntimeError("the first attempt fails")
    return payload


async def _carbon(scheduler: Scheduler) -> list[tuple[str, int, float, float]]:
    async with Client(scheduler.target) as client:
        status = await client.status()
    return [(c.activity_type, c.tasks, round(c.mean_at_submit), round(c.mean_at_dispatch)) for c in status.carbon]


async def test_carbon_counts_every_replicas_dispatches_once_and_outlives_the_tasks(
    pair: Pair, signal: SignalServer, database_url: str
) -> None:
    other = await start_scheduler(cost_config(signal.target), database_url=database_url)
    try:
        await pair.set_signal(520)
        worker = Worker(target=pair.scheduler.target, slots=2)
        worker.register("train", _train)
        async with Client(pair.scheduler.target) as client:
            held = await client.submit("train", b"ok")
            # Failed once and run again: one task, counted once.
            retried = await client.submit(
                "train", b"fail once", max_attempts=2, initial_backoff=timedelta(milliseconds=10)
            )
            async with worker:
                await pair.set_signal(150)
                for task_id in (held.id, retried.id):
                    done = await client.wait(task_id, timeout=timedelta(seconds=10))
                    assert done.state == COMPLETED
                assert done.attempt == 2
        # Where they were dispatched at once; on the other replica once written (within a second).
        assert await _carbon(pair.scheduler) == [("train", 2, 520, 150)]
        await eventually(lambda: _seen(other, [("train", 2, 520, 150)]), within=15)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("DELETE FROM lowtide.tasks")
        assert await _carbon(other) == [("train", 2, 520, 150)]
    finally:
        await other.stop(grace=0.5)


async def _seen(scheduler: Scheduler, expected: list[tuple[str, int, float, float]]) -> bool:
    return await _carbon(scheduler) == expected
