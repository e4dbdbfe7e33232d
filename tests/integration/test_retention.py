"""Finished tasks are kept for `[scheduler] retention` after they finished, then the leader deletes
them (their dependency edges with them); pending and running work is never deleted, however old,
and `retention = 0s` keeps everything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import grpc
import psycopg
import pytest

from lowtide_client import Client, Worker
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually, scrape_metrics


@pytest.fixture
async def kept_an_hour(database_url: str) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(make_config(retention=timedelta(hours=1)), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


def _finished_ago(database_url: str, ids: list[int], ago: timedelta) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE lowtide.tasks SET finished_at = now() - %s, created_at = now() - %s, run_at = now() - %s "
            "WHERE id = ANY(%s)",
            (ago, ago, ago, ids),
        )


async def _gone(client: Client, task_id: int) -> bool:
    try:
        await client.get(task_id)
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND, error
        return True
    return False


async def test_tasks_finished_longer_ago_than_the_retention_are_deleted_and_no_others(
    kept_an_hour: Scheduler, database_url: str
) -> None:
    target = kept_an_hour.target
    async with Client(target) as client:
        async with Worker(target=target, slots=4) as worker:

            @worker.activity("echo")
            async def echo(payload: bytes) -> bytes:
                return payload

            old = await client.submit("echo", b"old", idempotency_key="nightly-2026-12-01")
            dependent = await client.submit("echo", b"after old", depends_on=[old.id])
            recent = await client.submit("echo", b"recent")
            for task in (old, dependent, recent):
                await client.wait(task.id)
        cancelled = await client.cancel((await client.submit("nobody-runs-this")).id)
        waiting = await client.submit("nobody-runs-this")
        # Two hours old: the finished one, the cancelled one, and the pending one (still waiting).
        _finished_ago(database_url, [old.id, cancelled.id, waiting.id], timedelta(hours=2))

        await eventually(lambda: _gone(client, old.id), within=20)
        await eventually(lambda: _gone(client, cancelled.id), within=20)
        assert (await client.get(waiting.id)).state == waiting.state
        assert (await client.get(recent.id)).result == b"recent"
        assert (await client.get(dependent.id)).result == b"after old"
        with psycopg.connect(database_url) as conn:
            edges = conn.execute("SELECT count(*) FROM lowtide.task_dependencies").fetchone()
        assert edges == (0,)
        # The idempotency key went with its task: the same key makes a new task now.
        again = await client.submit("nobody-runs-this", idempotency_key="nightly-2026-12-01")
        assert again.id != old.id
    # And the metrics count what went.
    port = kept_an_hour.metrics.metrics.port
    assert port is not None
    scraped = await asyncio.to_thread(scrape_metrics, port)
    assert "lowtide_task_purged_total 2.0" in scraped, scraped


async def test_a_retention_of_zero_keeps_every_finished_task(database_url: str) -> None:
    config = make_config(retention=timedelta(0))
    keeper = await start_scheduler(config, database_url=database_url)
    try:
        async with Client(keeper.target) as client:
            task = await client.cancel((await client.submit("nobody-runs-this")).id)
            _finished_ago(database_url, [task.id], timedelta(days=3650))
            for _ in range(2):
                await keeper.parts.maintenance.tick()
            assert (await client.get(task.id)).id == task.id
    finally:
        await keeper.stop(grace=1.0)


async def _queue_rows(database_url: str) -> dict[str, bool]:
    """Each queue lowtide.queues knows, and whether it is marked idle."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT name, idle_since IS NOT NULL FROM lowtide.queues")
        return {str(name): bool(idle) for name, idle in await cur.fetchall()}


async def test_a_queue_idle_for_the_retention_is_forgotten_with_its_gauges(
    kept_an_hour: Scheduler, database_url: str
) -> None:
    """Every queue name ever submitted to was kept (and reported, zeros and all) for ever. Now one
    with nothing due or running for the retention is forgotten, unless it is paused, configured,
    or still has a task waiting (for a later start, say)."""
    async with Client(kept_an_hour.target) as client:
        for queue in ("tenant-gone", "tenant-later", "tenant-paused", "tenant-busy"):
            task = await client.submit("nobody-runs-this", queue=queue)
            if queue in ("tenant-gone", "tenant-paused"):
                await client.cancel(task.id)
        await client.pause_queue("tenant-paused")
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            later = "UPDATE lowtide.tasks SET run_at = now() + interval '1 day' WHERE queue = 'tenant-later'"
            await conn.execute(later)

        def marked(rows: dict[str, bool]) -> bool:
            idle = {"tenant-gone": True, "tenant-later": True, "tenant-paused": True, "tenant-busy": False}
            return all(rows.get(q) == want for q, want in idle.items())

        await eventually(lambda: _marked(database_url, marked), within=30)
        # An hour and more later (as far as the queues know): only the idle one with nothing left goes.
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("UPDATE lowtide.queues SET idle_since = now() - interval '2 hours'")
        await eventually(lambda: _forgotten(database_url, "tenant-gone"), within=30)
        rows = await _queue_rows(database_url)
        assert {"tenant-later", "tenant-paused", "tenant-busy"} <= rows.keys()
        # The busy queue was marked again as it is: not idle.
        assert rows["tenant-busy"] is False
    port = kept_an_hour.metrics.metrics.port
    assert port is not None

    async def gauges_gone() -> bool:
        scraped = await asyncio.to_thread(scrape_metrics, port)
        return 'queue="tenant-gone"' not in scraped and 'queue="tenant-later"' in scraped

    await eventually(gauges_gone, within=30)


async def _marked(database_url: str, check: Callable[[dict[str, bool]], bool]) -> bool:
    return check(await _queue_rows(database_url))


async def _forgotten(database_url: str, queue: str) -> bool:
    return queue not in await _queue_rows(database_url)
