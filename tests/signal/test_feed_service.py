"""Feeds driving a running service: configured by `[signal]`, stored and pushed like SetSignal,
and a bad answer leaves the last good value in place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2
from signal_service.domain import Point, Reading
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, grid_api
from tests.signal.test_feeds import uk_entry


async def test_uk_feed_value_and_forecast_reach_subscribers_and_a_bad_answer_keeps_the_last(
    database_url: str,
) -> None:
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 450, 430)]}))
        ahead = [uk_entry("2026-11-29T23:30Z", 420, None), uk_entry("2026-11-30T00:00Z", 380, None)]
        # The forecast's path carries the service's current time.
        api.on("/intensity/*", Answer({"data": ahead}))
        config = signal_config(
            feed="uk-carbon-intensity",
            base_url=api.url,
            refresh=timedelta(milliseconds=100),
            timeout=timedelta(milliseconds=200),
        )
        running = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(running.target) as client:
                subscription = client.subscribe()
                state = await asyncio.wait_for(anext(subscription), 5.0)
                if not state.HasField("value"):
                    state = await asyncio.wait_for(anext(subscription), 5.0)
                assert (state.value, state.high, state.source) == (430.0, True, "uk-carbon-intensity")
                points = await eventually(client.forecast)
                assert [p.value for p in points] == [420.0, 380.0]
                # The API states no error: each point reaches subscribers (and the planner) with the
                # calibration's, from its prior until the record has taught it (0 here: these
                # half hours are already past when the forecast is issued).
                assert [(p.error_source, p.HasField("expected_error")) for p in points] == [("prior", True)] * 2

                # The same half hour again is not stored again.
                polls = running.feed_stats.fetches
                await eventually(lambda: _at_least(running.feed_stats.fetches, polls + 3))
                assert len(await client.history()) == 1

                api.on("/intensity", Answer("{broken", status=200))
                errors = running.feed_stats.errors
                await eventually(lambda: _at_least(running.feed_stats.errors, errors + 2))
                assert (await client.get()).value == 430.0

                api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:30Z", 380, None)]}))
                # Each poll that answered 430 again told subscribers it still holds; then the new value.
                while (state := await asyncio.wait_for(anext(subscription), 5.0)).value == 430.0:
                    assert not state.stale
                assert (state.value, state.high) == (380.0, False)
                await subscription.aclose()
        finally:
            await running.stop()


async def test_a_new_forecast_is_streamed_to_subscribers_of_every_replica_and_only_when_new(
    database_url: str,
) -> None:
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 450, 430)]}))
        api.on("/intensity/*", Answer({"data": [uk_entry("2026-11-29T23:30Z", 420, None)]}))
        feeding = await start_signal_service(
            signal_config(feed="uk-carbon-intensity", base_url=api.url, refresh=timedelta(milliseconds=100)),
            database_url=database_url,
        )
        # Another replica, with no feed of its own and a long refresh: only NOTIFY brings the
        # forecast here in time.
        other = await start_signal_service(signal_config(refresh=timedelta(minutes=10)), database_url=database_url)
        try:
            async with SignalClient(other.target) as client:
                updates = client.updates()
                first = await asyncio.wait_for(_with_forecast(updates), 5.0)
                assert [p.value for p in first.forecast.points] == [420.0]
                assert first.forecast.source == "uk-carbon-intensity" and first.forecast.version >= 1

                # The feed is polled again and again and answers the same forecast: a change of
                # the value comes without it.
                polls = feeding.feed_stats.fetches
                await eventually(lambda: _at_least(feeding.feed_stats.fetches, polls + 3))
                manual = await client.set(100.0)
                while (update := await asyncio.wait_for(anext(updates), 5.0)).state.version < manual.version:
                    assert not update.HasField("forecast")
                assert not update.HasField("forecast")

                # A new forecast arrives as one, with the next version and the current state.
                api.on(
                    "/intensity/*",
                    Answer(
                        {"data": [uk_entry("2026-11-29T23:30Z", 300, None), uk_entry("2026-11-30T00:00Z", 90, None)]}
                    ),
                )
                renewed = await asyncio.wait_for(_with_forecast(updates), 5.0)
                assert [p.value for p in renewed.forecast.points] == [300.0, 90.0]
                assert renewed.forecast.version == first.forecast.version + 1
                assert renewed.state.version >= manual.version
                got = await client.forecast()
                assert [p.value for p in got] == [300.0, 90.0]
                await updates.aclose()
        finally:
            await other.stop()
            await feeding.stop()


async def _with_forecast(updates: AsyncIterator[signal_pb2.SubscribeResponse]) -> signal_pb2.SubscribeResponse:
    async for update in updates:
        if update.HasField("forecast"):
            return update
    raise AssertionError("the stream ended")


async def _at_least(value: int, wanted: int) -> bool:
    return value >= wanted


async def test_replay_feed_plays_the_bundled_trace(database_url: str) -> None:
    # One half-hour row every 50 ms.
    config = signal_config(feed="replay", replay_speed=36_000.0, replay_start="2020-06-01T12:00:00")
    running = await start_signal_service(config, database_url=database_url)
    try:
        async with SignalClient(running.target) as client:
            seen = set()
            async for state in client.subscribe():
                if state.HasField("value"):
                    assert state.source == "replay"
                    seen.add(state.value)
                if len(seen) >= 3:
                    break
            assert len(await client.history()) >= 3
            # The forecast (the default error model's) states its expected error at each point,
            # growing with the horizon; history points state none.
            points = await eventually(client.forecast)
            errors = [p.expected_error for p in points]
            assert all(p.HasField("expected_error") for p in points)
            assert 0 < errors[0] < 0.04 and 0.14 < errors[46] < 0.17
            assert errors == sorted(errors)
            assert not any(p.HasField("expected_error") for p in await client.history())
    finally:
        await running.stop()


async def test_one_replica_polls_the_feed_and_another_takes_over_when_it_stops(database_url: str) -> None:
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 200, 210)]}))
        api.on("/intensity/*", Answer({"data": []}))
        config = signal_config(feed="uk-carbon-intensity", base_url=api.url, refresh=timedelta(milliseconds=100))
        one = await start_signal_service(config, database_url=database_url)
        two = await start_signal_service(config, database_url=database_url)
        try:
            await eventually(lambda: _at_least(one.feed_stats.fetches + two.feed_stats.fetches, 5))
            polling = [r for r in (one, two) if r.feed_stats.fetches]
            assert len(polling) == 1
            leader, follower = (one, two) if polling[0] is one else (two, one)
            await leader.stop()
            # The stopping leader gives the lease up, so the follower starts within a poll or two.
            await eventually(lambda: _at_least(follower.feed_stats.fetches, 1), within=3.0)
        finally:
            for running in (one, two):
                await running.stop()


class FaultyOnceFeed:
    """A feed whose first poll fails with a bug of its own, not a FeedError."""

    source = "faulty-once"
    unit = "gCO2/kWh"
    has_forecast = True

    def __init__(self) -> None:
        self.calls = 0

    async def current(self) -> Reading:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug in the adapter")
        return Reading(123.0, datetime.now(UTC), self.unit)

    async def forecast(self) -> list[Point]:
        return []

    def interval(self, refresh: float) -> float:
        return 0.05

    async def aclose(self) -> None:
        return None


async def test_a_fault_in_an_adapter_is_counted_and_the_next_poll_recovers(database_url: str) -> None:
    running = await start_signal_service(signal_config(), database_url=database_url, feed=FaultyOnceFeed())
    try:
        async with SignalClient(running.target) as client:
            state = await eventually(lambda: _valued(client))
        assert state is not None
        assert (state.value, state.source) == (123.0, "faulty-once")
        assert running.feed_stats.errors == 1
    finally:
        await running.stop()


async def _valued(client: SignalClient) -> signal_pb2.SignalState | None:
    state = await client.get()
    return state if state.HasField("value") else None
