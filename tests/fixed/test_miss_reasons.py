"""Miss reasons say what really happened: a start missed while no scheduler ran says so (with the
outage), and one missed with idle slots never blames held capacity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import start_scheduler
from tests.faults.support import query
from tests.fixed.conftest import fixed_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def ten_worker(target: str, *types: str) -> Worker:
    worker = Worker(target=target, pool="ten", slots=30)
    for name in types:
        worker.register(name, lambda payload: payload)
    return worker


async def db_now(database_url: str) -> datetime:
    [(now,)] = await query(database_url, "SELECT now()")
    assert isinstance(now, datetime)
    return now


async def test_a_start_missed_while_the_scheduler_was_down_says_so(database_url: str) -> None:
    first = await start_scheduler(fixed_config(), database_url=database_url)
    try:
        async with Client(first.target) as client:
            task = await client.submit(
                "work",
                pool="ten",
                start_in=timedelta(seconds=3),
                start_tolerance=timedelta(milliseconds=200),
                estimated_duration=timedelta(seconds=1),
            )
    finally:
        await first.stop(grace=0.5)
    start = task.start_at.ToDatetime(tzinfo=UTC)
    stopped_at = await db_now(database_url)
    assert stopped_at < start, "the first scheduler took too long to stop for this test"

    async def start_has_passed() -> bool:
        return await db_now(database_url) > start + timedelta(milliseconds=200)

    await eventually(start_has_passed, within=30, interval=0.1)
    second = await start_scheduler(fixed_config(), database_url=database_url)
    try:
        # 30 idle slots of the pool once it is back: still not the reason.
        async with Client(second.target) as client, ten_worker(second.target, "work"):
            done = await client.wait(task.id, timeout=timedelta(seconds=20))
    finally:
        await second.stop(grace=0.5)
    assert (done.state, done.missed) == (COMPLETED, True)
    prefix = "the scheduler was not running at the start time (down from "
    assert done.miss_reason.startswith(prefix), done.miss_reason
    down_from, _, down_to = done.miss_reason.removeprefix(prefix).rstrip(")").partition(" to ")
    # The outage it names (to the second) spans the start: from the first scheduler's stop to the
    # second's start.
    began, ended = datetime.fromisoformat(down_from), datetime.fromisoformat(down_to)
    assert began <= start < ended + timedelta(seconds=1)
    assert began <= stopped_at < began + timedelta(seconds=2)


async def test_a_start_missed_with_idle_slots_names_what_was_missing(database_url: str) -> None:
    scheduler = await start_scheduler(fixed_config(), database_url=database_url)
    try:
        # Thirty idle slots in the pool, but none of its workers runs the task's type.
        async with Client(scheduler.target) as client, ten_worker(scheduler.target, "work"):
            task = await client.submit(
                "report",
                pool="ten",
                start_in=timedelta(milliseconds=800),
                start_tolerance=timedelta(milliseconds=100),
                on_miss="skip",
                estimated_duration=timedelta(seconds=1),
            )
            done = await client.wait(task.id, timeout=timedelta(seconds=15))
    finally:
        await scheduler.stop(grace=0.5)
    assert done.missed
    assert done.miss_reason == "no worker of pool ten runs activity type report on queue default"
