"""The replay feed's forecast: 48 hours of the trace ahead, with the configured error model (by
default an error growing with the horizon), stable between polls within a row and drawn afresh
at the next row."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import pytest

from lowtide.config import load_config
from lowtide.errors import ConfigError
from lowtide.forecast_error import HorizonError, IidError
from signal_service.domain import Point
from signal_service.feeds import make_feed
from signal_service.feeds.replay import Replay

T0 = datetime(2020, 1, 1, tzinfo=UTC)
# A week of half-hourly rows, 100 to 435.
TRACE = [Point(T0 + timedelta(minutes=30 * i), 100.0 + i) for i in range(336)]
SPEED = 1800.0  # one half-hour row per second


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_without_error_the_forecast_is_the_trace_ahead_for_48_hours() -> None:
    replay = Replay(TRACE, speed=SPEED, clock=Clock())
    points = await replay.forecast()
    assert [p.value for p in points] == [101.0 + i for i in range(95)]
    # 48 trace hours at 1800x are 96 wall-clock seconds.
    assert (points[-1].at - points[0].at).total_seconds() == pytest.approx(94, abs=0.1)


async def test_with_error_the_forecast_is_near_the_trace_but_not_it() -> None:
    clock = Clock()
    replay = Replay(TRACE, speed=SPEED, forecast_model=IidError(0.05), clock=clock)
    points = await replay.forecast()
    errors = [p.value / (101.0 + i) - 1 for i, p in enumerate(points)]
    assert len(points) == 95
    assert all(e != 0 for e in errors)
    assert 0.03 < statistics.pstdev(errors) < 0.07
    assert abs(statistics.fmean(errors)) < 0.02
    # Polled again within the same row: the same forecast (times move with the wall clock).
    clock.now += 0.5
    assert [p.value for p in await replay.forecast()] == [p.value for p in points]
    # At the next row a new forecast is issued: new errors for the same rows.
    clock.now += 0.5
    again = await replay.forecast()
    assert again[0].value != points[1].value
    assert [p.value for p in again] != [p.value for p in points[1:]]


async def test_the_same_start_forecasts_the_same() -> None:
    first = Replay(TRACE, speed=SPEED, forecast_model=IidError(0.05), clock=Clock())
    second = Replay(TRACE, speed=SPEED, forecast_model=IidError(0.05), clock=Clock())
    assert [p.value for p in await first.forecast()] == [p.value for p in await second.forecast()]


async def test_the_default_error_grows_with_the_horizon_and_each_point_states_it() -> None:
    replay = make_feed(load_config(env={"LOWTIDE_SIGNAL_FEED": "replay"}).signal)
    assert isinstance(replay, Replay)
    replay = Replay(TRACE, speed=SPEED, forecast_model=HorizonError(), clock=Clock())
    points = await replay.forecast()
    assert [p.expected_error for p in points[:2]] == pytest.approx([0.015, 0.03])
    assert points[47].expected_error == pytest.approx(0.15)
    # Over many forecasts the error one hour ahead is about 3 %, a day ahead about 15 %.
    near, far = [], []
    clock = Clock()
    replay = Replay(TRACE, speed=SPEED, forecast_model=HorizonError(), clock=clock)
    for _ in range(200):
        points = await replay.forecast()
        row = int(clock.now - 1000.0) % len(TRACE)
        near.append(points[1].value / TRACE[(row + 2) % len(TRACE)].value - 1)
        far.append(points[46].value / TRACE[(row + 47) % len(TRACE)].value - 1)
        clock.now += 1.0
    assert 0.015 < statistics.pstdev(near) < 0.05
    assert 0.10 < statistics.pstdev(far) < 0.22


def test_the_error_is_configured_under_signal() -> None:
    assert load_config(env={}).signal.replay_forecast_error == 0.05
    assert load_config(env={}).signal.replay_forecast_model == "horizon"
    config = load_config(env={"LOWTIDE_SIGNAL_FEED": "replay", "LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR": "0"})
    assert config.signal.replay_forecast_error == 0.0
    assert isinstance(make_feed(config.signal), Replay)
    bad = {"LOWTIDE_SIGNAL_FEED": "replay", "LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR_1H": "0.2"}
    with pytest.raises(ConfigError, match="replay_forecast_error_1h"):
        make_feed(load_config(env=bad).signal)
    with pytest.raises(ConfigError, match="replay_forecast_model"):
        load_config(env={"LOWTIDE_SIGNAL_REPLAY_FORECAST_MODEL": "perfect"})
    with pytest.raises(ConfigError, match="replay_forecast_error"):
        load_config(env={"LOWTIDE_SIGNAL_FEED": "replay", "LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR": "-0.1"})
