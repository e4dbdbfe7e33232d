"""The scheduler reads its database figures every metrics_interval, or less often while a read
costs more than 5 % of that (domain.pacing): with a backlog of millions a read takes half a second,
and reading it every 5 s on every replica kept PostgreSQL counting. Here each refresh is made to
take 60 ms more than the database needs (the slowness of a large backlog's count) against the
tests' 200 ms interval: the refreshes then come at least 1.2 s apart, and the log says so."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from scheduler_service.domain.pacing import READ_SHARE
from scheduler_service.server import Scheduler
from tests.helpers import eventually

SLOWER = 0.06


async def test_a_costly_refresh_is_repeated_less_often_and_the_log_says_so(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lowtide.scheduler.metrics")
    metrics = scheduler.metrics
    real = metrics.refresh
    loop = asyncio.get_running_loop()
    began: list[float] = []

    async def slow_refresh() -> None:
        began.append(loop.time())
        await real()
        await asyncio.sleep(SLOWER)

    monkeypatch.setattr(metrics, "refresh", slow_refresh)

    async def paced() -> bool:
        return any(r.getMessage() == "metrics.refresh_paced" for r in caplog.records) and len(began) >= 4

    await eventually(paced, within=30)
    gaps = [later - earlier for earlier, later in itertools.pairwise(began)]
    assert gaps and min(gaps) >= SLOWER / READ_SHARE, gaps
