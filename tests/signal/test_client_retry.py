"""SignalClient goes through the same call wrapper as the scheduler's Client: a call made while the
signal service is not serving yet (starting, restarting) is retried on UNAVAILABLE and answered
once it serves, instead of failing at once."""

from __future__ import annotations

import asyncio

from lowtide_client import SignalClient
from signal_service.server import start_signal_service
from tests.helpers import free_port
from tests.signal.conftest import signal_config


async def test_a_get_made_before_the_service_serves_is_answered_once_it_does(database_url: str) -> None:
    target = f"127.0.0.1:{free_port()}"
    async with SignalClient(target) as client:
        get = asyncio.create_task(client.get())
        # The first attempts found nothing listening: without the retry the call has failed by now.
        await asyncio.sleep(0.3)
        assert not get.done(), get.exception() if get.done() else None
        running = await start_signal_service(signal_config(listen=target), database_url=database_url)
        try:
            state = await asyncio.wait_for(get, 15)
        finally:
            await running.stop()
    assert state.name == "grid" and state.unit == "gCO2/kWh"
