"""A scheduler with the fixed-start pools and a type with a default estimated duration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest

from lowtide.config import TypeConfig
from scheduler_service.server import Scheduler, start_scheduler
from tests.fixed.conftest import fixed_config


@pytest.fixture
async def scheduled(database_url: str) -> AsyncIterator[Scheduler]:
    config = replace(fixed_config(), types={"backup": TypeConfig(estimated_duration=timedelta(minutes=2))})
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)
