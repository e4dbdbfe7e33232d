"""Fixtures for the signal service: a replica on 127.0.0.1:0 over the per-test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import timedelta

import pytest

from lowtide.config import Config, SignalConfig, SignalDefinition
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH


def signal_config(signals: Mapping[str, SignalDefinition] | None = None, **signal: object) -> Config:
    base = SignalConfig(
        listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", stale_after=timedelta(hours=1), refresh=timedelta(seconds=1)
    )
    return Config(signal=replace(base, **signal), signals=dict(signals or {}), auth=NO_AUTH)  # type: ignore[arg-type]


@pytest.fixture
async def signal_server(database_url: str) -> AsyncIterator[SignalServer]:
    running = await start_signal_service(
        signal_config({"price": SignalDefinition(unit="EUR/MWh", threshold=100.0)}), database_url=database_url
    )
    yield running
    await running.stop()
