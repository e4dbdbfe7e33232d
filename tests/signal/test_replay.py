"""The replay feed: position from elapsed time and speed, looping, the bundled trace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from lowtide.errors import ConfigError
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.domain import Point
from signal_service.feeds.replay import Replay, load_trace, read_trace
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config

T0 = datetime(2020, 1, 1, tzinfo=UTC)
TRACE = [Point(T0 + timedelta(minutes=30 * i), v) for i, v in enumerate([100.0, 200.0, 300.0])]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_plays_at_speed_and_loops() -> None:
    clock = Clock()
    # 1800x: one half-hour row per second.
    replay = Replay(TRACE, speed=1800.0, clock=clock)
    seen = []
    for _ in range(7):
        seen.append((await replay.current()).value)
        clock.now += 1.0
    assert seen == [100.0, 200.0, 300.0, 100.0, 200.0, 300.0, 100.0]
    assert replay.interval(60.0) == 1.0


async def test_starts_where_told_and_holds_the_last_value_without_looping() -> None:
    clock = Clock()
    replay = Replay(TRACE, speed=1800.0, start=T0 + timedelta(minutes=30), loop=False, clock=clock)
    assert (await replay.current()).value == 200.0
    clock.now += 10.0
    assert (await replay.current()).value == 300.0
    assert [p.value for p in await replay.forecast()] == []


async def test_forecast_is_the_trace_ahead_in_wall_clock_time() -> None:
    replay = Replay(TRACE, speed=1800.0, clock=Clock())
    points = await replay.forecast()
    assert [p.value for p in points[:4]] == [200.0, 300.0, 100.0, 200.0]
    gap = points[1].at - points[0].at
    assert abs(gap.total_seconds() - 1.0) < 0.01


def test_the_bundled_trace_loads() -> None:
    trace = load_trace()
    assert len(trace) > 17_000
    assert trace[0].at == datetime(2019, 12, 20, tzinfo=UTC)
    assert all(p.value >= 0 for p in trace)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("when,what\n2020-01-01,1\n", "header"),
        ("Time,Carbon Intensity\n2020-01-01 00:00:00,abc\n", "line 2"),
        ("Time,Carbon Intensity\n2020-01-01 00:00:00,1\n", "two rows"),
    ],
)
def test_a_bad_trace_is_refused_with_the_line_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_trace(text, where="t.csv")


def test_a_start_outside_the_trace_is_refused() -> None:
    with pytest.raises(ConfigError, match="replay_start"):
        Replay(TRACE, speed=1.0, start=T0 - timedelta(days=1))


def test_a_price_trace_is_read_negative_prices_and_all() -> None:
    points = read_trace("Time,Price\n2026-12-04T11:00:00Z,-12.5\n2026-12-04T12:00:00Z,40\n", where="p.csv")
    assert [(p.at.hour, p.value) for p in points] == [(11, -12.5), (12, 40.0)]


async def test_a_new_forecast_is_issued_at_each_row_across_laps() -> None:
    clock = Clock()
    replay = Replay(TRACE, speed=1800.0, clock=clock)
    issues = []
    for _ in range(5):
        issues.append(replay.forecast_issue())
        clock.now += 1.0
    # One half-hour row per second: each poll a row later is a new forecast, lap after lap.
    assert issues == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


async def test_the_service_stores_the_replays_forecast_at_each_row_whatever_the_refresh(database_url: str) -> None:
    # A row every half second, a refresh of an hour: the 48 h forecast covers 48 s of the clock,
    # so a forecast asked for only every refresh would be long past before the next.
    config = signal_config(feed="replay", replay_speed=3600.0, refresh=timedelta(hours=1))
    running = await start_signal_service(config, database_url=database_url)
    try:
        async with grpc.aio.insecure_channel(running.target) as channel:
            stub = signal_pb2_grpc.SignalServiceStub(channel)

            async def renewed() -> signal_pb2.GetForecastResponse | None:
                response = await stub.GetForecast(signal_pb2.GetForecastRequest())
                return response if response.version >= 4 else None

            response = await eventually(renewed, within=20)
            assert response is not None
            # Issued at the row the replay is in: its first point is the next row, ahead of now.
            first = response.points[0].at.ToDatetime(tzinfo=UTC)
            assert timedelta(0) <= first - response.issued_at.ToDatetime(tzinfo=UTC) <= timedelta(seconds=1)
    finally:
        await running.stop()
