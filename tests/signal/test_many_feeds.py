"""Several signals in one service, each driven by its own feed (`[signals.NAME] feed`) against its
own local API: each stored, streamed, made stale and health-reported on its own, and one feed's
outage leaves the others as they were."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lowtide.config import Config, load_config
from lowtide.errors import ConfigError
from lowtide.health import check_health
from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2
from signal_service.feeds import feed_settings
from signal_service.server import SignalServer, health_name, start_signal_service
from tests.conftest import NO_AUTH
from tests.helpers import eventually
from tests.signal.grid_server import Answer, GridApi, grid_api
from tests.signal.test_feeds import uk_entry
from tests.signal.test_price_feeds import HOUR, day, document, period, series


def this_hour() -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0)


def energy_charts_today(api: GridApi, prices: list[float]) -> None:
    """Published prices from the hour before this one, one per hour."""
    start = (this_hour() - HOUR).strftime("%Y-%m-%dT%H:%M")
    api.on("/price", Answer(day(start, len(prices), HOUR, prices)))


def entsoe_today(api: GridApi, prices: list[float]) -> None:
    first = this_hour() - HOUR
    end = first + len(prices) * HOUR
    points = [(i + 1, price) for i, price in enumerate(prices)]
    stamp = "%Y-%m-%dT%H:%MZ"
    api.on("/api", Answer(document(series(period(first.strftime(stamp), end.strftime(stamp), "PT60M", points)))))


def config_from(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "lowtide.toml"
    path.write_text(text)
    config = load_config(path, env={})
    signal = replace(config.signal, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    return replace(config, signal=signal, auth=NO_AUTH)


async def _valued(client: SignalClient, name: str) -> signal_pb2.SignalState | None:
    state = await client.get(name)
    return state if state.HasField("value") and not state.stale else None


async def test_both_price_feeds_stream_their_published_prices_with_error_0(database_url: str, tmp_path: Path) -> None:
    with grid_api() as charts, grid_api() as transparency:
        energy_charts_today(charts, [55.0, -7.5, 30.0, 80.0])
        entsoe_today(transparency, [60.0, -2.0, 35.0])
        config = config_from(
            tmp_path,
            f"""
            [signals.price]
            feed = "energy-charts"
            region = "DE-LU"
            threshold = 50
            base_url = "{charts.url}"
            refresh = "100ms"

            [signals.dayahead]
            feed = "entsoe"
            region = "DE-LU"
            token = "tok"
            threshold = 50
            base_url = "{transparency.url}"
            refresh = "100ms"
            """,
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:
                for name, now, source in [("price", -7.5, "energy-charts"), ("dayahead", -2.0, "entsoe")]:
                    updates = client.updates(name)
                    state = await asyncio.wait_for(_first_with_value(updates), 10.0)
                    assert (state.state.value, state.state.unit, state.state.high) == (now, "EUR/MWh", False)
                    assert state.state.source == source
                    points = await eventually(lambda name=name: client.forecast(name))  # type: ignore[misc]
                    # The hour now and those after it, as published, each known.
                    assert points[0].value == now and len(points) >= 2
                    assert {p.expected_error for p in points} == {0.0}
                    await updates.aclose()
                listed = {s.name: s.unit for s in await client.list()}
                assert listed == {"grid": "gCO2/kWh", "price": "EUR/MWh", "dayahead": "EUR/MWh"}
        finally:
            await running.stop()


async def _first_with_value(updates: object) -> signal_pb2.SubscribeResponse:
    async for update in updates:  # type: ignore[attr-defined]
        if update.state.HasField("value"):
            return update  # type: ignore[no-any-return]
    raise AssertionError("the stream ended")


async def test_one_feed_down_makes_only_its_signal_stale(database_url: str, tmp_path: Path) -> None:
    with grid_api() as uk, grid_api() as maps, contextlib.ExitStack() as price_api:
        charts = price_api.enter_context(grid_api())
        uk.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 180, 175)]}))
        uk.on("/intensity/*", Answer({"data": []}))
        latest = {"zone": "DE", "carbonIntensity": 310, "datetime": "2026-11-29T23:00:00.000Z"}
        maps.on("/v3/carbon-intensity/latest", Answer(latest))
        maps.on("/v3/carbon-intensity/forecast", Answer({"zone": "DE", "forecast": []}))
        energy_charts_today(charts, [55.0, 42.0, 30.0])
        # Every feed answers the same value poll after poll, for longer than stale_after: a feed
        # that keeps answering keeps its signal fresh though nothing new is stored.
        config = config_from(
            tmp_path,
            f"""
            [signal]
            feed = "uk-carbon-intensity"
            base_url = "{uk.url}"
            refresh = "100ms"
            stale_after = "1500ms"
            timeout = "300ms"

            [signals.de]
            feed = "electricitymaps"
            region = "DE"
            token = "t"
            base_url = "{maps.url}"

            [signals.price]
            feed = "energy-charts"
            region = "DE-LU"
            threshold = 50
            base_url = "{charts.url}"
            """,
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:
                for name in ("grid", "de", "price"):
                    await eventually(lambda name=name: _valued(client, name))  # type: ignore[misc]
                # Every state each signal passes through, stale ones included however briefly.
                seen: dict[str, list[bool]] = {"grid": [], "de": [], "price": []}
                watchers = [asyncio.create_task(_watch(client, name, seen[name])) for name in seen]
                await asyncio.sleep(2.5)
                assert not any(any(marks) for marks in seen.values()), seen
                assert await _health(running, "price") and await _health(running, "grid")

                # The price API goes away: only the price goes stale, and its health says so.
                price_api.close()
                await eventually(lambda: _has_stale(client, "price"), within=15.0)
                await asyncio.sleep(2.0)
                assert await _stale(client) == {"price"}
                assert (await client.get("price")).value == 42.0
                assert not await _health(running, "price")
                assert await _health(running, "grid") and await _health(running, "de")
                # The service itself still serves.
                assert (await check_health(running.target)).serving
                assert running.feeds["price"].errors > 0
                assert running.feeds["grid"].errors == running.feeds["de"].errors == 0
                assert not any(seen["grid"]) and not any(seen["de"])
                for watcher in watchers:
                    watcher.cancel()
        finally:
            await running.stop()


async def _watch(client: SignalClient, name: str, marks: list[bool]) -> None:
    async for update in client.updates(name):
        marks.append(update.state.stale)


async def _stale(client: SignalClient) -> set[str]:
    return {s.name for s in await client.list() if s.stale}


async def _has_stale(client: SignalClient, name: str) -> bool:
    return name in await _stale(client)


async def _health(running: SignalServer, name: str) -> bool:
    return (await check_health(running.target, health_name(name))).serving


def test_the_default_signal_may_name_its_feed_in_its_own_section_but_not_in_both(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text('[signals.grid]\nfeed = "uk-carbon-intensity"\nregion = "13"\n')
    settings = feed_settings(load_config(path, env={}))
    grid = settings["grid"]
    assert (grid.feed, grid.options.region, grid.where) == ("uk-carbon-intensity", "13", "[signals.grid]")
    path.write_text('[signal]\nfeed = "replay"\n\n[signals.grid]\nfeed = "uk-carbon-intensity"\n')
    with pytest.raises(ConfigError, match=r"\[signals.grid\] feed: .* name it in one place"):
        feed_settings(load_config(path, env={}))


async def test_a_price_trace_replays_as_a_price_signal(database_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "prices.csv"
    trace.write_text("Time,Price\n2026-03-29T10:00:00Z,-8.5\n2026-03-29T11:00:00Z,-8.5\n2026-03-29T12:00:00Z,40\n")
    config = config_from(
        tmp_path,
        f'[signals.price]\nfeed = "replay"\nreplay_file = "{trace}"\nreplay_speed = 1\nthreshold = 50\n',
    )
    running = await start_signal_service(config, database_url=database_url)
    try:
        async with SignalClient(running.target) as client:
            state = await eventually(lambda: _valued(client, "price"))
            assert state is not None
            assert (state.value, state.unit, state.high, state.source) == (-8.5, "EUR/MWh", False, "replay")
    finally:
        await running.stop()
