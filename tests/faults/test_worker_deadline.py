"""A worker cut off from its scheduler still stops an attempt that runs past its start-to-close
deadline: the scheduler, which would send the cancel, is gone, and the worker's own guard (the
deadline plus a grace) ends the activity. Attempts that end in time are reported as usual."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from lowtide_client import Client, TaskState, Worker, activity
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def test_a_worker_without_its_scheduler_stops_attempts_past_their_deadline(database_url: str) -> None:
    scheduler = await start_scheduler(make_config(), database_url=database_url)
    started = asyncio.Semaphore(0)
    stopped: list[tuple[datetime, datetime | None]] = []  # when, and the attempt's deadline
    worker = Worker(target=scheduler.target, slots=4)
    running = True

    @worker.activity("stuck")
    async def stuck(payload: bytes) -> bytes:
        started.release()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            stopped.append((datetime.now(UTC), activity.context().deadline))
            raise
        return b""

    @worker.activity("quick")
    async def quick(payload: bytes) -> bytes:
        return payload

    try:
        async with worker:
            async with Client(scheduler.target) as client:
                done = await client.submit("quick", b"in time", start_to_close_timeout=timedelta(seconds=1))
                for _ in range(2):
                    await client.submit("stuck", max_attempts=1, start_to_close_timeout=timedelta(seconds=1))
                assert (await client.wait(done.id, timeout=timedelta(seconds=10))).state == COMPLETED
            for _ in range(2):
                await asyncio.wait_for(started.acquire(), 10)
            await scheduler.stop(grace=0.5)
            running = False

            async def both_stopped() -> bool:
                return len(stopped) == 2

            # The deadline (1 s) and the worker's grace (5 s), on a loaded machine.
            await eventually(both_stopped, within=30)
    finally:
        if running:
            await scheduler.stop(grace=0.5)
    for when, deadline in stopped:
        assert deadline is not None and when > deadline
