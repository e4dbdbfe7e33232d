"""The leader's release planner with pools bound to signals, on a real database. A pool that
loses all its workers is planned around at once, not at the next forecast: with forecasts that
do not change, a task placed in the pool whose workers left moves to the other pool it names
within a couple of seconds (the next new forecast could be half an hour away, the periodic plan a
minute). A pool's fixed starts and placed tasks keep their room."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from lowtide.config import Config, CostConfig, PoolConfig
from lowtide.db import Database
from scheduler_service.domain.holds import HoldConfig, HoldPolicy
from scheduler_service.domain.planning import Forecast
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.cost import CostHolds
from scheduler_service.holds.release_planning import ReleasePlanner
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.store import Store
from tests.helpers import eventually

POOLS = {"eu-west": PoolConfig(signal="gb"), "eu-central": PoolConfig(signal="de")}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        yield Store(db, on_unblocked=lambda rows: None)
    finally:
        await db.close()


def _holds(now: datetime) -> SignalHolds:
    config = HoldConfig(frozenset({"train"}), pool_signals={p: c.signal for p, c in POOLS.items()})
    by_signal = {
        name: CostHolds(target="127.0.0.1:1", signal=name, policy=HoldPolicy(), config=config, on_release=lambda: None)
        for name in ("grid", "gb", "de")
    }
    hours = [now + timedelta(minutes=30 * i) for i in range(8)]
    # Great Britain at 260 all along; Germany at 300 but for a clean hour two hours ahead.
    by_signal["gb"].forecast = Forecast.of((at, 260.0) for at in hours)
    by_signal["de"].forecast = Forecast.of((at, 150.0 if i in (4, 5) else 300.0) for i, at in enumerate(hours))
    return SignalHolds(by_signal, default="grid", config=config)


async def _workers(store: Store, *pools: str, slots: int = 2) -> None:
    await store.db.execute("DELETE FROM lowtide.workers", {})
    for pool in pools:
        await store.db.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at) "
            "VALUES (%(pool)s, %(pool)s, '{default}', '{train}', %(slots)s, 's', now() + interval '1 hour')",
            {"pool": pool, "slots": slots},
        )


async def _placed(store: Store) -> str | None:
    rows = await store.plannable_tasks()
    return rows[0].planned_pool


_TASK = (
    "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
    "backoff_coefficient, max_backoff_ms, latest_start, estimated_duration_ms, pools) "
    "VALUES ('default', 'activity', 'train', '', 3, 1000, 2.0, 60000, now() + interval '3 hours', 1800000, "
    "'{eu-west,eu-central}')"
)


def _planner(store: Store, now: datetime, holds: SignalHolds | None = None) -> ReleasePlanner:
    config = Config(cost=CostConfig(deferrable_activities=("train",)), pools=POOLS)
    return ReleasePlanner(store, Registry(), holds or _holds(now), config, wake_at=lambda at: None)


async def test_a_task_placed_in_a_pool_whose_workers_left_moves_to_the_other(store: Store) -> None:
    now = datetime.now(UTC)
    planner = _planner(store, now)
    await _workers(store, "eu-west", "eu-central")
    await store.db.execute(_TASK, {})
    await planner.tick()
    assert await _placed(store) == "eu-central"
    await _workers(store, "eu-west")

    async def moved() -> bool:
        await planner.tick()
        return await _placed(store) == "eu-west"

    # The forecasts are the same: only the pool's going away plans the task again.
    await eventually(moved, within=5)
    [row] = await store.plannable_tasks()
    assert row.planned_release_at is not None and row.planned_release_at < now + timedelta(minutes=5)


async def test_the_fixed_starts_a_pool_promised_keep_its_room(store: Store) -> None:
    """eu-central's two slots are booked by fixed starts over its clean hour: the task goes to
    eu-west, not into eu-central's promised room."""
    now = datetime.now(UTC)
    await _workers(store, "eu-west", "eu-central")
    for _ in range(2):
        await store.db.execute(
            "WITH fixed AS (INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, "
            "initial_backoff_ms, backoff_coefficient, max_backoff_ms, pool, start_at, run_at, start_tolerance_ms, "
            "on_miss, estimated_duration_ms) VALUES ('default', 'activity', 'other', '', 3, 1000, 2.0, 60000, "
            "'eu-central', now() + interval '1 hour', now() + interval '1 hour', 1000, 'run_late', 7200000) "
            "RETURNING id) "
            "INSERT INTO lowtide.reservations (task_id, pool, window_start, window_end) "
            "SELECT id, 'eu-central', now() + interval '1 hour', now() + interval '3 hours' FROM fixed",
            {},
        )
    await store.db.execute(_TASK, {})
    await _planner(store, now).tick()
    assert await _placed(store) == "eu-west"


async def test_work_naming_no_pool_is_not_planned_into_the_slot_a_placed_task_has(store: Store) -> None:
    """eu-central has one slot and Germany's grid is clean for an hour: a task placed there and
    work naming no pool that follows the same grid share that hour, one after the other, rather
    than both being released into the one slot at once."""
    now = datetime.now(UTC)
    holds = _holds(now)
    # The work naming no pool follows the default signal, here with Germany's forecast.
    holds.by_signal["grid"].forecast = holds.by_signal["de"].forecast
    planner = _planner(store, now, holds)
    await _workers(store, "eu-central", slots=1)
    await store.db.execute(_TASK.replace("{eu-west,eu-central}", "{eu-central}"), {})
    await store.db.execute(_TASK.replace("'{eu-west,eu-central}'", "NULL"), {})
    await planner.tick()
    placed, plain = sorted(await store.plannable_tasks(), key=lambda r: r.pools is None)
    assert placed.planned_pool == "eu-central" and plain.pools is None
    starts = [r.planned_release_at for r in (placed, plain) if r.planned_release_at is not None]
    assert len(starts) == 2
    # Each a half-hour run in the clean hour, the two not overlapping.
    assert abs(starts[0] - starts[1]) >= timedelta(minutes=30)
    for at in starts:
        assert now + timedelta(hours=2) - timedelta(seconds=1) <= at <= now + timedelta(hours=3)


@pytest.mark.parametrize(
    "elsewhere", ["activity_types = '{render}'", "queues = '{gpu}'"], ids=["another-type", "another-queue"]
)
async def test_a_task_is_placed_only_in_a_pool_whose_workers_run_it(store: Store, elsewhere: str) -> None:
    """eu-central is cleaner, but its workers run another type, or its type on another queue: the
    task is placed in eu-west, whose workers run it (placed in eu-central, it would wait there for
    its latest start)."""
    now = datetime.now(UTC)
    await _workers(store, "eu-west", "eu-central")
    await store.db.execute(f"UPDATE lowtide.workers SET {elsewhere} WHERE pool = 'eu-central'", {})
    await store.db.execute(_TASK, {})
    await _planner(store, now).tick()
    assert await _placed(store) == "eu-west"
