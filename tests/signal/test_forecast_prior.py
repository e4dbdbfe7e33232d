"""The forecast error prior (`[signal] forecast_error_prior_1h` / `_24h`, and per
`[signals.NAME]`): a bare feed's points state it until the record says otherwise, and the
stated error moves from it toward the record's as forecasts come."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lowtide.config import SignalDefinition
from lowtide.db import Database
from lowtide.forecast_calibration import Calibration
from lowtide.forecast_error import HorizonError
from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2
from signal_service.calibration import Calibrations
from signal_service.domain import Point, SignalForecast
from signal_service.feeds.base import HttpJson
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, grid_api

HALF_HOUR = timedelta(minutes=30)
TRUTH = 300.0
GRID = HorizonError(0.1, 0.4)
DE = HorizonError(0.1, 0.25)


def _uk(start: datetime, forecast: float, actual: float | None = None) -> dict[str, object]:
    stamp = "%Y-%m-%dT%H:%MZ"
    intensity = {"forecast": forecast, "actual": actual, "index": "moderate"}
    return {"from": start.strftime(stamp), "to": (start + HALF_HOUR).strftime(stamp), "intensity": intensity}


def _a_day_ahead(points: list[signal_pb2.SignalPoint]) -> signal_pb2.SignalPoint:
    """The first point at least a day and half an hour after the first (a lead of 24 to 30 h
    from any issue time in the first half hour)."""
    first = points[0].at.ToDatetime()
    return next(p for p in points if p.at.ToDatetime() - first >= timedelta(hours=24, minutes=30))


async def _record(calibrations: Calibrations, start: datetime, forecasts: int, days: int) -> None:
    """`forecasts` perfect forecasts, one an hour from `start`, and `days` of values from it."""
    for hour in range(forecasts):
        issued = start + timedelta(hours=hour)
        points = tuple(Point(issued + i * HALF_HOUR, TRUTH) for i in range(1, 97))
        await calibrations.record_forecast(SignalForecast("grid", points, "uk-carbon-intensity", 0, issued))
    for i in range(days * 48):
        await calibrations.record_actual("grid", start + i * HALF_HOUR, TRUTH)


async def test_points_state_the_configured_prior_then_blend_toward_the_record(database_url: str) -> None:
    now = datetime.now(UTC)
    slot = now.replace(minute=30 * (now.minute // 30), second=0, microsecond=0)
    forecast = [_uk(slot + i * HALF_HOUR, TRUTH + i) for i in range(96)]
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [_uk(slot, TRUTH, TRUTH)]}))
        api.on("/intensity/*", Answer({"data": forecast}))
        feed = UkCarbonIntensity(HttpJson(api.url, timeout=2.0, backoff_initial=0.01, backoff_max=0.02))
        de = SignalDefinition(feed="uk-carbon-intensity", base_url=api.url, forecast_error_prior_24h=0.25)
        config = signal_config(
            {"de": de},
            refresh=timedelta(milliseconds=200),
            calibrate_every=timedelta(hours=1),
            forecast_error_prior_1h=0.1,
            forecast_error_prior_24h=0.4,
        )
        server = await start_signal_service(config, database_url=database_url, feed=feed)
        try:
            async with SignalClient(server.target) as client:
                grid = await eventually(client.forecast, within=15)
                own = await eventually(lambda: client.forecast("de"), within=15)
                # A day ahead, each signal states its own prior, as the prior.
                low, high = timedelta(hours=24), timedelta(hours=30)
                for points, model in ((grid, GRID), (own, DE)):
                    point = _a_day_ahead(points)
                    assert point.error_source == "prior"
                    assert model.stddev(low) <= point.expected_error <= model.stddev(high), point
                prior = _a_day_ahead(grid).expected_error

                calibrations = server.signals.calibrations
                assert calibrations is not None
                # A few perfect forecasts: the stated error moves toward 0, still mostly the prior's.
                await _record(calibrations, slot - timedelta(days=2), forecasts=4, days=2)
                await calibrations.learn("grid", datetime.now(UTC))
                few = _a_day_ahead(await client.forecast())
                assert 0.5 * prior < few.expected_error < 0.8 * prior, few
                # Many: mostly the record's.
                await _record(calibrations, slot - timedelta(days=4), forecasts=72, days=4)
                await calibrations.learn("grid", datetime.now(UTC))
                many = _a_day_ahead(await client.forecast())
                assert many.expected_error < 0.15 * prior, many
                assert many.error_source.startswith("learned over")
                # The other signal's record is its own: still its prior.
                assert _a_day_ahead(await client.forecast("de")).error_source == "prior"
        finally:
            await server.stop()


async def test_a_learning_stored_after_a_later_one_does_not_replace_it(database_url: str) -> None:
    """Two learnings at once (this replica's slow one, another's): the later one's, stored first,
    is what this replica states, not the one that finished last but learned up to an earlier time."""
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        calibrations = Calibrations(db)
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        await _record(calibrations, now - timedelta(days=4), forecasts=72, days=4)
        await calibrations.learn("grid", now)
        # Learned up to four days ago: nothing yet, all prior; refused, as older than the stored one.
        await calibrations.learn("grid", now - timedelta(days=4))
        assert calibrations.current("grid", now).learned(timedelta(hours=24))
    finally:
        await db.close()


async def test_a_record_grown_while_learning_is_learned_again_at_the_next_tick(database_url: str) -> None:
    """The seeding stores a feed's past while the service's first learning runs (both start with
    the service). That learning read the record before the past was in it: the next tick learns
    again, not a day later (the seeded leads stayed on the prior for a day)."""
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        calibrations = Calibrations(db, every=timedelta(days=1))
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        learn = calibrations.learn

        async def seeded_meanwhile(name: str, now: datetime) -> Calibration:
            learned = await learn(name, now)  # read an empty record
            await _record(calibrations, now - timedelta(days=4), forecasts=72, days=4)
            calibrations.learn_soon(name)
            return learned

        calibrations.learn = seeded_meanwhile  # type: ignore[method-assign]
        await calibrations.maybe_learn(["grid"], now)
        assert not calibrations.current("grid", now).learned(timedelta(hours=24))
        calibrations.learn = learn  # type: ignore[method-assign]
        await calibrations.maybe_learn(["grid"], now + timedelta(seconds=1))
        assert calibrations.current("grid", now).learned(timedelta(hours=24))
    finally:
        await db.close()


async def test_a_lead_is_learned_as_it_was_whatever_the_minute_of_the_learning(database_url: str) -> None:
    """A feed's past, each value forecast 30 minutes ahead (as the UK feed seeds it), learned at
    any moment of a half hour: the 30-minute lead is learned (before, a learning in the second
    half of a half hour put every one of those forecasts at a 27-minute lead or so, in the
    bucket below, and the lead the seeding is for stayed on the prior)."""
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        calibrations = Calibrations(db)
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        pairs = [(hour - i * HALF_HOUR, TRUTH / 1.1, TRUTH) for i in range(1, 3 * 48)]
        await calibrations.record_past("grid", pairs, lead=HALF_HOUR)
        for into in (
            timedelta(0),
            timedelta(minutes=7),
            timedelta(minutes=16, seconds=3),
            timedelta(minutes=27, seconds=12),
        ):
            learned = await calibrations.learn("grid", hour + into)
            assert learned.learned(timedelta(minutes=45)) and learned.samples(timedelta(minutes=45)) >= 140, into
            assert not learned.learned(timedelta(minutes=15)), into
            assert abs(learned.bias(timedelta(minutes=45)) - 0.1) < 0.01, into
    finally:
        await db.close()
