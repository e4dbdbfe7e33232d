"""Fan-out without a server: the latest state (and forecast) per subscriber, newer versions only, cleanup."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from signal_service.domain import Point, SignalForecast, SignalState
from signal_service.fanout import Closed, Fanout, Update


def state(version: int, value: float | None = 1.0, name: str = "grid") -> SignalState:
    return SignalState(name, "gCO2/kWh", 400.0, value, None, "test", version, False)


async def test_a_subscriber_starts_with_the_current_state() -> None:
    fanout = Fanout()
    fanout.publish(state(3))
    with fanout.subscribe("grid") as subscription:
        assert await subscription.next() == Update(state(3), None)


async def test_a_slow_subscriber_skips_to_the_latest_and_never_loses_it() -> None:
    fanout = Fanout()
    with fanout.subscribe("grid") as slow, fanout.subscribe("grid") as fast:
        for version in range(1, 6):
            fanout.publish(state(version, float(version)))
            assert (await fast.next()).state.version == version
        assert await slow.next() == Update(state(5, 5.0), None)
        assert slow.pending is None


async def test_older_or_repeated_versions_are_dropped() -> None:
    fanout = Fanout()
    assert fanout.publish(state(2))
    assert not fanout.publish(state(2))
    assert not fanout.publish(state(1))
    assert fanout.latest("grid") == state(2)


async def test_subscribers_only_get_their_signal_and_are_removed_on_exit() -> None:
    fanout = Fanout()
    with fanout.subscribe("grid") as grid:
        with fanout.subscribe("price"):
            fanout.publish(state(1, name="price"))
            assert fanout.subscriber_count == 2
        waiter = asyncio.ensure_future(grid.next())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        fanout.publish(state(1))
        assert (await waiter).state.name == "grid"
    assert fanout.subscriber_count == 0
    assert fanout.subscriptions("grid") == ()


async def test_closing_ends_current_and_later_subscriptions() -> None:
    fanout = Fanout()
    fanout.publish(state(1))
    with fanout.subscribe("grid") as subscription:
        await subscription.next()
        fanout.close()
        with pytest.raises(Closed):
            await subscription.next()
    with fanout.subscribe("grid") as late, pytest.raises(Closed):
        await late.next()


async def test_a_read_cancelled_while_waiting_loses_nothing_and_delays_nobody() -> None:
    fanout = Fanout()
    with fanout.subscribe("grid") as interrupted, fanout.subscribe("grid") as other:
        waiting = asyncio.ensure_future(interrupted.next())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        fanout.publish(state(1))
        assert (await asyncio.wait_for(other.next(), 1.0)).state == state(1)
        # The change published after the cancelled read waits in the slot for the next one.
        assert (await asyncio.wait_for(interrupted.next(), 1.0)).state == state(1)


def forecast(version: int, *values: float, name: str = "grid") -> SignalForecast:
    at = datetime(2026, 11, 30, tzinfo=UTC)
    points = tuple(Point(at + timedelta(minutes=30 * i), v) for i, v in enumerate(values))
    return SignalForecast(name, points, "replay", version, at)


async def test_the_forecast_comes_first_with_the_state_then_only_when_new() -> None:
    fanout = Fanout()
    fanout.publish(state(1))
    fanout.publish_forecast(forecast(1, 300.0, 200.0))
    with fanout.subscribe("grid") as subscription:
        assert await subscription.next() == Update(state(1), forecast(1, 300.0, 200.0))
        # A change of the value alone does not send the forecast again.
        fanout.publish(state(2))
        assert await subscription.next() == Update(state(2), None)
        # A new forecast alone comes with the current state.
        fanout.publish_forecast(forecast(2, 100.0))
        assert await subscription.next() == Update(state(2), forecast(2, 100.0))


async def test_a_slow_subscriber_gets_the_latest_state_and_the_latest_forecast_together() -> None:
    fanout = Fanout()
    fanout.publish(state(1))
    with fanout.subscribe("grid") as slow:
        await slow.next()
        fanout.publish_forecast(forecast(1, 300.0))
        fanout.publish(state(2))
        fanout.publish_forecast(forecast(2, 250.0))
        fanout.publish(state(3))
        assert await slow.next() == Update(state(3), forecast(2, 250.0))
        waiter = asyncio.ensure_future(slow.next())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        waiter.cancel()


async def test_older_or_repeated_forecasts_are_dropped_and_a_forecast_waits_for_a_state() -> None:
    fanout = Fanout()
    assert fanout.publish_forecast(forecast(2, 1.0))
    assert not fanout.publish_forecast(forecast(2, 5.0))
    assert not fanout.publish_forecast(forecast(1, 5.0))
    assert fanout.forecast("grid") == forecast(2, 1.0)
    with fanout.subscribe("grid") as subscription:
        # No state stored yet: nothing to send, the forecast waits beside the slot.
        waiter = asyncio.ensure_future(subscription.next())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        fanout.publish(state(1))
        assert await asyncio.wait_for(waiter, 1.0) == Update(state(1), forecast(2, 1.0))
