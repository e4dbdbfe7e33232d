"""Idle is a value: with nothing pending or running, /metrics still shows every known queue with
zeros and the cost hold as 1 while it is active, so dashboards never show "No data"."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from datetime import timedelta

from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler, start_scheduler
from tests.cost.conftest import Pair, cost_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def scrape(scheduler: Scheduler) -> str:
    port = scheduler.metrics.metrics.port
    assert port

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    return await asyncio.to_thread(get)


def series(text: str, name: str) -> dict[str, float]:
    """The value of each series of a metric, keyed by its labels as printed."""
    found = re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)
    return {labels: float(value) for labels, value in found}


QUEUE_FIGURES = (
    "lowtide_queue_depth",
    "lowtide_queue_held_depth",
    "lowtide_queue_oldest_pending_age_seconds",
    "lowtide_queue_oldest_held_age_seconds",
    "lowtide_queue_running",
)


async def idle_page(scheduler: Scheduler, *queues: str) -> str:
    """The first /metrics page on which every queue named shows each of its figures, as zero, and
    the workers that ran their tasks are gone. The figures are refreshed every few seconds, so a
    page read just after the work ended may still show it pending (depth 1, running 0) or running;
    a worker's disconnection reaches the gauges a moment after it closes its stream. A figure
    missing from the page ("No data" on a dashboard) never passes."""

    async def probe() -> str:
        text = await scrape(scheduler)
        if series(text, "lowtide_worker_connected").get('pool="default"'):
            return ""
        for name in QUEUE_FIGURES:
            values = series(text, name)
            if any(values.get(f'queue="{q}"') != 0 for q in queues):
                return ""
        return text

    return await eventually(probe, within=30)


async def test_an_idle_scheduler_with_an_active_hold_exports_zeros_and_the_hold(pair: Pair) -> None:
    await pair.set_signal(520)
    async with Client(pair.scheduler.target) as client:
        # A queue nobody configured, used once: empty now, still known.
        worker = Worker(target=pair.scheduler.target, queues=["nightly"], slots=1)
        worker.register("echo", lambda payload: payload)
        async with worker:
            task = await client.submit("echo", queue="nightly")
            assert (await client.wait(task.id, timeout=timedelta(seconds=10))).state == COMPLETED
        status = await client.status()
    assert status.hold.active

    text = await idle_page(pair.scheduler, "default", "batch", "nightly")
    for name in QUEUE_FIGURES:
        values = series(text, name)
        for queue in ("default", "batch", "nightly"):
            assert values.get(f'queue="{queue}"') == 0, (name, queue, values)
    hold = series(text, "lowtide_cost_hold")
    # The hold is active and holds train everywhere (and index on batch): 1 on every queue.
    for queue in ("default", "batch", "nightly"):
        assert hold.get(f'queue="{queue}",signal="grid"') == 1, hold
    assert series(text, "lowtide_worker_connected").get('pool="default"') == 0
    assert series(text, "lowtide_pool_desired_workers").get('pool="default"') == 0


async def test_a_restarted_scheduler_knows_the_idle_queues_of_its_database(pair: Pair, database_url: str) -> None:
    async with Client(pair.scheduler.target) as client:
        worker = Worker(target=pair.scheduler.target, queues=["nightly"], slots=1)
        worker.register("echo", lambda payload: payload)
        async with worker:
            task = await client.submit("echo", queue="nightly")
            assert (await client.wait(task.id, timeout=timedelta(seconds=10))).state == COMPLETED
    # A second replica, which never saw that task: the database tells it the queue exists.
    other = await start_scheduler(cost_config(pair.signal.target), database_url=database_url)
    try:
        text = await idle_page(other, "nightly")
    finally:
        await other.stop(grace=0.5)
    assert series(text, "lowtide_queue_depth").get('queue="nightly"') == 0
    assert series(text, "lowtide_cost_hold").get('queue="nightly",signal="grid"') == 1
