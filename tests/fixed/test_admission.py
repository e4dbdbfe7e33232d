"""Admission of fixed starts through the real API: windows, capacity per pool, conflicts, races."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from lowtide_client import Client, reservation_conflict, task_spec
from scheduler_service.server import Scheduler, start_scheduler
from tests.fixed.conftest import fixed_config

MINUTE = timedelta(minutes=1)


def soon(minutes: float) -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=minutes)


async def admitted(client: Client, pool: str, start: datetime, minutes: float = 1) -> bool:
    try:
        await client.submit("job", pool=pool, start_at=start, estimated_duration=timedelta(minutes=minutes))
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.FAILED_PRECONDITION and reservation_conflict(error):
            return False
        raise
    return True


@pytest.mark.parametrize(("pool", "capacity"), [("one", 1), ("two", 1), ("three", 1), ("ten", 5)])
async def test_half_the_pool_is_reservable_and_never_less_than_one(
    fixed_scheduler: Scheduler, pool: str, capacity: int
) -> None:
    start = soon(30)
    async with Client(fixed_scheduler.target) as client:
        results = [await admitted(client, pool, start) for _ in range(capacity + 2)]
    assert results == [True] * capacity + [False, False]


async def test_a_conflict_names_the_pool_capacity_and_windows(fixed_scheduler: Scheduler) -> None:
    start = soon(30)
    async with Client(fixed_scheduler.target) as client:
        first = await client.submit(
            "job", pool="two", start_at=start, estimated_duration=10 * MINUTE, start_tolerance=timedelta(seconds=5)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.submit("job", pool="two", start_at=start + 5 * MINUTE, estimated_duration=MINUTE)
        # Back to back with the first window's end: no overlap, admitted.
        later = await client.submit(
            "job", pool="two", start_at=start + 10 * MINUTE + timedelta(seconds=6), estimated_duration=MINUTE
        )
    error = caught.value
    details = reservation_conflict(error)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details is not None
    assert (details.pool, details.capacity, list(details.conflicting_task_ids)) == ("two", 1, [first.id])
    window_start = start + 5 * MINUTE - timedelta(seconds=1)
    assert details.window_start.ToDatetime(tzinfo=UTC) == window_start
    assert details.conflict_start.ToDatetime(tzinfo=UTC) == window_start
    # The stretch where both would run: the whole new window, inside the first one.
    assert details.conflict_end.ToDatetime(tzinfo=UTC) == start + 6 * MINUTE + timedelta(seconds=1)
    assert "reservation conflict in pool two: at most 1 reservation(s)" in (error.details() or "")
    assert later.start_at.ToDatetime(tzinfo=UTC) == start + 10 * MINUTE + timedelta(seconds=6)


async def test_a_finished_or_cancelled_task_frees_its_window(fixed_scheduler: Scheduler) -> None:
    start = soon(30)
    async with Client(fixed_scheduler.target) as client:
        first = await client.submit("job", pool="one", start_at=start, estimated_duration=MINUTE)
        assert not await admitted(client, "one", start)
        await client.cancel(first.id)
        assert await admitted(client, "one", start)


async def test_racing_submissions_never_over_admit_even_across_replicas(
    fixed_scheduler: Scheduler, database_url: str
) -> None:
    other = await start_scheduler(fixed_config(), database_url=database_url)
    start = soon(30)
    try:
        async with Client(fixed_scheduler.target) as one, Client(other.target) as two:
            results = await asyncio.gather(*(admitted(one if i % 2 else two, "ten", start) for i in range(24)))
    finally:
        await other.stop(grace=0.5)
    assert sum(results) == 5


async def test_a_batch_with_a_conflict_stores_nothing(fixed_scheduler: Scheduler) -> None:
    start = soon(30)
    async with Client(fixed_scheduler.target) as client:
        specs = [task_spec("job", pool="one", start_at=start, estimated_duration=MINUTE) for _ in range(2)]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.submit_many([task_spec("regular"), *specs])
        listed = await client.list()
    assert "tasks[2]: reservation conflict in pool one" in (caught.value.details() or "")
    assert list(listed.tasks) == []


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"start_in": MINUTE}, "estimated_duration"),
        ({"start_at": soon(-10), "estimated_duration": MINUTE}, "start_at"),
        ({"start_at": soon(5), "start_in": MINUTE, "estimated_duration": MINUTE}, "start_at"),
        ({"start_tolerance": MINUTE}, "start_tolerance"),
        ({"on_miss": "skip"}, "on_miss"),
        ({"start_in": 400 * 24 * 60 * MINUTE, "estimated_duration": MINUTE}, "start_in"),
    ],
)
async def test_bad_fixed_start_fields_are_named(
    fixed_scheduler: Scheduler, options: dict[str, object], field: str
) -> None:
    async with Client(fixed_scheduler.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.submit("job", **options)  # type: ignore[call-overload]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(field)
