"""Fixtures for the security tests: services with auth on, one token per role, and TLS files."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from lowtide.auth import hash_token
from lowtide.config import AuthConfig, Config, SignalConfig, SignalDefinition, TokenEntry
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import make_config
from tests.security.certs import Pki, make_pki
from tests.signal.conftest import signal_config

TOKENS = {"worker": "w-secret-1", "submitter": "s-secret-2", "viewer": "v-secret-4", "admin": "a-secret-3"}
AUTH = AuthConfig(
    enabled=True, tokens=tuple(TokenEntry(f"{role}-token", role, hash_token(t)) for role, t in TOKENS.items())
)


def secured(config: Config) -> Config:
    return replace(config, auth=AUTH, signal=SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))


@pytest.fixture
async def guarded(database_url: str) -> AsyncIterator[Scheduler]:
    """A scheduler with auth on."""
    running = await start_scheduler(secured(make_config()), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


@pytest.fixture
def guarded_elsewhere(database_url: str) -> Iterator[Scheduler]:
    """A scheduler with auth on that serves from an event loop of its own thread, as one in
    another process would: it answers while the test's loop is busy."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(
            start_scheduler(secured(make_config()), database_url=database_url), loop
        )
        running = started.result(timeout=60)
        yield running
        asyncio.run_coroutine_threadsafe(running.stop(grace=0.5), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.fixture
async def guarded_signal(database_url: str) -> AsyncIterator[SignalServer]:
    """A signal service with auth on."""
    running = await start_signal_service(secured(make_config()), database_url=database_url)
    yield running
    await running.stop(grace=0.5)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


@pytest.fixture
async def open_signal(database_url: str) -> AsyncIterator[SignalServer]:
    """A signal service with auth off, as the bad-input tests drive its handlers directly."""
    config = signal_config({"price": SignalDefinition(unit="EUR/MWh", threshold=100.0)})
    running = await start_signal_service(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)
