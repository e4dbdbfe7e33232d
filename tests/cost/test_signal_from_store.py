"""A signal change the signal service committed but never streamed (it died or froze between its
commit and its fan-out) still holds the work it should: the scheduler reads the stored state when
its NOTIFY arrives, instead of acting on the last value streamed until stale_after."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import psycopg

from lowtide_client import Client, TaskState
from tests.cost.conftest import Pair
from tests.cost.test_cost_holds import state_of, worker_for
from tests.helpers import eventually

PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def test_a_rise_committed_but_never_streamed_holds_work(pair: Pair, database_url: str) -> None:
    await pair.set_signal(100)
    await eventually(_hold_is(pair, False))
    # The signal service stops streaming (as if killed right after its commit): the rise below is
    # what it would have written, with the NOTIFY its commit delivers, and nothing more.
    await pair.signal.stop(grace=0.1)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn, conn.transaction():
        await conn.execute(
            "UPDATE lowtide.signals SET value = 520, version = version + 1, updated_at = now() WHERE name = 'grid'"
        )
        await conn.execute("SELECT pg_notify('lowtide_signal', 'grid')")
    await eventually(_hold_is(pair, True), within=30)
    async with Client(pair.scheduler.target) as client, worker_for(pair, "train", "echo"):
        train = await client.submit("train")
        echo = await client.submit("echo")
        # The worker runs what it may: train would have run beside echo on the streamed 100.
        assert (await client.wait(echo.id)).state == COMPLETED
        await asyncio.sleep(0.5)
        assert await state_of(client, train.id) == (PENDING, 0)
        explained = await client.explain(train.id)
    assert "520" in explained.explanation


def _hold_is(pair: Pair, active: bool) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return pair.scheduler.parts.holds.main.state.active is active

    return probe
