"""`lowtide up` with three signals from three feeds (two grids' carbon intensity and a power
price), each against its own local API answering in the provider's shape: all three come in, and
when the price API goes away only the price goes stale."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from lowtide_client import SignalClient
from tests.e2e.test_up import Session
from tests.helpers import eventually
from tests.signal.grid_server import Answer, grid_api
from tests.signal.test_feeds import uk_entry
from tests.signal.test_many_feeds import energy_charts_today


async def _fresh(client: SignalClient) -> set[str]:
    return {s.name for s in await client.list() if s.HasField("value") and not s.stale}


async def _stale(client: SignalClient) -> set[str]:
    return {s.name for s in await client.list() if s.stale}


@pytest.mark.slow
async def test_up_runs_three_signals_from_three_feeds_and_one_outage_stales_only_its_own(
    tmp_path: Path, database_url: str
) -> None:
    session = Session(tmp_path)
    with grid_api() as uk, grid_api() as maps, contextlib.ExitStack() as price_api:
        charts = price_api.enter_context(grid_api())
        uk.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 180, 175)]}))
        uk.on("/intensity/*", Answer({"data": []}))
        latest = {"zone": "DE", "carbonIntensity": 310, "datetime": "2026-11-29T23:00:00.000Z"}
        maps.on("/v3/carbon-intensity/latest", Answer(latest))
        maps.on("/v3/carbon-intensity/forecast", Answer({"zone": "DE", "forecast": []}))
        energy_charts_today(charts, [55.0, 42.0, 30.0])
        (tmp_path / "lowtide.toml").write_text(
            f"""
[signal]
feed = "uk-carbon-intensity"
base_url = "{uk.url}"
refresh = "200ms"
stale_after = "3s"

[signals.de]
feed = "electricitymaps"
region = "DE"
token = "t"
threshold = 300.0
base_url = "{maps.url}"

[signals.price]
feed = "energy-charts"
region = "DE-LU"
threshold = 50.0
base_url = "{charts.url}"

[types.train]
signal = "price"
"""
        )
        session.env.update(LOWTIDE_CONFIG=str(tmp_path / "lowtide.toml"), LOWTIDE_DATABASE_URL=database_url)
        try:
            _, printed = await session.up()
            assert any("feeds: grid uk-carbon-intensity, de electricitymaps, price energy-charts" in p for p in printed)
            async with SignalClient(session.env["LOWTIDE_SIGNAL_LISTEN"]) as client:
                await eventually(lambda: _all_fresh(client), within=30.0)
                price_api.close()
                await eventually(lambda: _price_stale(client), within=30.0)
                # Longer than stale_after again: the two grids stay fresh, their feeds still answer.
                await asyncio.sleep(4.0)
                assert await _stale(client) == {"price"}
                assert await _fresh(client) == {"grid", "de"}
        finally:
            await session.close()


async def _all_fresh(client: SignalClient) -> bool:
    return await _fresh(client) == {"grid", "de", "price"}


async def _price_stale(client: SignalClient) -> bool:
    return await _stale(client) == {"price"}
