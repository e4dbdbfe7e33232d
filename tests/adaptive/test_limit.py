"""The adaptive concurrency limit against a real scheduler and database: kept in the database and
shared by replicas, in the claim's skip list like a static limit, named by explain."""

from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import replace
from datetime import timedelta

import psycopg

from lowtide.config import AdaptiveConcurrencyConfig, Config, TypeConfig
from lowtide_client import Client, TaskState, Worker, task_spec
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually

RUNNING = TaskState.Value("TASK_STATE_RUNNING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def adaptive_config(**adaptive: object) -> Config:
    settings = replace(AdaptiveConcurrencyConfig(), **adaptive)  # type: ignore[arg-type]
    return replace(
        make_config(adaptive_window=timedelta(milliseconds=200)),
        types={"api": TypeConfig(adaptive_concurrency=settings)},
    )


def metrics_page(port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def stored_limit(database_url: str) -> float | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT limit_value FROM lowtide.adaptive_limits WHERE activity_type = 'api'").fetchone()
    return None if row is None else float(row[0])


async def test_a_type_at_its_adaptive_limit_waits_and_explain_says_so(database_url: str) -> None:
    scheduler = await start_scheduler(adaptive_config(min=1, max=50, initial=2), database_url=database_url)
    gate = asyncio.Event()
    worker = Worker(target=scheduler.target, slots=10)

    @worker.activity("api")
    async def api(payload: bytes) -> bytes:
        await gate.wait()
        return b""

    try:
        async with Client(scheduler.target) as client, worker:
            ids = [s.id for s in await client.submit_many([task_spec("api") for _ in range(6)])]

            async def running() -> list[int]:
                tasks = [await client.get(i) for i in ids]
                return [t.id for t in tasks if t.state == RUNNING]

            async def two_running() -> list[int]:
                # The tasks are read one by one: a claim committing between two reads shows one.
                now = await running()
                return now if len(now) >= 2 else []

            assert len(await eventually(two_running)) == 2
            started = await running()
            waiting = next(i for i in ids if i not in started)
            answer = await client.explain(waiting)
            assert "adaptive_limit" in answer.reasons
            assert "concurrency_limit" not in answer.reasons
            assert "at its adaptive concurrency limit (2/2" in answer.explanation
            # The worker's other eight slots stay free: the limit, not capacity, holds the rest back.
            assert len(await running()) == 2
            # Status shows the limit, its bounds and what runs against it; so do the metrics.
            (limit,) = (await client.status()).adaptive_limits
            assert (limit.activity_type, limit.limit, limit.min, limit.max, limit.running) == ("api", 2, 1, 50, 2)
            page = await asyncio.to_thread(metrics_page, scheduler.metrics.metrics.port)
            assert 'lowtide_adaptive_limit{activity_type="api"} 2.0' in page
            gate.set()
            for task_id in ids:
                assert (await client.wait(task_id, timeout=timedelta(seconds=20))).state == COMPLETED
    finally:
        gate.set()
        await scheduler.stop(grace=1.0)


async def test_the_limit_falls_on_failures_is_stored_and_shared_and_climbs_when_healthy(database_url: str) -> None:
    """A downstream that fails past 4 concurrent calls: the limit falls from 40 to under 12 (every
    replica applies the stored limit); once it is healthy again the limit climbs back to 16 and
    more (how far depends on how the run time grows with concurrency here: the worker shares its
    event loop with the scheduler)."""
    config = adaptive_config(min=1, max=60, initial=40, min_samples=5)
    first = await start_scheduler(config, database_url=database_url)
    second = await start_scheduler(config, database_url=database_url)
    capacity = 4
    in_flight = 0
    worker = Worker(target=first.target, slots=60)

    @worker.activity("api")
    async def api(payload: bytes) -> bytes:
        nonlocal in_flight
        in_flight += 1
        try:
            await asyncio.sleep(0.1)
            if in_flight > capacity:
                raise RuntimeError("downstream overloaded")
            return b""
        finally:
            in_flight -= 1

    policy = {"max_attempts": 100, "initial_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1)}
    try:
        async with Client(first.target) as client, worker:
            await client.submit_many([task_spec("api", **policy) for _ in range(1500)])  # type: ignore[arg-type]

            async def fell() -> float | None:
                limit = stored_limit(database_url)
                return limit if limit is not None and limit < 12 else None

            await eventually(fell, within=60)
            # The other replica applies the limit the leader stored.
            await eventually(lambda: asyncio.sleep(0, second.parts.adaptive.limits["api"] < 12), within=10)
            capacity = 1000
            # Work enough to use a climbing limit (a type limited by its demand keeps its limit).
            await client.submit_many([task_spec("api", **policy) for _ in range(3000)])  # type: ignore[arg-type]

            async def climbed() -> float | None:
                limit = stored_limit(database_url)
                return limit if limit is not None and limit >= 16 else None

            await eventually(climbed, within=90)
            # What moved it is shown: the last window's latency, baseline and failure share.
            async with Client(second.target) as other:
                (shown,) = (await other.status()).adaptive_limits
            assert shown.limit >= 12 and shown.samples > 0 and shown.latency_seconds > 0.09
            assert 0 <= shown.failure_rate <= 1 and shown.reason
            page = await asyncio.to_thread(metrics_page, first.metrics.metrics.port)
            for name in ("lowtide_adaptive_latency_seconds", "lowtide_adaptive_baseline_seconds"):
                assert f'{name}{{activity_type="api"}}' in page
            assert 'lowtide_adaptive_failure_ratio{activity_type="api"}' in page
    finally:
        await second.stop(grace=1.0)
        await first.stop(grace=1.0)
