"""What a running service does with the limits of a feed's API: a plan without forecasts is
asked once, not every refresh; Retry-After holds the next poll back; WattTime's forecast reaches
subscribers in WattTime's own unit (lbs/MWh for its MOER), and its index (a percentile) with no
forecast, never one on another scale."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from lowtide.config import Config
from lowtide_client import SignalClient
from signal_service.feeds.base import HttpJson
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, grid_api
from tests.signal.test_feeds import EM_LATEST, WT_INDEX, uk_entry, wt_forecast


async def _at_least(value: int, wanted: int) -> bool:
    return value >= wanted


async def test_a_plan_without_forecasts_is_asked_once_while_the_value_keeps_coming(database_url: str) -> None:
    with grid_api() as api:
        api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST))
        api.on("/v3/carbon-intensity/forecast", Answer({"message": "Forbidden"}, status=403))
        config = signal_config(
            feed="electricitymaps", base_url=api.url, region="DE", token="free", refresh=timedelta(milliseconds=100)
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            await eventually(lambda: _at_least(running.feed_stats.fetches, 6))
            async with SignalClient(running.target) as client:
                assert (await client.get()).value == 302.0
                assert await client.forecast() == []
            assert len(api.to("/v3/carbon-intensity/forecast")) == 1
            assert (running.feed_stats.forecast_errors, running.feed_stats.forecast_available) == (1, False)
            assert running.feed_stats.errors == 0
        finally:
            await running.stop()


async def test_retry_after_holds_the_next_poll_back_and_counts_one_error(database_url: str) -> None:
    with grid_api() as api:
        api.on(
            "/intensity",
            Answer({"error": "Too Many Requests"}, status=429, headers={"Retry-After": "1"}),
            Answer({"data": [uk_entry("2026-11-29T23:00Z", 250, 240)]}),
        )
        api.on("/intensity/*", Answer({"data": [uk_entry("2026-11-29T23:30Z", 230, None)]}))
        # A backoff shorter than the wait, so the wait is the runner's to keep, not the call's.
        feed = UkCarbonIntensity(HttpJson(api.url, timeout=1.0, backoff_initial=0.01, backoff_max=0.02))
        running = await start_signal_service(
            signal_config(refresh=timedelta(milliseconds=100)), database_url=database_url, feed=feed
        )
        try:
            async with SignalClient(running.target) as client:
                state = await eventually(lambda: _valued(client), within=10.0)
            assert state == 240.0
            first, second = api.to("/intensity")[:2]
            assert second.at - first.at >= 1.0
            # Nothing else was asked of the API meanwhile (not the forecast either), and the one
            # 429 is the one error: the wait itself is none.
            assert not [r for r in api.requests if first.at < r.at < second.at]
            assert running.feed_stats.errors == 1
        finally:
            await running.stop()


async def test_the_leader_keeps_the_feed_through_a_retry_after_so_no_replica_asks_in_its_place(
    database_url: str,
) -> None:
    with grid_api() as api:
        api.on(
            "/intensity",
            Answer({"error": "Too Many Requests"}, status=429, headers={"Retry-After": "3"}),
            Answer({"data": [uk_entry("2026-11-29T23:00Z", 250, 240)]}),
        )
        api.on("/intensity/*", Answer({"data": []}))
        config = signal_config(refresh=timedelta(milliseconds=100))

        def feed() -> UkCarbonIntensity:
            return UkCarbonIntensity(HttpJson(api.url, timeout=1.0, backoff_initial=0.01, backoff_max=0.02))

        # The lease of a 100 ms refresh lasts 2 s: less than the wait.
        one = await start_signal_service(config, database_url=database_url, feed=feed())
        two = await start_signal_service(config, database_url=database_url, feed=feed())
        try:
            async with SignalClient(one.target) as client:
                assert await eventually(lambda: _valued(client), within=10.0) == 240.0
            first, second = api.to("/intensity")[:2]
            assert second.at - first.at >= 3.0
            assert [r.fetches for r in (one.feed_stats, two.feed_stats)].count(0) == 1
        finally:
            await two.stop()
            await one.stop()


async def _valued(client: SignalClient) -> float | None:
    state = await client.get()
    return state.value if state.HasField("value") else None


def watttime_config(url: str, *, watttime_signal: str = "index") -> Config:
    return signal_config(
        feed="watttime",
        base_url=url,
        username="me",
        password="pw",
        region="CAISO_NORTH",
        refresh=timedelta(milliseconds=100),
        watttime_signal=watttime_signal,
    )


async def test_the_watttime_index_is_published_as_a_percentile_and_no_forecast_is_asked(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lowtide.signal.feed")
    with grid_api() as api:
        api.on("/login", Answer({"token": "t"}))
        api.on("/v3/signal-index", Answer(WT_INDEX))
        # Were it asked, the forecast would answer: in lbs/MWh, not on the index's scale.
        api.on("/v3/forecast", Answer(wt_forecast(900.0, 700.0, 1100.0)))
        running = await start_signal_service(watttime_config(api.url), database_url=database_url)
        try:
            await eventually(lambda: _at_least(running.feed_stats.fetches, 4))
            async with SignalClient(running.target) as client:
                state = await client.get()
                assert (state.value, state.unit) == (57.0, "percentile")
                assert await client.forecast() == []
            assert api.to("/v3/forecast") == []
            assert (running.feed_stats.errors, running.feed_stats.forecast_errors) == (0, 0)
        finally:
            await running.stop()
    started = [r for r in caplog.records if r.getMessage() == "feed.watttime"]
    assert len(started) == 1
    assert started[0].__dict__["forecast"].startswith("none")


async def test_the_watttime_moer_value_and_forecast_reach_subscribers_in_lbs_per_mwh(database_url: str) -> None:
    with grid_api() as api:
        api.on("/login", Answer({"token": "t"}))
        api.on("/v3/forecast", Answer(wt_forecast(900.0, 700.0, 1100.0)))
        config = watttime_config(api.url, watttime_signal="moer")
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:
                points = await eventually(client.forecast)
                assert [(p.at.ToDatetime().minute, p.value) for p in points] == [(10, 700.0), (15, 1100.0)]
                state = await client.get()
                assert (state.value, state.unit, state.source) == (900.0, "lbs/MWh", "watttime")
            assert api.to("/v3/signal-index") == []
        finally:
            await running.stop()


async def test_watttime_moer_without_forecast_access_is_a_feed_error_every_poll(database_url: str) -> None:
    with grid_api() as api:
        api.on("/login", Answer({"token": "t"}))
        api.on("/v3/forecast", Answer({"error": "Unauthorized: no access to forecast"}, status=403))
        config = watttime_config(api.url, watttime_signal="moer")
        running = await start_signal_service(config, database_url=database_url)
        try:
            await eventually(lambda: _at_least(running.feed_stats.errors, 3))
            async with SignalClient(running.target) as client:
                assert not (await client.get()).HasField("value")
                assert await client.forecast() == []
            stats = running.feed_stats
            # The forecast side is the plan-without-forecasts path: once, then a day's wait.
            assert (stats.forecast_errors, stats.forecast_available) == (1, False)
            # One request a poll, not one for the value and another for the forecast.
            assert len(api.to("/v3/forecast")) <= stats.fetches
        finally:
            await running.stop()
