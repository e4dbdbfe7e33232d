"""What a running service does with the limits of a feed's API: a plan without forecasts is
asked once, not every refresh; Retry-After holds the next poll back; WattTime's forecast reaches
subscribers on the signal's own scale, as the planner needs it."""

from __future__ import annotations

from datetime import timedelta

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


async def test_the_watttime_forecast_reaches_subscribers_on_the_percentile_scale(database_url: str) -> None:
    with grid_api() as api:
        api.on("/login", Answer({"token": "t"}))
        api.on("/v3/signal-index", Answer(WT_INDEX))
        api.on("/v3/forecast", Answer(wt_forecast(900.0, 700.0, 1100.0)))
        config = signal_config(
            feed="watttime",
            base_url=api.url,
            username="me",
            password="pw",
            region="CAISO_NORTH",
            refresh=timedelta(milliseconds=100),
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:
                points = await eventually(client.forecast)
                assert [p.value for p in points] == [50.0, 0.0, 100.0]
                state = await client.get()
                assert (state.value, state.unit) == (57.0, "percentile")
        finally:
            await running.stop()
