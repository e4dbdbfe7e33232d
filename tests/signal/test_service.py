"""The signal service through its gRPC API, against a real PostgreSQL: high before the first
value, set and get, refused values, restarts, and several replicas on one database."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from lowtide.errors import ConfigError
from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.domain import MAX_SOURCE_CHARS, Point, Reading
from signal_service.server import SignalServer, start_signal_service
from signal_service.store import SignalStore
from tests.helpers import eventually
from tests.signal.conftest import signal_config


async def test_high_before_the_first_value(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        state = await client.get()
    assert state.name == "grid" and state.unit == "gCO2/kWh" and state.threshold == 400.0
    assert not state.HasField("value")
    assert state.high and not state.stale and state.version >= 1


async def test_set_then_get(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        before = await client.get()
        low = await client.set(120.0)
        got = await client.get()
        high = await client.set(520.0, unit="gCO2/kWh", source="test")
    assert (low.value, low.high, low.source) == (120.0, False, "manual")
    assert got == low
    assert low.version > before.version
    assert (high.value, high.high, high.source) == (520.0, True, "test")
    assert high.version > low.version


async def test_the_threshold_itself_is_not_high(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        state = await client.set(400.0)
    assert not state.high


@pytest.mark.parametrize(
    ("value", "unit", "field"),
    [
        (math.nan, "", "value"),
        (math.inf, "", "value"),
        (-math.inf, "", "value"),
        (-1.0, "", "value"),
        (300.0, "lbs/MWh", "unit"),
    ],
)
async def test_bad_values_are_refused_and_change_nothing(
    signal_server: SignalServer, value: float, unit: str, field: str
) -> None:
    async with SignalClient(signal_server.target) as client:
        good = await client.set(250.0)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.set(value, unit=unit)
        after = await client.get()
        history = await client.history()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(f"{field}:")
    assert after == good
    assert [p.value for p in history] == [250.0]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("op\x00erator", "source: contains the control character U+0000"),
        ("line\nbreak", "source: contains the control character U+000A"),
        ("x" * 201, "source: is 201 characters long; at most 200"),
    ],
)
async def test_a_bad_source_is_refused_and_changes_nothing(
    signal_server: SignalServer, source: str, expected: str
) -> None:
    async with SignalClient(signal_server.target) as client:
        good = await client.set(250.0)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.set(300.0, source=source)
        after = await client.get()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == expected
    assert after == good


async def test_a_price_signal_may_go_negative(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        state = await client.set(-12.5, name="price")
        signals = await client.list()
    assert (state.value, state.unit, state.high) == (-12.5, "EUR/MWh", False)
    assert [s.name for s in signals] == ["grid", "price"]


async def test_unknown_signal_is_not_found(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        for call in (client.get("nope"), client.set(1.0, name="nope")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "grid" in (caught.value.details() or "")
        stream = client.subscribe("nope")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anext(stream)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_history_keeps_recent_values_oldest_first(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        for value in (100.0, 200.0, 300.0):
            await client.set(value)
        assert [p.value for p in await client.history()] == [100.0, 200.0, 300.0]
        assert [p.value for p in await client.history(limit=2)] == [200.0, 300.0]
        assert await client.forecast() == []


async def test_a_restart_resumes_the_last_value(database_url: str) -> None:
    first = await start_signal_service(signal_config(), database_url=database_url)
    async with SignalClient(first.target) as client:
        stored = await client.set(321.0)
    await first.stop()
    second = await start_signal_service(signal_config(), database_url=database_url)
    try:
        async with SignalClient(second.target) as client:
            resumed = await client.get()
            subscription = client.subscribe()
            first_seen = await anext(subscription)
            await subscription.aclose()
    finally:
        await second.stop()
    assert resumed == stored == first_seen


async def test_a_restart_resumes_the_forecast_in_the_first_message_and_in_get_forecast(database_url: str) -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    points = [Point(at, 300.0), Point(at + timedelta(minutes=30), 120.0)]
    first = await start_signal_service(signal_config(), database_url=database_url)
    issued = await first.signals.set_forecast("grid", points, source="replay")
    await first.stop()
    assert issued is not None and issued.version >= 1
    second = await start_signal_service(signal_config(), database_url=database_url)
    try:
        async with (
            SignalClient(second.target) as client,
            grpc.aio.insecure_channel(second.target) as channel,
        ):
            updates = client.updates()
            opening = await anext(updates)
            await updates.aclose()
            # GetForecast's version and issue time, which the client's forecast() leaves out.
            got = await signal_pb2_grpc.SignalServiceStub(channel).GetForecast(signal_pb2.GetForecastRequest())
    finally:
        await second.stop()
    assert [(p.value, p.at.ToDatetime(tzinfo=UTC)) for p in opening.forecast.points] == [
        (300.0, at),
        (120.0, at + timedelta(minutes=30)),
    ]
    assert (opening.forecast.version, opening.forecast.source) == (issued.version, "replay")
    assert (got.version, got.source, [p.value for p in got.points]) == (issued.version, "replay", [300.0, 120.0])
    assert got.issued_at.ToDatetime(tzinfo=UTC) == opening.forecast.issued_at.ToDatetime(tzinfo=UTC) == issued.issued_at


async def test_an_old_value_is_marked_stale_and_subscribers_are_told(database_url: str) -> None:
    running = await start_signal_service(
        signal_config(stale_after=timedelta(milliseconds=300)), database_url=database_url
    )
    try:
        async with SignalClient(running.target) as client:
            subscription = client.subscribe()
            assert not (await anext(subscription)).HasField("value")
            await client.set(150.0)
            fresh = await anext(subscription)
            stale = await asyncio.wait_for(anext(subscription), 5.0)
            again = await client.set(160.0)
            await subscription.aclose()
    finally:
        await running.stop()
    assert (fresh.value, fresh.stale) == (150.0, False)
    assert (stale.value, stale.stale) == (150.0, True) and stale.version > fresh.version
    assert not again.stale


async def test_two_replicas_see_each_others_changes_within_a_second(database_url: str) -> None:
    # A long refresh and stale_after: only LISTEN/NOTIFY can deliver the change in time.
    config = signal_config(refresh=timedelta(minutes=10))
    one = await start_signal_service(config, database_url=database_url)
    two = await start_signal_service(config, database_url=database_url)
    try:
        async with SignalClient(one.target) as writer, SignalClient(two.target) as reader:
            subscription = reader.subscribe()
            await anext(subscription)
            loop = asyncio.get_running_loop()
            for value in (510.0, 90.0):
                started = loop.time()
                written = await writer.set(value)
                seen = await asyncio.wait_for(anext(subscription), 1.0)
                assert loop.time() - started < 1.0
                assert (seen.value, seen.version, seen.high) == (value, written.version, written.high)
            await subscription.aclose()
    finally:
        await one.stop()
        await two.stop()


SETS = 600


async def test_a_subscriber_that_never_reads_does_not_delay_the_others(signal_server: SignalServer) -> None:
    # The stuck subscriber is a raw stream nobody reads, on a channel with a fixed 64 KiB flow
    # control window (no BDP probing), so the server's writer for it blocks once some 250 of
    # these states (a source of the longest allowed, 200 characters) fill it, and stays blocked.
    options = [("grpc.http2.bdp_probe", 0)]
    async with (
        grpc.aio.insecure_channel(signal_server.target, options=options) as channel,
        SignalClient(signal_server.target) as client,
    ):
        stuck = signal_pb2_grpc.SignalServiceStub(channel).Subscribe(signal_pb2.SubscribeRequest())
        live = client.subscribe()
        await anext(live)
        source = "x" * MAX_SOURCE_CHARS
        # A fan-out that waited on the stuck stream would stop for good once its window filled
        # (nobody ever reads it): the live subscriber would then get nothing more, and the
        # bound (generous for a loaded machine) would run out.
        for i in range(1, SETS + 1):
            value = float(i)
            await client.set(value, source=source)
            while (await asyncio.wait_for(anext(live), 10.0)).value != value:
                pass
        # The stuck subscriber skipped states, but the last one waits in its slot.
        waiting = [s.pending for s in signal_server.signals.fanout.subscriptions("grid")]
        assert len(waiting) == 2
        assert [w.value for w in waiting if w is not None] == [float(SETS)]
        stuck.cancel()
        await live.aclose()
    await eventually(lambda: _no_subscribers(signal_server))


async def _no_subscribers(server: SignalServer) -> bool:
    return server.signals.fanout.subscriber_count == 0


async def test_stopping_ends_subscriptions_with_unavailable_at_once(database_url: str) -> None:
    running = await start_signal_service(signal_config(), database_url=database_url)
    async with SignalClient(running.target) as client:
        subscription = client.subscribe()
        await anext(subscription)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await running.stop(grace=5.0)
        assert loop.time() - started < 1.0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anext(subscription)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_taken_port_is_a_config_error(signal_server: SignalServer, database_url: str) -> None:
    with pytest.raises(ConfigError, match=r"\[signal\] listen"):
        await start_signal_service(signal_config(listen=signal_server.target), database_url=database_url)


async def test_history_is_trimmed_to_the_last_versions(database_url: str) -> None:
    running = await start_signal_service(signal_config(), database_url=database_url)
    store = SignalStore(running.db, history_versions=3)
    try:
        for value in range(1, 8):
            await store.record("grid", Reading(float(value), datetime.now(UTC), "gCO2/kWh"), source="test")
        kept = await store.history("grid", since=None, limit=100)
    finally:
        await running.stop()
    assert [p.value for p in kept] == [5.0, 6.0, 7.0]


async def test_a_reconnecting_subscriber_follows_a_restart(database_url: str) -> None:
    first = await start_signal_service(signal_config(), database_url=database_url)
    target = first.target
    async with SignalClient(target) as client:
        subscription = client.subscribe(reconnect=True)
        assert not (await anext(subscription)).HasField("value")
        await client.set(100.0)
        assert (await anext(subscription)).value == 100.0
        await first.stop()
        second = await start_signal_service(signal_config(listen=target), database_url=database_url)
        try:
            await client.set(200.0)
            # The state it resumes with (100, already seen) is skipped: the next one is new.
            assert (await asyncio.wait_for(anext(subscription), 10.0)).value == 200.0
            await subscription.aclose()
        finally:
            await second.stop()


async def test_metrics_show_the_signal_and_its_subscribers(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        await client.set(520)
        stream = client.subscribe()
        await anext(stream)
        assert signal_server.metrics is not None
        text = signal_server.metrics.text()
        await stream.aclose()
    assert 'lowtide_signal_value{signal="grid",unit="gCO2/kWh"} 520.0' in text
    assert 'lowtide_signal_high{signal="grid",unit="gCO2/kWh"} 1.0' in text
    assert "lowtide_signal_subscribers 1.0" in text
