"""Which signal holds which work: a type (or a queue) names its signal, so `train` waits for cheap
power while `rebuild_index` waits for clean power, each held and released by its own signal, and
`task explain` and `status` say which signal each hold follows. Through a real signal service,
scheduler, database and worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest

from lowtide.config import Config, QueueConfig, SignalConfig, SignalDefinition, TypeConfig
from lowtide_client import Client, SignalClient, TaskState
from scheduler_service.domain.holds import HoldConfig, HoldState, held_types_by_signal
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH
from tests.cost.conftest import Pair, cost_config
from tests.cost.test_cost_holds import state_of, worker_for

PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def test_each_type_follows_its_own_signal_then_its_queue_s_then_the_default() -> None:
    config = HoldConfig(
        frozenset({"train", "rebuild_index"}),
        {"batch": frozenset({"nightly"})},
        type_signals={"train": "price"},
        queue_signals={"batch": "de"},
    )
    on, off = HoldState(True, None, "high"), HoldState(False, None, "low")
    assert config.signal_for("default", "train", "grid") == "price"
    assert config.signal_for("batch", "train", "grid") == "price"
    assert config.signal_for("batch", "nightly", "grid") == "de"
    assert config.signal_for("batch", "rebuild_index", "grid") == "de"
    assert config.signal_for("default", "rebuild_index", "grid") == "grid"
    assert config.signals("grid") == {"grid", "price", "de"}
    holds = {"grid": on, "price": off, "de": off}
    assert held_types_by_signal("default", holds=holds, default="grid", config=config) == {"rebuild_index"}
    assert held_types_by_signal("batch", holds=holds, default="grid", config=config) == set()
    holds = {"grid": off, "price": on, "de": off}
    assert held_types_by_signal("default", holds=holds, default="grid", config=config) == {"train"}
    # A signal never heard of holds its types, as any signal does before its first value.
    assert held_types_by_signal("batch", holds={"grid": off}, default="grid", config=config) == {
        "train",
        "nightly",
        "rebuild_index",
    }


@pytest.fixture
async def signals(database_url: str) -> AsyncIterator[SignalServer]:
    config = Config(
        signal=SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"),
        signals={"price": SignalDefinition(unit="EUR/MWh", threshold=50.0)},
        auth=NO_AUTH,
    )
    running = await start_signal_service(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)


@pytest.fixture
async def scheduler(signals: SignalServer, database_url: str) -> AsyncIterator[Scheduler]:
    base = cost_config(signals.target, deferrable_activities=("train", "rebuild_index"))
    config = replace(
        base,
        signals={"price": SignalDefinition(unit="EUR/MWh", threshold=50.0)},
        types={**base.types, "train": TypeConfig(signal="price")},
        queues={"batch": QueueConfig(deferrable_activities=("nightly",), signal="price")},
    )
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)


async def test_a_type_held_on_price_and_one_held_on_grid_are_held_and_released_apart(
    signals: SignalServer, scheduler: Scheduler
) -> None:
    async with SignalClient(signals.target) as signal_client:
        await signal_client.set(520.0)
        await signal_client.set(20.0, name="price")
        async with (
            Client(scheduler.target) as client,
            worker_for(Pair(signals, scheduler, print), "train", "rebuild_index", "nightly"),
        ):
            # Clean power is dear, cheap power is here: train runs, rebuild_index waits.
            train = await client.submit("train")
            rebuild = await client.submit("rebuild_index")
            nightly = await client.submit("nightly", queue="batch")
            assert (await client.wait(train.id, timeout=timedelta(seconds=30))).state == COMPLETED
            assert (await client.wait(nightly.id, timeout=timedelta(seconds=30))).state == COMPLETED
            await asyncio.sleep(0.3)
            assert await state_of(client, rebuild.id) == (PENDING, 0)
            explained = await client.explain(rebuild.id)
            assert "signal grid is 520 gCO2/kWh" in explained.explanation
            status = await client.status()
            holds = {h.signal: h for h in status.holds}
            assert holds["grid"].active and list(holds["grid"].types) == ["rebuild_index"]
            # On the batch queue every held type follows the queue's signal, rebuild_index too.
            assert not holds["price"].active and list(holds["price"].types) == ["nightly", "rebuild_index", "train"]
            assert holds["price"].value == 20.0 and status.hold.signal == "grid"

            # The price rises and the grid gets clean: each hold turns on its own.
            await signal_client.set(80.0, name="price")
            await signal_client.set(100.0)
            assert (await client.wait(rebuild.id, timeout=timedelta(seconds=20))).state == COMPLETED
            train = await client.submit("train")
            nightly = await client.submit("nightly", queue="batch")
            await asyncio.sleep(0.3)
            assert await state_of(client, train.id) == (PENDING, 0)
            assert await state_of(client, nightly.id) == (PENDING, 0)
            explained = await client.explain(train.id)
            assert "signal price is 80 EUR/MWh, above its threshold of 50" in explained.explanation

            # A negative price is cheap power too.
            await signal_client.set(-5.0, name="price")
            assert (await client.wait(train.id, timeout=timedelta(seconds=20))).state == COMPLETED
            assert (await client.wait(nightly.id, timeout=timedelta(seconds=20))).state == COMPLETED
