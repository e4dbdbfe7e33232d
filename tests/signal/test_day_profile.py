"""The day profile through the signal service: a feed whose forecasts miss the day's shape is
learned with one, and the scheduler gets it on the wire; a replayed feed, whose times are
rescaled, has none (its time of day is not its record's)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from lowtide.db import Database
from signal_service.api import calibration_message
from signal_service.calibration import Calibrations
from signal_service.domain import Point, SignalForecast

DAYS = 8


def _value(k: int) -> float:
    """Half hour k of a grid's day: low at night, high in the evening."""
    return 200 + 80 * math.sin(2 * math.pi * (k - 30) / 48)


async def _flat_forecasts(calibrations: Calibrations, name: str, end: datetime, step: timedelta) -> None:
    """DAYS days of values a `step` apart (a half hour of the feed's), and every other step a
    forecast that puts the present value on every point of the day ahead."""
    start = end - DAYS * 48 * step
    for k in range(DAYS * 48):
        at = start + k * step
        await calibrations.record_actual(name, at, _value(k))
        if k % 2 == 0:
            points = tuple(Point(at + i * step, _value(k)) for i in range(1, 49))
            await calibrations.record_forecast(SignalForecast(name, points, "recorded", 0, at))


async def test_a_live_feed_learns_the_day_profile_and_a_replayed_one_does_not(database_url: str) -> None:
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        now = datetime.now(UTC).replace(second=0, microsecond=0)
        calibrations = Calibrations(db, scales={"replayed": 60.0})
        await _flat_forecasts(calibrations, "live", now, timedelta(minutes=30))
        await _flat_forecasts(calibrations, "replayed", now, timedelta(seconds=30))
        live = await calibrations.learn("live", now)
        assert len(live.profile) == 48 and max(live.profile_share) > 0.5
        message = calibration_message(live, lead_scale=1.0)
        assert list(message.day_profile) == list(live.profile)
        assert max(b.profile_share for b in message.buckets) > 0.5
        replayed = await calibrations.learn("replayed", now)
        # The replay's record teaches the same follow; only the profile is left out.
        assert replayed.follow and not replayed.profile and not replayed.profile_share
        assert not calibration_message(replayed, lead_scale=60.0).day_profile
    finally:
        await db.close()
