"""Recurring schedules through the real API and PostgreSQL: fire times become admitted fixed-start
tasks, once each across replicas; conflicts are recorded; pause, resume and delete; bad input.

The running scheduler's leader materializes schedules on its own (every maintenance tick, with
the real clock). Tests that need a later `now` call a ScheduleMaterializer of their own on the
same database, which is what a second replica's leader would do.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta

import grpc
import psycopg
import pytest

from lowtide_client import Client, Task, TaskState
from lowtide_proto.lowtide.v1.schedule_pb2 import Schedule
from scheduler_service.server import Scheduler
from scheduler_service.tasks.schedules import ScheduleMaterializer
from tests.helpers import eventually

MINUTE = timedelta(minutes=1)
PENDING = TaskState.Value("TASK_STATE_PENDING")
CANCELLED = TaskState.Value("TASK_STATE_CANCELLED")


def start_of(task: Task) -> datetime:
    return task.start_at.ToDatetime(tzinfo=UTC)


async def tasks_of(client: Client, activity_type: str) -> list[Task]:
    page = await client.list(activity_type=activity_type, page_size=1000)
    return sorted(page.tasks, key=start_of)


def materializer(scheduler: Scheduler) -> ScheduleMaterializer:
    return ScheduleMaterializer(scheduler.store, scheduler.config)


async def test_a_schedule_every_minute_creates_admitted_fixed_start_tasks(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        before = datetime.now(UTC)
        schedule = await client.create_schedule(
            "minutely", "* * * * *", "report", "hello", pool="ten", estimated_duration=10 * timedelta(seconds=1)
        )
        assert (schedule.paused, schedule.conflicts, schedule.last_conflict) == (False, 0, "")
        first = schedule.next_fire_at.ToDatetime(tzinfo=UTC)
        assert first.second == 0 and before < first <= before + MINUTE

        # The pool's max_hold (5 min) plus a minute ahead: six fire times, created at once.
        tasks = await eventually(lambda: _at_least(client, "report", 6))
        starts = [start_of(t) for t in tasks]
        assert starts[0] == first
        assert all(later - earlier == MINUTE for earlier, later in itertools.pairwise(starts))
        for task in tasks:
            assert task.state == PENDING and task.pool == "ten" and task.queue == "default"
            assert task.estimated_duration.ToTimedelta() == timedelta(seconds=10)
            assert task.start_tolerance.ToTimedelta() == timedelta(seconds=1)
            assert task.idempotency_key == f"schedule:{schedule.id}:0:{start_of(task).isoformat()}"
        full = await client.get(tasks[0].id)
        assert full.payload == b"hello"

        [listed] = await client.list_schedules()
        assert listed.last_task_id in {t.id for t in tasks}
        assert listed.next_fire_at.ToDatetime(tzinfo=UTC) > listed.last_fire_at.ToDatetime(tzinfo=UTC) >= starts[5]

        # Later ticks go on where the last stopped.
        created = await materializer(scheduled).tick(datetime.now(UTC) + 3 * MINUTE)
        later = await tasks_of(client, "report")
        assert created >= 3 and len(later) >= len(tasks) + created
        assert [start_of(t) for t in later] == [first + i * MINUTE for i in range(len(later))]


async def _at_least(client: Client, activity_type: str, count: int) -> list[Task]:
    """The tasks of the type once there are `count` of them; until then an empty list."""
    tasks = await tasks_of(client, activity_type)
    return tasks if len(tasks) >= count else []


async def test_replicas_ticking_at_once_create_each_fire_time_once(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        await client.create_schedule("busy", "*/2 * * * *", "sync", pool="ten", estimated_duration=MINUTE)
        replicas = [materializer(scheduled) for _ in range(4)]
        now = datetime.now(UTC)
        # The running leader first creates what its real clock's lookahead covers. Until it is
        # done, replicas ticking at a later `now` would see its next fire time as passed, which
        # no two replicas sharing one clock ever do.
        lookahead = replicas[0].lookahead("ten")

        async def led() -> bool:
            [schedule] = await client.list_schedules()
            return schedule.next_fire_at.ToDatetime(tzinfo=UTC) > now + lookahead

        await eventually(led)
        for offset in (0, 6, 12):
            await asyncio.gather(*(r.tick(now + offset * MINUTE) for r in replicas))
        tasks = await tasks_of(client, "sync")
    per_start = Counter(start_of(t) for t in tasks)
    assert set(per_start.values()) == {1}, per_start
    # Every two minutes over 18 minutes, none missing.
    starts = sorted(per_start)
    assert len(starts) >= 9
    assert all(later - earlier == 2 * MINUTE for earlier, later in itertools.pairwise(starts))
    assert all(t.state == PENDING for t in tasks)


async def test_a_conflict_with_a_reservation_is_recorded_on_the_schedule(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        # Pool "one" takes one reservation at a time; this one covers minutes 3 to 13 from now.
        blocker = await client.submit("job", pool="one", start_in=3 * MINUTE, estimated_duration=10 * MINUTE)
        duration = timedelta(seconds=20)
        await client.create_schedule("clash", "* * * * *", "report", pool="one", estimated_duration=duration)

        async def refused() -> list[Schedule]:
            return [s for s in await client.list_schedules() if s.conflicts]

        [schedule] = await eventually(refused)
        assert "refused: reservation conflict in pool one: at most 1 reservation(s) may overlap" in (
            schedule.last_conflict
        )
        assert f"conflicting tasks {blocker.id})" in schedule.last_conflict
        assert schedule.HasField("last_conflict_at")
        # The fire times before the reservation got their tasks; the refused ones got none.
        admitted = await tasks_of(client, "report")
        assert admitted
        second = timedelta(seconds=1)
        for task in admitted:
            assert start_of(task) + duration + second <= start_of(blocker) - second


async def test_pause_cancels_what_is_ahead_and_resume_starts_again(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        await client.create_schedule("nightly", "* * * * *", "backup", pool="ten")
        created = await eventually(lambda: _at_least(client, "backup", 6))
        # The type's configured estimated duration was used.
        assert created[0].estimated_duration.ToTimedelta() == 2 * MINUTE

        paused = await client.pause_schedule("nightly")
        assert paused.schedule.paused
        # Every task whose start was still ahead (the first may just have passed).
        assert len(paused.cancelled_task_ids) >= 5
        assert set(paused.cancelled_task_ids) <= {t.id for t in await tasks_of(client, "backup")}
        assert await materializer(scheduled).tick(datetime.now(UTC) + 30 * MINUTE) == 0
        await asyncio.sleep(0.5)  # several ticks of the running leader
        after_pause = await tasks_of(client, "backup")
        assert all(t.state == CANCELLED or start_of(t) <= datetime.now(UTC) for t in after_pause)
        count = len(after_pause)
        assert count <= len(created) + 1

        resumed_at = datetime.now(UTC)
        resumed = await client.resume_schedule("nightly")
        assert not resumed.paused
        assert resumed.next_fire_at.ToDatetime(tzinfo=UTC) > datetime.now(UTC)
        again = await eventually(lambda: _at_least(client, "backup", count + 6))
    pending = [t for t in again if t.state == PENDING and start_of(t) > resumed_at]
    assert len(pending) >= 6
    # Fire times cancelled by the pause come back under the new generation, once each.
    assert all(":1:" in t.idempotency_key for t in pending)
    assert len({start_of(t) for t in pending}) == len(pending)


async def test_delete_removes_the_schedule_and_its_tasks_ahead(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        await client.create_schedule("gone", "* * * * *", "report", pool="ten", estimated_duration=MINUTE)
        await client.create_schedule("kept", "0 3 * * *", "audit", time_zone="Europe/London", estimated_duration=MINUTE)
        await eventually(lambda: _at_least(client, "report", 6))
        deleted = await client.delete_schedule("gone")
        assert deleted.schedule.name == "gone"
        assert len(deleted.cancelled_task_ids) >= 5
        left = await tasks_of(client, "report")
        assert set(deleted.cancelled_task_ids) <= {t.id for t in left}
        assert all(t.state == CANCELLED or start_of(t) <= datetime.now(UTC) for t in left)
        assert [s.name for s in await client.list_schedules()] == ["kept"]
        await materializer(scheduled).tick(datetime.now(UTC) + 20 * MINUTE)
        assert len(await tasks_of(client, "report")) == len(left)
        for call in (client.delete_schedule, client.pause_schedule, client.resume_schedule):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call("gone")
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert caught.value.details() == "schedule 'gone' not found"


async def test_fire_times_that_passed_while_no_scheduler_led_are_skipped(scheduled: Scheduler) -> None:
    async with Client(scheduled.target) as client:
        schedule = await client.create_schedule("late", "* * * * *", "report", pool="ten", estimated_duration=MINUTE)
        # As if the scheduler had been down for an hour: those fire times are gone, not made up.
        later = datetime.now(UTC) + timedelta(hours=1)
        await materializer(scheduled).tick(later)
        starts = [start_of(t) for t in await tasks_of(client, "report")]
    # The running leader also materialises in real time (a lookahead of about 6 minutes, which
    # may roll over a minute boundary while the test runs): only later fire times count as a gap.
    # A fire time within its start tolerance (1 s by default) before `later` is still startable
    # at `later` and is made: `later` just past a minute boundary is not a gap.
    startable_from = later - timedelta(seconds=1)
    gap = [s for s in starts if schedule.next_fire_at.ToDatetime(tzinfo=UTC) + 10 * MINUTE < s < startable_from]
    assert gap == []
    assert any(s > later for s in starts)


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        ({"cron": "61 * * * *"}, "INVALID_ARGUMENT", "cron: minute: 61 is out of range 0-59"),
        ({"cron": "* * *"}, "INVALID_ARGUMENT", "cron: cron: expected 5 fields"),
        ({"time_zone": "Mars/Olympus"}, "INVALID_ARGUMENT", "time_zone: unknown time zone 'Mars/Olympus'"),
        ({"estimated_duration": None}, "INVALID_ARGUMENT", "estimated_duration: is required for a schedule"),
        ({"name": ""}, "INVALID_ARGUMENT", "name: must not be empty"),
        ({"name": "taken"}, "ALREADY_EXISTS", "schedule 'taken' exists already"),
    ],
)
async def test_bad_schedules_are_refused_naming_the_field(
    scheduled: Scheduler, changes: dict[str, object], code: str, message: str
) -> None:
    async with Client(scheduled.target) as client:
        await client.create_schedule("taken", "* * * * *", "report", estimated_duration=MINUTE)
        args: dict[str, object] = {
            "name": "new",
            "cron": "*/5 * * * *",
            "activity_type": "report",
            "time_zone": "UTC",
            "estimated_duration": MINUTE,
        }
        args.update(changes)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.create_schedule(**args)  # type: ignore[arg-type]
        assert caught.value.code().name == code
        assert message in (caught.value.details() or "")
        assert [s.name for s in await client.list_schedules()] == ["taken"]


async def test_a_schedule_whose_zone_vanished_is_paused_with_the_reason(
    scheduled: Scheduler, database_url: str
) -> None:
    async with Client(scheduled.target) as client:
        await client.create_schedule("fine", "* * * * *", "report", pool="ten", estimated_duration=MINUTE)
        await client.create_schedule("doomed", "* * * * *", "audit", pool="ten", estimated_duration=MINUTE)
        # As after a tzdata update that dropped the zone it was created with.
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("UPDATE lowtide.schedules SET time_zone = 'Gone/Away' WHERE name = 'doomed'")
        await materializer(scheduled).tick()
        schedules = {s.name: s for s in await client.list_schedules()}
        assert schedules["doomed"].paused
        assert schedules["doomed"].last_conflict.startswith("paused: cannot compute its fire times: ")
        assert "Gone/Away" in schedules["doomed"].last_conflict
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.resume_schedule("doomed")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "schedule 'doomed' cannot be resumed" in (caught.value.details() or "")
        # The other schedule goes on.
        assert not schedules["fine"].paused
        assert await eventually(lambda: _at_least(client, "report", 6))
