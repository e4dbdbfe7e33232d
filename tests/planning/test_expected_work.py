"""Planned release beside the work expected to come, through the real services: the leader reads
the last day's deferrable submissions and leaves a contested cheap window to the work that will
have no other."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lowtide.config import Config, CostConfig, PoolConfig, SignalConfig, SignalDefinition
from lowtide_client import Client, SignalClient
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.domain import Point
from signal_service.server import start_signal_service
from tests.conftest import NO_AUTH, make_config
from tests.helpers import eventually
from tests.planning.test_release import _planned_near, _services
from tests.planning.test_where_and_when import Services as WhereAndWhen
from tests.planning.test_where_and_when import _connected, _worker


async def test_the_leader_leaves_a_cheap_window_to_the_work_expected_from_the_last_day(
    database_url: str, tmp_path: Path
) -> None:
    signal, scheduler = await _services(database_url, tmp_path, "static")
    try:
        now = datetime.now(UTC)
        cheap = now + timedelta(minutes=60)
        async with Client(scheduler.target) as client, SignalClient(signal.target) as signals:
            await signals.set(300)
            # Yesterday, a `train` task was submitted at this time of day plus 55 minutes, with
            # 30 minutes of slack: the same is expected in 55 minutes, and the only cheap start
            # in its window is the one at 60 minutes.
            await _submitted_yesterday(client, scheduler, now + timedelta(minutes=55))
            # A task pending now may start any time in the next two hours: at 60 minutes (50) or
            # at 5 (120). The pool has one slot (no worker is connected).
            task = await client.submit(
                "train", latest_start=now + timedelta(hours=2), estimated_duration=timedelta(minutes=10)
            )
            await signal.signals.set_forecast(
                "grid",
                [
                    Point(now + timedelta(minutes=5), 120.0),
                    Point(now + timedelta(minutes=30), 300.0),
                    Point(cheap, 50.0),
                    Point(cheap + timedelta(minutes=10), 300.0),
                    Point(now + timedelta(hours=3), 300.0),
                ],
                source="test-feed",
            )
            # Moving costs the pending task 70 and the expected one 250: the pending task moves.
            moved = await eventually(lambda: _planned_near(client, task.id, now + timedelta(minutes=5)))
            assert moved
            planned = await client.get(task.id)
            assert planned.planned_intensity == 120
    finally:
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)


async def test_a_task_naming_pools_leaves_a_cheap_hour_to_the_work_that_named_them_yesterday(
    database_url: str, tmp_path: Path
) -> None:
    # Two pools bound to two signals set by hand, a worker of one slot in each.
    signals = {"west": SignalDefinition(threshold=250), "central": SignalDefinition(threshold=250)}
    cost = CostConfig(defer_threshold=250.0, deferrable_activities=("train",))
    signal_config = SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    signal = await start_signal_service(
        Config(signal=signal_config, cost=cost, signals=signals, auth=NO_AUTH), database_url=database_url
    )
    pools = {"eu-west": PoolConfig(signal="west"), "eu-central": PoolConfig(signal="central")}
    config = replace(make_config(signal_target=signal.target), cost=cost, signals=signals, pools=pools)
    scheduler = await start_scheduler(config, database_url=database_url)
    services = WhereAndWhen(signal, scheduler, config)
    ran: dict[str, str] = {}
    try:
        now = datetime.now(UTC)
        async with (
            Client(scheduler.target) as client,
            SignalClient(signal.target) as setter,
            _worker(scheduler, "eu-west", ran),
            _worker(scheduler, "eu-central", ran),
        ):
            await eventually(lambda: _connected(services, "eu-west", "eu-central"))
            for name in signals:
                await setter.set(300, name=name)
            # Yesterday at this time of day plus 55 minutes, a `train` task with 30 minutes of slack
            # (naming no pool, at first): the same is expected in 55 minutes.
            yesterday = await _submitted_yesterday(client, scheduler, now + timedelta(minutes=55))
            # A task naming both pools may start any time in the next two hours: eu-central's 50 at
            # 60 minutes is its cheapest start (150 at 100 minutes there), eu-west's 120 at 5 minutes
            # the best elsewhere. Only eu-central's 50 is cheap in the expected task's window.
            task = await client.submit(
                "train",
                "task",
                pools=["eu-west", "eu-central"],
                latest_start=now + timedelta(hours=2),
                estimated_duration=timedelta(minutes=10),
            )
            west = [(5, 120.0), (15, 300.0), (180, 300.0)]
            central = [(5, 300.0), (60, 50.0), (70, 300.0), (100, 150.0), (110, 300.0), (180, 300.0)]

            async def forecast(name: str, points: list[tuple[int, float]], bump: float = 0.0) -> None:
                at = [Point(now + timedelta(minutes=m), v + bump) for m, v in points]
                await signal.signals.set_forecast(name, at, source="test-feed")

            await forecast("west", west)
            await forecast("central", central)
            # Work that named no pool is planned in the room the placed tasks leave: it does not
            # take a cheap hour from a task naming pools.
            assert await eventually(lambda: _placed(client, task.id, "eu-central", now + timedelta(minutes=60)))
            # Had yesterday's task named the pools, it is expected among them: moving costs this
            # task 70 (eu-west at 5 minutes) and the expected one 250.
            await scheduler.db.execute(
                "UPDATE lowtide.tasks SET pools = '{eu-west,eu-central}' WHERE id = %(id)s", {"id": yesterday}
            )
            await forecast("west", west, bump=0.5)
            assert await eventually(lambda: _placed(client, task.id, "eu-west", now + timedelta(minutes=5)))
            assert ran == {}
    finally:
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)


async def _placed(client: Client, task_id: int, pool: str, when: datetime) -> bool:
    task = await client.get(task_id)
    return task.planned_pool == pool and await _planned_near(client, task_id, when)


async def _submitted_yesterday(client: Client, scheduler: Scheduler, expected_at: datetime) -> int:
    """A `train` task of 10 minutes with 30 minutes of slack, submitted a day before `expected_at`
    (and cancelled): the planner expects the same at `expected_at`. The history is written into
    its row, as the API submits at now."""
    task = await client.submit("train", latest_start=expected_at, estimated_duration=timedelta(minutes=10))
    await client.cancel(task.id)
    await scheduler.db.execute(
        "UPDATE lowtide.tasks SET created_at = %(at)s, latest_start = %(at)s + interval '30 minutes' WHERE id = %(id)s",
        {"at": expected_at - timedelta(days=1), "id": task.id},
    )
    return task.id
