"""Every signal has a plausible range (its unit's, or `[signals.NAME] min` and `max`): a value
outside is refused with INVALID_ARGUMENT naming the range, from the CLI and the API, and a feed's
is dropped with a warning while the signal keeps its last good value."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from datetime import timedelta

import grpc
import pytest

from lowtide.config import SignalDefinition
from lowtide_client import SignalClient
from signal_service.server import SignalServer, start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, grid_api
from tests.signal.test_feeds import uk_entry


async def _lowtide(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lowtide", *args,
        env=dict(os.environ, LOWTIDE_LOG_LEVEL="WARNING"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_signal_set_refuses_an_implausible_value_naming_the_range(signal_server: SignalServer) -> None:
    code, _, err = await _lowtide("signal", "set", "520", "--target", signal_server.target)
    assert code == 0, err
    code, _, err = await _lowtide("signal", "set", "1e308", "--target", signal_server.target)
    assert code == 1
    assert err.startswith(
        "lowtide: INVALID_ARGUMENT: value: is 1e+308, outside the plausible range of 0 to 2000 gCO2/kWh of signal grid"
    )
    async with SignalClient(signal_server.target) as client:
        assert (await client.get()).value == 520.0
        # A price may be negative, as real ones are; not absurdly so.
        assert (await client.set(-400.0, name="price")).value == -400.0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.set(-50_000.0, name="price")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the plausible range of -1000 to 10000 EUR/MWh of signal price" in str(refused.value.details())
        assert (await client.get("price")).value == -400.0


async def test_a_configured_range_replaces_the_unit_s(database_url: str) -> None:
    signals = {"grid": SignalDefinition(max=900.0), "price": SignalDefinition(unit="EUR/MWh", min=-3000.0)}
    running = await start_signal_service(signal_config(signals), database_url=database_url)
    try:
        async with SignalClient(running.target) as client:
            with pytest.raises(grpc.aio.AioRpcError, match="0 to 900 gCO2/kWh"):
                await client.set(950.0)
            assert (await client.set(-2500.0, name="price")).value == -2500.0
    finally:
        await running.stop()


async def test_a_feed_value_out_of_range_is_dropped_with_a_warning_and_the_last_kept(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lowtide.signal.feed")
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 450, 430)]}))
        api.on("/intensity/*", Answer({"data": []}))
        config = signal_config(
            feed="uk-carbon-intensity",
            base_url=api.url,
            refresh=timedelta(milliseconds=100),
            timeout=timedelta(seconds=5),
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:

                async def value() -> float | None:
                    state = await client.get()
                    return state.value if state.HasField("value") else None

                assert await eventually(value, within=30) == 430.0
                # A broken upstream sends an absurd intensity: dropped, said, and 430 stays.
                api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:30Z", 99999, 99999)]}))
                errors = running.feed_stats.errors

                async def counted() -> bool:
                    return running.feed_stats.errors >= errors + 2

                await eventually(counted, within=30)
                assert await value() == 430.0
                warned = [r for r in caplog.records if r.getMessage() == "feed.bad_answer"]
                assert any("outside the plausible range of 0 to 2000" in str(getattr(r, "error", "")) for r in warned)
        finally:
            await running.stop()
