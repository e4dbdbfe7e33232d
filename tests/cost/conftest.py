"""A signal service and a scheduler that subscribes to it, on one fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from lowtide.config import Config, CostConfig, QueueConfig, SignalConfig, TypeConfig
from lowtide_client import SignalClient
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH, make_config


@dataclass
class Pair:
    signal: SignalServer
    scheduler: Scheduler
    set_signal: Callable[[float], Any]


def cost_config(signal_target: str, **cost: Any) -> Config:
    # A long poll interval: anything that happens fast here happened by push, not by polling.
    base = make_config(signal_target=signal_target, poll_interval=timedelta(seconds=60))
    cost_settings = replace(
        CostConfig(deferrable_activities=("train",), hold_recheck=timedelta(milliseconds=200)), **cost
    )
    return replace(
        base,
        cost=cost_settings,
        queues={"batch": QueueConfig(deferrable_activities=("index",))},
        types={"inline": TypeConfig(local=True), "report": TypeConfig(max_defer=timedelta(milliseconds=400))},
    )


@pytest.fixture
async def signal(database_url: str) -> AsyncIterator[SignalServer]:
    running = await start_signal_service(
        Config(signal=SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"), auth=NO_AUTH),
        database_url=database_url,
    )
    yield running
    await running.stop(grace=0.5)


@pytest.fixture
async def pair(signal: SignalServer, database_url: str) -> AsyncIterator[Pair]:
    scheduler = await start_scheduler(cost_config(signal.target), database_url=database_url)

    async def set_signal(value: float) -> None:
        async with SignalClient(signal.target) as client:
            await client.set(value=value)

    yield Pair(signal, scheduler, set_signal)
    await scheduler.stop(grace=0.5)
