"""Planned release through the real services: a replayed trace with a forecast, a scheduler that
plans held tasks with a latest start, and a real worker."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lowtide.config import Config, CostConfig, SignalConfig
from lowtide_client import Client, SignalClient, Task, TaskState, Worker
from scheduler_service.domain.planning import release_by
from scheduler_service.maintenance import LEADER
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.domain import Point
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH, make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
PENDING = TaskState.Value("TASK_STATE_PENDING")

# Ten-minute rows played at 600x: a row per second. The signal dips under the threshold (250) at
# the second row, but the cheapest window is at the fourth.
TRACE = [300, 200, 220, 90, 95, 300, 310, 320, 330, 340, 350, 360]


@dataclass
class Services:
    signal: SignalServer
    scheduler: Scheduler


async def _services(
    database_url: str, tmp_path: Path, feed: str, forecast_model: str = "iid", **settings: object
) -> tuple[SignalServer, Scheduler]:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    trace = tmp_path / "trace.csv"
    rows = [f"{(start + timedelta(minutes=10 * i)).strftime('%Y-%m-%d %H:%M:%S')},{v}" for i, v in enumerate(TRACE)]
    trace.write_text("Time,Carbon Intensity\n" + "\n".join(rows) + "\n")
    cost = CostConfig(defer_threshold=250.0, deferrable_activities=("train",))
    signal_config = SignalConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        feed=feed,
        replay_file=str(trace),
        replay_speed=600.0,
        replay_forecast_model=forecast_model,
        replay_forecast_error=0.0,
        replay_loop=False,
        refresh=timedelta(milliseconds=200),
    )
    signal = await start_signal_service(
        Config(signal=signal_config, cost=cost, auth=NO_AUTH), database_url=database_url
    )
    config = replace(make_config(signal_target=signal.target, **settings), cost=cost)
    scheduler = await start_scheduler(config, database_url=database_url)
    return signal, scheduler


@pytest.fixture
async def replayed(database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    signal, scheduler = await _services(database_url, tmp_path, "replay")
    yield Services(signal, scheduler)
    await scheduler.stop(grace=0.5)
    await signal.stop(grace=0.5)


@pytest.fixture
async def static(database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    signal, scheduler = await _services(database_url, tmp_path, "static")
    yield Services(signal, scheduler)
    await scheduler.stop(grace=0.5)
    await signal.stop(grace=0.5)


def train_worker(scheduler: Scheduler, started: dict[str, float]) -> Worker:
    worker = Worker(target=scheduler.target, slots=2)

    async def train(payload: bytes) -> bytes:
        started[payload.decode()] = asyncio.get_running_loop().time()
        return payload

    worker.register("train", train)
    return worker


async def _forecast_known(services: Services) -> bool:
    return services.scheduler.dispatcher.holds.forecast is not None


async def test_a_held_task_runs_in_the_cheapest_window_not_at_the_first_dip(replayed: Services) -> None:
    started: dict[str, float] = {}
    await eventually(lambda: _forecast_known(replayed))
    async with Client(replayed.scheduler.target) as client, train_worker(replayed.scheduler, started):
        submitted = asyncio.get_running_loop().time()
        task = await client.submit(
            "train",
            "planned",
            latest_start=datetime.now(UTC) + timedelta(seconds=8),
            estimated_duration=timedelta(seconds=1),
        )
        assert task.HasField("planned_release_at") and task.planned_intensity < 100
        explained = await client.explain(task.id)
        assert explained.reasons[0] == "planned_release"
        # With the forecast it came from: the replay feed's, streamed to the scheduler.
        assert "(forecast: replay #" in explained.explanation
        done = await client.wait(task.id, timeout=timedelta(seconds=15))
    # The threshold hold would have released it at the first dip (200 < 250); the plan waited
    # for the 90 window, and the release was on time (the feed itself may lag a poll behind).
    planned = done.planned_release_at.ToDatetime(tzinfo=UTC)
    actual = done.started_at.ToDatetime(tzinfo=UTC)
    assert done.state == COMPLETED
    assert done.planned_intensity < 100
    assert timedelta(0) <= actual - planned < timedelta(seconds=1)
    assert started["planned"] - submitted >= 1.0
    # The time-held histogram counts it under its planned release, from submission to release.
    text = replayed.scheduler.metrics.metrics.text()
    labels = 'activity_type="train",queue="default",reason="planned_release"'
    held = float(re.search(rf"^lowtide_task_held_duration_seconds_sum\{{{labels}\}} (\S+)$", text, re.M)[1])  # type: ignore[index]
    assert re.search(rf"^lowtide_task_held_duration_seconds_count\{{{labels}\}} 1\.0$", text, re.M)
    assert held >= (planned - done.created_at.ToDatetime(tzinfo=UTC)).total_seconds() - 0.001


async def test_without_a_forecast_the_threshold_hold_applies_and_the_latest_start_holds(static: Services) -> None:
    started: dict[str, float] = {}
    async with SignalClient(static.signal.target) as signals:
        await signals.set(400)
    async with Client(static.scheduler.target) as client, train_worker(static.scheduler, started):
        latest = datetime.now(UTC) + timedelta(seconds=3)
        bounded = await client.submit("train", "bounded", latest_start=latest)
        assert not bounded.HasField("planned_release_at")
        done = await client.wait(bounded.id, timeout=timedelta(seconds=10))
    # Held all along (the signal stayed high), it still ran by its latest start: released a
    # little before it (release_by), so the claim that follows does not make it late.
    assert done.state == COMPLETED
    assert done.signal_at_dispatch == 400
    started_at = done.started_at.ToDatetime(tzinfo=UTC)
    assert release_by(latest) <= started_at <= latest


async def test_the_leader_plans_again_on_a_new_forecast_streamed_by_the_signal_service(static: Services) -> None:
    # A static feed issues no forecast of its own, so the one set here is the only one.
    holds = static.scheduler.dispatcher.holds
    async with Client(static.scheduler.target) as client, SignalClient(static.signal.target) as signals:
        # The current value (high) starts the scheduler's forecast at now; the feed's points
        # start later.
        await signals.set(300)
        task = await client.submit(
            "train", latest_start=datetime.now(UTC) + timedelta(hours=2), estimated_duration=timedelta(minutes=10)
        )
        now = datetime.now(UTC)
        # A new forecast whose cheapest window is an hour from now, issued as a feed issues one:
        # the signal service stores it and streams it to the scheduler beside the state.
        issued = await static.signal.signals.set_forecast(
            "grid",
            [
                Point(now + timedelta(minutes=5), 300.0),
                Point(now + timedelta(minutes=60), 50.0),
                Point(now + timedelta(minutes=70), 300.0),
                Point(now + timedelta(hours=3), 300.0),
            ],
            source="test-feed",
        )
        assert issued is not None
        await eventually(lambda: _forecast_known(static))
        assert holds.forecast_source == "test-feed"
        # The leader's planner (in maintenance) sees the new version and plans again.
        replanned = await eventually(lambda: _planned_near(client, task.id, now + timedelta(minutes=60)))
    assert replanned


async def _planned_near(client: Client, task_id: int, when: datetime) -> bool:
    task = await client.get(task_id)
    if not task.HasField("planned_release_at"):
        return False
    return abs(task.planned_release_at.ToDatetime(tzinfo=UTC) - when) < timedelta(minutes=1)


async def test_a_plan_leaves_fixed_start_reservations_their_capacity(static: Services) -> None:
    now = datetime.now(UTC)
    cheap, next_best = now + timedelta(minutes=60), now + timedelta(minutes=90)  # 50, then 80
    async with Client(static.scheduler.target) as client, SignalClient(static.signal.target) as signals:
        await signals.set(300)
        # A fixed start holds the only slot over the cheapest window.
        await client.submit("report", start_at=cheap, estimated_duration=timedelta(minutes=10))
        task = await client.submit(
            "train", latest_start=now + timedelta(hours=2), estimated_duration=timedelta(minutes=10)
        )
        await static.signal.signals.set_forecast(
            "grid",
            [
                Point(now + timedelta(minutes=5), 300.0),
                Point(cheap - timedelta(minutes=5), 50.0),
                Point(cheap + timedelta(minutes=20), 300.0),
                Point(next_best, 80.0),
                Point(next_best + timedelta(minutes=20), 300.0),
                Point(now + timedelta(hours=3), 300.0),
            ],
            source="test-feed",
        )
        # Not in the reserved window: the plan takes the cheapest start after it instead.
        planned = await eventually(lambda: _planned_after(client, task.id, cheap + timedelta(minutes=10)))
    assert planned is not None
    assert planned.planned_intensity <= 80  # the rest of the cheap window, or the next best
    assert "the pool is full" in planned.plan_reason


async def _planned_after(client: Client, task_id: int, when: datetime) -> Task | None:
    task = await client.get(task_id)
    if task.HasField("planned_release_at") and task.planned_release_at.ToDatetime(tzinfo=UTC) >= when:
        return task
    return None


async def _leader(scheduler: Scheduler) -> str | None:
    row = await scheduler.db.fetch_one("SELECT holder FROM lowtide.leader WHERE name = %(name)s", {"name": LEADER})
    return None if row is None else str(row["holder"])


async def test_a_worker_on_another_replica_starts_at_the_leaders_new_plan_not_a_poll_later(
    database_url: str, tmp_path: Path
) -> None:
    # Dispatchers poll every 5 s here: only a wake-up at the planned time starts the task on time.
    slow_poll = {"poll_interval": timedelta(seconds=5)}
    signal, leader = await _services(database_url, tmp_path, "static", "iid", **slow_poll)
    follower = None
    try:
        await eventually(lambda: _leads(leader))
        follower = await start_scheduler(
            replace(make_config(signal_target=signal.target, **slow_poll), cost=leader.config.cost),
            database_url=database_url,
        )
        started: dict[str, float] = {}
        async with (
            Client(leader.target) as client,
            SignalClient(signal.target) as signals,
            train_worker(follower, started),
        ):
            await signals.set(300)  # high, and it stays high: only the plan releases the task
            task = await client.submit(
                "train",
                "planned",
                latest_start=datetime.now(UTC) + timedelta(hours=1),
                estimated_duration=timedelta(seconds=1),
            )
            now = datetime.now(UTC)
            cheap = now + timedelta(seconds=3)
            await signal.signals.set_forecast(
                "grid",
                [
                    Point(now + timedelta(seconds=1), 300.0),
                    Point(cheap, 50.0),
                    Point(cheap + timedelta(seconds=1), 300.0),
                    Point(now + timedelta(hours=2), 300.0),
                ],
                source="test-feed",
            )
            done = await client.wait(task.id, timeout=timedelta(seconds=10))
        assert await _leader(leader) == leader.scheduler_id != follower.scheduler_id
        # Run by the only worker, which is connected to the follower.
        assert done.state == COMPLETED
        planned = done.planned_release_at.ToDatetime(tzinfo=UTC)
        actual = done.started_at.ToDatetime(tzinfo=UTC)
        assert abs(planned - cheap) < timedelta(milliseconds=100)
        assert timedelta(0) <= actual - planned < timedelta(seconds=1)
    finally:
        if follower is not None:
            await follower.stop(grace=0.5)
        await leader.stop(grace=0.5)
        await signal.stop(grace=0.5)


async def _leads(scheduler: Scheduler) -> bool:
    return await _leader(scheduler) == scheduler.scheduler_id


async def test_a_plan_for_the_end_of_the_window_still_starts_by_the_latest_start(static: Services) -> None:
    started: dict[str, float] = {}
    async with (
        Client(static.scheduler.target) as client,
        SignalClient(static.signal.target) as signals,
        train_worker(static.scheduler, started),
    ):
        await signals.set(300)
        now = datetime.now(UTC)
        latest = now + timedelta(seconds=3)
        # The cheapest window begins at the latest start itself.
        await static.signal.signals.set_forecast(
            "grid",
            [Point(now + timedelta(seconds=1), 300.0), Point(latest, 40.0), Point(now + timedelta(hours=1), 40.0)],
            source="test-feed",
        )
        await eventually(lambda: _forecast_known(static))
        # Run for 10 s, a start at the release (a second before the latest start) is mostly cheap.
        task = await client.submit("train", "edge", latest_start=latest, estimated_duration=timedelta(seconds=10))
        assert task.HasField("planned_release_at")
        done = await client.wait(task.id, timeout=timedelta(seconds=10))
    started_at = done.started_at.ToDatetime(tzinfo=UTC)
    released = done.planned_release_at.ToDatetime(tzinfo=UTC)
    # Planned as late as it may be, released then, and claimed before the latest start passed.
    assert released == release_by(latest)
    assert released <= started_at <= latest


async def test_a_forecast_stating_its_error_is_planned_on_allowing_for_it(database_url: str, tmp_path: Path) -> None:
    # The replay's default forecasts state each point's expected error; the scheduler plans on it.
    signal, scheduler = await _services(database_url, tmp_path, "replay", forecast_model="horizon")
    services = Services(signal, scheduler)
    try:
        await eventually(lambda: _forecast_known(services))
        async with Client(scheduler.target) as client:
            task = await client.submit(
                "train",
                "cautious",
                latest_start=datetime.now(UTC) + timedelta(seconds=8),
                estimated_duration=timedelta(seconds=1),
            )
            assert task.HasField("planned_release_at")
            explained = await client.explain(task.id)
            assert "allowing for its expected error" in explained.explanation
    finally:
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)
