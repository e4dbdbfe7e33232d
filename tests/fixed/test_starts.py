"""Fixed starts at run time, with real workers: held slots, on-time starts, misses, retries."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg

from lowtide.config import CostConfig
from lowtide_client import Client, Task, TaskState, Worker, task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.fixed.conftest import fixed_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
SKIPPED = TaskState.Value("TASK_STATE_SKIPPED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


def pool_worker(scheduler: Scheduler, pool: str, *, slots: int = 1, calls: list[str] | None = None) -> Worker:
    worker = Worker(target=scheduler.target, pool=pool, slots=slots)

    async def work(payload: bytes) -> bytes:
        if calls is not None:
            calls.append(payload.decode())
        text = payload.decode()
        if text.startswith("fail-once:") and text not in (calls or [])[:-1]:
            raise RuntimeError("first attempt fails")
        await asyncio.sleep(float(text.rsplit(":", 1)[-1]) if ":" in text else 0)
        return payload

    worker.register("work", work)
    return worker


def started_offset(task: Task) -> float:
    started = task.started_at.ToDatetime(tzinfo=UTC)
    start = task.start_at.ToDatetime(tzinfo=UTC)
    return (started - start).total_seconds()


async def test_a_saturated_pool_starts_a_fixed_task_on_time_on_a_held_slot(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client, pool_worker(fixed_scheduler, "busy"):
        # Teach the pool its run time (~0.8 s), then saturate it with a long backlog.
        for _ in range(3):
            await client.wait((await client.submit("work", "warm:0.8")).id, timeout=timedelta(seconds=10))
        await client.submit_many([task_spec("work", f"regular-{i}:0.8") for i in range(30)])
        fixed = await client.submit(
            "work",
            "fixed:0.1",
            pool="busy",
            start_in=timedelta(seconds=3),
            start_tolerance=timedelta(milliseconds=300),
            estimated_duration=timedelta(seconds=1),
        )
        done = await client.wait(fixed.id, timeout=timedelta(seconds=15))
        backlog = await client.list(state=PENDING)
    assert done.state == COMPLETED and done.start_hit
    assert abs(started_offset(done)) <= 0.3
    # The regular backlog was still waiting: the slot was kept for the fixed start, not freed by luck.
    assert len(backlog.tasks) > 10


async def test_the_hold_lead_follows_a_pool_that_slows_down(fixed_scheduler: Scheduler) -> None:
    fixed = fixed_scheduler.dispatcher.fixed
    assert fixed is not None
    async with Client(fixed_scheduler.target) as client, pool_worker(fixed_scheduler, "busy", slots=2):
        for task in await client.submit_many([task_spec("work", "quick:0.05") for _ in range(6)]):
            await client.wait(task.id, timeout=timedelta(seconds=10))
        quick = fixed.p90("busy")
        for task in await client.submit_many([task_spec("work", "slow:0.6") for _ in range(6)]):
            await client.wait(task.id, timeout=timedelta(seconds=10))
        slow = fixed.p90("busy")
    assert quick is not None and slow is not None
    assert quick < 0.3 < slow


async def test_the_held_slot_shows_in_status_and_takes_no_regular_work(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client, pool_worker(fixed_scheduler, "busy", slots=1):
        fixed = await client.submit(
            "work", "fixed", pool="busy", start_in=timedelta(seconds=2), estimated_duration=timedelta(seconds=1)
        )
        # Tolerance 1 s and no run times yet: the slot is held from one second before the start.
        status = await eventually(lambda: _held(client))
        regular = await client.submit("work", "regular")
        await asyncio.sleep(0.3)
        assert (await client.get(regular.id)).state == PENDING
        done = await client.wait(fixed.id, timeout=timedelta(seconds=10))
        assert (await client.wait(regular.id, timeout=timedelta(seconds=10))).state == COMPLETED
    assert status is not None
    [busy] = [p for p in status.pools if p.name == "busy"]
    assert (busy.held_slots, busy.reservations_ahead, busy.desired_workers) == (1, 1, 1)
    assert done.start_hit


async def _held(client: Client) -> scheduler_pb2.GetStatusResponse | None:
    status = await client.status()
    return status if any(p.name == "busy" and p.held_slots == 1 for p in status.pools) else None


async def test_tolerance_zero_starts_on_the_first_step_at_or_after_the_time(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client, pool_worker(fixed_scheduler, "one"):
        task = await client.submit(
            "work",
            "exact",
            pool="one",
            start_in=timedelta(seconds=1.5),
            start_tolerance=timedelta(0),
            estimated_duration=timedelta(seconds=1),
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    # Never early, and on the step the start timer triggers (well before any poll would).
    assert done.state == COMPLETED
    assert 0 <= started_offset(done) < 0.4


async def test_skip_ends_a_missed_start_and_says_why(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client:
        task = await client.submit(
            "work",
            pool="two",
            start_in=timedelta(milliseconds=300),
            start_tolerance=timedelta(milliseconds=200),
            on_miss="skip",
            estimated_duration=timedelta(seconds=1),
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.missed, done.miss_reason, done.attempt) == (
        SKIPPED,
        True,
        "no worker of pool two connected",
        0,
    )


async def test_run_late_runs_a_missed_start_as_soon_as_it_can(fixed_scheduler: Scheduler) -> None:
    async with Client(fixed_scheduler.target) as client:
        task = await client.submit(
            "work",
            pool="two",
            start_in=timedelta(milliseconds=300),
            start_tolerance=timedelta(milliseconds=200),
            estimated_duration=timedelta(seconds=1),
        )
        await eventually(lambda: _missed(client, task.id))
        async with pool_worker(fixed_scheduler, "two"):
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
    assert (done.state, done.missed, done.start_hit, done.miss_reason) == (
        COMPLETED,
        True,
        False,
        "no worker of pool two connected",
    )


async def _missed(client: Client, task_id: int) -> bool:
    return (await client.get(task_id)).missed


async def test_a_start_past_its_tolerance_is_not_run_as_if_on_time_while_no_leader_marks_it(database_url: str) -> None:
    # Another replica holds the maintenance lease and is silent (frozen, or between its ticks):
    # nobody marks the miss yet. A free worker of the pool must not take the start as if on time,
    # or a skip runs late with nothing saying it was missed (found by the soak: start_hit false,
    # missed false).
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO lowtide.leader (name, holder, expires_at) "
            "VALUES ('scheduler.maintenance', 'a-frozen-replica', now() + interval '1 hour')"
        )
    scheduler = await start_scheduler(fixed_config(), database_url=database_url)
    calls: list[str] = []
    try:
        async with Client(scheduler.target) as client:
            late = await client.submit(
                "work",
                "late",
                pool="two",
                start_in=timedelta(milliseconds=300),
                start_tolerance=timedelta(milliseconds=200),
                on_miss="skip",
                estimated_duration=timedelta(seconds=1),
            )
            past = late.start_at.ToDatetime(tzinfo=UTC) + timedelta(milliseconds=300) - datetime.now(UTC)
            await asyncio.sleep(max(0.0, past.total_seconds()))  # until start + tolerance has passed
            async with pool_worker(scheduler, "two", calls=calls):
                # Due fixed starts are claimed ahead of regular work: once this one ran, the late
                # start would have been taken had it been claimable.
                marker = await client.submit("work", "marker")
                await client.wait(marker.id, timeout=timedelta(seconds=15))
                # And the replica's polls, which ask every group for due fixed starts, went by.
                polls = scheduler.dispatcher.polls

                async def polled() -> bool:
                    return scheduler.dispatcher.polls >= polls + 3

                await eventually(polled, within=30)
                assert (await client.get(late.id)).state == PENDING and calls == ["marker"]
                async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                    await conn.execute("DELETE FROM lowtide.leader WHERE holder = 'a-frozen-replica'")
                done = await client.wait(late.id, timeout=timedelta(seconds=20))
    finally:
        await scheduler.stop(grace=0.5)
    assert (done.state, done.missed, done.attempt) == (SKIPPED, True, 0)
    assert done.miss_reason
    assert calls == ["marker"]


async def test_a_retried_attempt_goes_ahead_of_regular_work(fixed_scheduler: Scheduler) -> None:
    calls: list[str] = []
    async with Client(fixed_scheduler.target) as client, pool_worker(fixed_scheduler, "busy", calls=calls):
        await client.submit_many([task_spec("work", f"regular-{i}:0.2") for i in range(20)])
        task = await client.submit(
            "work",
            "fail-once:0",
            pool="busy",
            start_in=timedelta(seconds=1),
            estimated_duration=timedelta(seconds=1),
            initial_backoff=timedelta(milliseconds=100),
            max_attempts=3,
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=15))
    assert (done.state, done.attempt) == (COMPLETED, 2)
    first, second = [i for i, c in enumerate(calls) if c.startswith("fail-once")]
    # Between the failed first attempt and the retry, at most the one regular task that was
    # already running when the backoff ended took the slot.
    assert second - first <= 2
    assert len(calls) < 20


async def test_cost_holds_never_apply_to_a_fixed_start(fixed_scheduler: Scheduler) -> None:
    # This scheduler has no signal value: the signal counts as high, so a held type would wait.
    config = replace(fixed_config(), cost=CostConfig(deferrable_activities=("work",)))
    scheduler = await start_scheduler(config, database_url=fixed_scheduler.db.url)
    try:
        async with Client(scheduler.target) as client, pool_worker(scheduler, "one"):
            held = await client.submit("work", "regular")
            task = await client.submit(
                "work", pool="one", start_in=timedelta(seconds=1), estimated_duration=timedelta(seconds=1)
            )
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
            assert (await client.get(held.id)).state == PENDING
    finally:
        await scheduler.stop(grace=0.5)
    assert done.state == COMPLETED and done.start_hit
