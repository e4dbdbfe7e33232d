"""Electricity Maps' and WattTime's forecasts state no error; through lowtide each point reaches
GetForecast, and the planner, with one and its source: the prior until the signal's record has
taught it, then the error learned over the days it spans. Against local servers answering each
provider's documented forecast shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from lowtide.config import CostConfig
from lowtide_client import SignalClient
from scheduler_service.server import start_scheduler
from signal_service.domain import Point, SignalForecast
from signal_service.feeds.base import Feed, HttpJson
from signal_service.feeds.electricitymaps import ElectricityMaps
from signal_service.feeds.watttime import WattTime
from signal_service.server import start_signal_service
from tests.conftest import make_config
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, GridApi, grid_api

HALF_HOUR = timedelta(minutes=30)
RECORD_DAYS = 3


def _http(api: GridApi) -> HttpJson:
    return HttpJson(api.url, timeout=2.0, backoff_initial=0.01, backoff_max=0.02)


def electricity_maps(api: GridApi, now: datetime) -> Feed:
    """`/v3/carbon-intensity/latest` and `/forecast`: hourly points for the next 24 hours."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    stamp = "%Y-%m-%dT%H:%M:%S.000Z"
    api.on(
        "/v3/carbon-intensity/latest",
        Answer({"zone": "DE", "carbonIntensity": 302, "datetime": hour.strftime(stamp), "isEstimated": True}),
    )
    forecast = [
        {"carbonIntensity": 300 + 5 * i, "datetime": (hour + timedelta(hours=i)).strftime(stamp)} for i in range(1, 25)
    ]
    api.on(
        "/v3/carbon-intensity/forecast", Answer({"zone": "DE", "forecast": forecast, "updatedAt": hour.strftime(stamp)})
    )
    return ElectricityMaps(_http(api), zone="DE", token="secret")


def watttime(api: GridApi, now: datetime) -> Feed:
    """`/login` and `/v3/forecast` (co2_moer): 5-minute points for the next 24 hours, the first
    for the current five minutes."""
    start = now.replace(minute=5 * (now.minute // 5), second=0, microsecond=0)
    data = [{"point_time": (start + i * timedelta(minutes=5)).isoformat(), "value": 900.0 + i} for i in range(288)]
    meta = {
        "data_point_period_seconds": 300,
        "region": "CAISO_NORTH",
        "warnings": [],
        "signal_type": "co2_moer",
        "model": {"date": "2023-03-01"},
        "units": "lbs_co2_per_mwh",
        "generated_at_period_seconds": 300,
        "generated_at": start.isoformat(),
    }
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", Answer({"data": data, "meta": meta}))
    return WattTime(_http(api), username="me", password="pw", region="CAISO_NORTH", signal="moer")


@pytest.mark.parametrize("provider", [electricity_maps, watttime], ids=["electricitymaps", "watttime"])
async def test_each_forecast_point_states_an_error_and_its_source(
    database_url: str, provider: Callable[[GridApi, datetime], Feed]
) -> None:
    now = datetime.now(UTC)
    with grid_api() as api:
        feed = provider(api, now)
        config = signal_config(refresh=timedelta(milliseconds=200), calibrate_every=timedelta(hours=1))
        signal = await start_signal_service(config, database_url=database_url, feed=feed)
        try:
            async with SignalClient(signal.target) as client:
                points = await eventually(client.forecast, within=15)
                assert len(points) > 20
                # The provider states none: each point states the prior's, and says so.
                assert all(p.HasField("expected_error") and p.expected_error > 0 for p in points)
                assert {p.error_source for p in points} == {"prior"}

                # And the planner weighs every point ahead by it.
                cost = CostConfig(defer_threshold=1e6, deferrable_activities=("train",))
                scheduler = await start_scheduler(
                    replace(make_config(signal_target=signal.target), cost=cost), database_url=database_url
                )
                try:

                    async def planned_on() -> bool:
                        forecast = scheduler.dispatcher.holds.forecast
                        return forecast is not None and len(forecast.values) > 20

                    await eventually(planned_on, within=15)
                    forecast = scheduler.dispatcher.holds.forecast
                    assert forecast is not None
                    # The first point is the current value, known; every one after it has a spread.
                    assert all(s > 0 for s in forecast.spreads[1:]), forecast.spreads
                finally:
                    await scheduler.stop(grace=0.5)

                # Days of the provider's forecasts (off by 5 % either way) and the values that came,
                # as the service keeps them: each point states what was learned, over how long.
                calibrations = signal.signals.calibrations
                assert calibrations is not None
                start = now - timedelta(days=RECORD_DAYS)
                for hour in range(RECORD_DAYS * 24):
                    issued = start + timedelta(hours=hour)
                    made = tuple(
                        Point(issued + i * HALF_HOUR, 300.0 * (1.05 if (hour + i) % 2 else 0.95)) for i in range(1, 97)
                    )
                    await calibrations.record_forecast(SignalForecast("grid", made, feed.source, 0, issued))
                for i in range(RECORD_DAYS * 48):
                    await calibrations.record_actual("grid", start + i * HALF_HOUR, 300.0)
                await calibrations.learn("grid", datetime.now(UTC))
                learned = await client.forecast()
                # Every point states an error; all but those under half an hour ahead (a lead the
                # record has no points at) say it was learned over the record's days.
                assert all(p.expected_error > 0 for p in learned)
                sources = [p.error_source for p in learned]
                assert set(sources) <= {"prior", "learned over 3.0 days", "learned over 2.9 days"}, set(sources)
                assert sources.count("prior") < 0.1 * len(sources) and sources[-1] != "prior", sources
                ahead = [p.expected_error for p in learned if p.error_source != "prior"]
                # The record's forecasts were 5 % off either way: about that.
                assert all(0.03 < e < 0.1 for e in ahead), ahead
        finally:
            await signal.stop(grace=0.5)
