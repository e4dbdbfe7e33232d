"""The production planner plans on what the signal's calibration learned from the feed's record,
as the carbon bench's `replanned_learned` mode does: a bare UK forecast whose far points the
record shows to run 25 % high gets its bias taken out, and a held task is planned in the window
that is cheapest once it is, not in the one the raw forecast shows cheapest."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from lowtide.config import CostConfig
from lowtide_client import Client, SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2
from scheduler_service.server import start_scheduler
from signal_service.domain import Point, SignalForecast
from signal_service.feeds.base import HttpJson
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.server import start_signal_service
from tests.conftest import make_config
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, grid_api

HALF_HOUR = timedelta(minutes=30)
TRUTH = 300.0
# The record: a forecast issued every hour for three days of a day's swing around 300, right up
# to 6 hours ahead and 25 % high beyond (its bias there: 1 / 1.25 - 1 = -0.2).
RECORD_DAYS = 3
HIGH_FROM = timedelta(hours=6)


def _swing(at: datetime) -> float:
    return TRUTH + 60.0 * math.sin(2 * math.pi * (at.timestamp() / 86400))


def _uk(start: datetime, forecast: float, actual: float | None = None) -> dict[str, object]:
    stamp = "%Y-%m-%dT%H:%MZ"
    intensity = {"forecast": forecast, "actual": actual, "index": "moderate"}
    return {"from": start.strftime(stamp), "to": (start + HALF_HOUR).strftime(stamp), "intensity": intensity}


async def test_a_held_task_is_planned_with_the_feeds_learned_bias_taken_out(database_url: str) -> None:
    now = datetime.now(UTC)
    slot = now.replace(minute=30 * (now.minute // 30), second=0, microsecond=0)
    # Two dips: 150 two hours ahead (a lead the record shows unbiased), and 170 ten hours ahead
    # (a lead at which the feed forecast 25 % high): raw, the first is cheaper; with the bias
    # out, the second (about 140).
    near, far = slot + timedelta(hours=2), slot + timedelta(hours=10)
    dips = {near: 150.0, far: 170.0}
    flat = [_uk(slot + i * HALF_HOUR, TRUTH) for i in range(96)]
    dipped = [_uk(slot + i * HALF_HOUR, dips.get(slot + i * HALF_HOUR, TRUTH)) for i in range(96)]
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [_uk(slot, TRUTH, TRUTH)]}))
        api.on("/intensity/*", Answer({"data": flat}))
        feed = UkCarbonIntensity(HttpJson(api.url, timeout=2.0, backoff_initial=0.01, backoff_max=0.02))
        config = signal_config(refresh=timedelta(milliseconds=200), calibrate_every=timedelta(hours=1))
        signal = await start_signal_service(config, database_url=database_url, feed=feed)
        try:
            calibrations = signal.signals.calibrations
            assert calibrations is not None
            # The feed's record, as the service keeps it when it runs for days.
            start = slot - timedelta(days=RECORD_DAYS)
            for hour in range(RECORD_DAYS * 24):
                issued = start + timedelta(hours=hour)
                points = tuple(
                    Point(at, _swing(at) * (1.25 if i * HALF_HOUR >= HIGH_FROM else 1.0))
                    for i in range(1, 97)
                    for at in [issued + i * HALF_HOUR]
                )
                await calibrations.record_forecast(SignalForecast("grid", points, "uk-carbon-intensity", 0, issued))
            for i in range(RECORD_DAYS * 48):
                await calibrations.record_actual("grid", start + i * HALF_HOUR, _swing(start + i * HALF_HOUR))
            learned = await calibrations.learn("grid", datetime.now(UTC))
            assert learned.bias(timedelta(hours=10)) < -0.15
            # The feed issues its next forecast, with the two dips.
            api.on("/intensity/*", Answer({"data": dipped}))

            async with SignalClient(signal.target) as signals:

                async def stated() -> list[signal_pb2.SignalPoint] | None:
                    got = await signals.forecast()
                    return got if any(p.value == 170.0 for p in got) else None

                stated_points = await eventually(stated, within=15)
            assert stated_points is not None
            at_far = next(p for p in stated_points if p.at.ToDatetime(tzinfo=UTC) == far)
            assert at_far.bias < -0.15 and at_far.error_source.startswith("learned over")

            cost = CostConfig(defer_threshold=250.0, deferrable_activities=("train",))
            scheduler = await start_scheduler(
                replace(make_config(signal_target=signal.target), cost=cost), database_url=database_url
            )
            try:

                async def planned_on_it() -> bool:
                    forecast = scheduler.dispatcher.holds.forecast
                    return forecast is not None and forecast.end > far

                await eventually(planned_on_it, within=15)
                # How much of a point's error the next shares, as the record taught it: a full
                # pool weighs the error by it (None, unknown, would keep the whole caution).
                planned_on = scheduler.dispatcher.holds.forecast
                assert planned_on is not None
                assert planned_on.error_shared is not None and 0.0 <= planned_on.error_shared <= 1.0
                async with Client(scheduler.target) as client:
                    task = await client.submit(
                        "train",
                        "learned",
                        latest_start=slot + timedelta(hours=12),
                        estimated_duration=HALF_HOUR,
                    )
                    assert task.planned_release_at.ToDatetime(tzinfo=UTC) == far
                    # Corrected: about 170 x 0.82, under the near dip's 150.
                    assert task.planned_intensity < 150
                    explained = await client.explain(task.id)
                    assert "bias and error learned over" in explained.explanation
            finally:
                await scheduler.stop(grace=0.5)
        finally:
            await signal.stop(grace=0.5)
