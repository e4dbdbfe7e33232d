"""A scheduler with configured pools, on a fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest

from lowtide.config import Config, PoolConfig
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config

POOLS = {
    "one": PoolConfig(max_workers=1),
    "two": PoolConfig(max_workers=2),
    "three": PoolConfig(max_workers=3),
    "ten": PoolConfig(max_workers=10),
    "busy": PoolConfig(max_workers=1, max_hold=timedelta(seconds=10), autoscale_horizon=timedelta(minutes=5)),
}


def fixed_config(**scheduler: object) -> Config:
    return replace(make_config(**scheduler), pools=POOLS)


@pytest.fixture
async def fixed_scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(fixed_config(), database_url=database_url)
    yield running
    await running.stop(grace=0.5)
