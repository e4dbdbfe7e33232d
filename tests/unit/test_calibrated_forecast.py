"""The forecast a plan weighs on a bare feed (lowtide.calibrated_forecast): bias out by lead, the
current value first, and a replay's leads counted in its own time."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta

from lowtide.calibrated_forecast import planning_points
from lowtide.forecast_calibration import MIN_JOBS, Calibration, Issued, Record
from lowtide_proto.lowtide.v1 import signal_pb2
from scheduler_service.domain.holds import HoldConfig, HoldPolicy
from scheduler_service.domain.planning import CAUTION, RELEASE_LEAD
from scheduler_service.holds.cost import CostHolds
from scheduler_service.wire.forecast import calibration_of
from signal_service.api import calibration_message
from signal_service.calibration import _decode, _encode

HOUR = timedelta(hours=1)
START = datetime(2026, 1, 1, tzinfo=UTC)


def _biased_record() -> Record:
    """Three days of hourly forecasts, right up to 6 h ahead and 25 % high beyond."""
    record = Record()
    for h in range(72):
        issued = START + h * HOUR
        points = tuple((issued + i * HOUR / 2, 300.0 * (1.25 if i >= 12 else 1.0)) for i in range(1, 97))
        record.add_forecast(Issued(issued, points))
    for i in range(72 * 2):
        record.add_actual(START + i * HOUR / 2, 300.0)
    return record


def test_the_bias_comes_out_by_lead_and_the_current_value_leads() -> None:
    now = START + 72 * HOUR
    calibration = _biased_record().learn(now)
    points = [(now + 2 * HOUR, 300.0), (now + 10 * HOUR, 375.0)]
    got = planning_points(calibration, now, points, now=now, actual=280.0)
    assert got[0] == (now, 280.0, 0.0)
    # The record's forecasts stepped up 25 % from 6 h ahead and the values never followed: the
    # present leads, and the step is not expected.
    assert 280 <= got[1][1] < 300
    assert 280 <= got[2][1] < 300
    assert [p[0] for p in got] == [now, now + 2 * HOUR, now + 10 * HOUR]


def test_a_replays_leads_are_counted_in_its_time() -> None:
    now = START + 72 * HOUR
    calibration = _biased_record().learn(now)
    # At 3600x, ten seconds of wall clock are ten hours of the feed's.
    second = timedelta(seconds=1)
    points = [(now + 2 * second, 300.0), (now + 10 * second, 375.0)]
    got = planning_points(calibration, now, points, now=now, actual=None, scale=3600)
    assert [p[0] for p in got] == [now + 2 * second, now + 10 * second]
    assert got[0][1] == 300.0 and 300 < got[1][1] < 315


def test_the_calibration_reaches_the_scheduler_whole() -> None:
    """What the signal service learned is what the scheduler corrects with: every field of the
    calibration crosses the wire (a field added to it and not to ForecastCalibration fails here)."""
    learned = _biased_record().learn(START + 72 * HOUR)
    learned = dataclasses.replace(
        learned,
        caution_slope=0.25,
        profile=tuple(200.0 + i for i in range(48)),
        profile_share=tuple(0.1 * (i % 3) for i in range(len(learned.buckets))),
    )
    message = calibration_message(learned, lead_scale=1.0)
    assert calibration_of(message) == learned
    # And what the signal service stores of it, read back.
    assert _decode(json.loads(json.dumps(_encode(learned)))) == learned
    # And a calibration of other lead buckets (another release's) is not guessed at.
    del message.buckets[-1]
    assert calibration_of(message) is None
    # Nor one whose numbers are not all finite: a NaN caution would score every start NaN.
    for field in ("caution", "caution_slope"):
        broken = calibration_message(learned, lead_scale=1.0)
        setattr(broken, field, math.nan)
        assert calibration_of(broken) is None, field
    broken = calibration_message(learned, lead_scale=1.0)
    broken.buckets[3].error = math.inf
    assert calibration_of(broken) is None
    broken = calibration_message(learned, lead_scale=1.0)
    broken.day_profile[7] = math.nan
    assert calibration_of(broken) is None
    # A day profile of another length (another release's) is planned without, the rest kept.
    other = calibration_message(learned, lead_scale=1.0)
    del other.day_profile[-1]
    assert calibration_of(other) == learned.without_profile()


def test_the_scheduler_plans_with_the_caution_of_each_tasks_window_in_the_feeds_time() -> None:
    now = START + 72 * HOUR
    learned = dataclasses.replace(_biased_record().learn(now), caution=0.5, caution_slope=0.25)
    # A replay at 3600x: a task's window of 8 s of wall clock is 8 h of the feed's.
    second = timedelta(seconds=1)
    holds = _holds_at(now)
    assert holds.planning_caution() == CAUTION
    _plan_on(holds, _calibrated_feed(learned, now, second, lead_scale=3600))
    caution = holds.planning_caution()
    assert callable(caution)
    # The planner gives a task's window up to its release (RELEASE_LEAD before its latest start).
    given = [w * second - RELEASE_LEAD for w in (4, 8, 16)]
    assert [caution(w) for w in given] == [0.5, 0.25, 0.0]
    # A day's window: 0.5 less 0.25 for each of the log2(6) = 2.6 doublings of 4 h in 24 h.
    assert "caution 0.5 (4 h window; -0.15 for a window of 24 h" in holds.forecast_origin
    assert "cold start" not in holds.forecast_origin


def test_explain_says_when_the_caution_is_a_cold_starts() -> None:
    # Half a day of record: a follow is learned, but too few jobs re-played to choose a caution by.
    now = START + 12 * HOUR
    learned = _biased_record().learn(now)
    assert learned.follow and learned.caution_jobs < MIN_JOBS
    holds = _holds_at(now)
    _plan_on(holds, _calibrated_feed(learned, now, HOUR, lead_scale=1.0))
    assert f"caution {learned.caution:g} (a cold start's: {learned.caution_jobs} of {MIN_JOBS} jobs re-played" in (
        holds.forecast_origin
    )


def test_explain_says_when_the_day_profile_is_read_beside_the_forecast() -> None:
    now = START + 72 * HOUR
    learned = _biased_record().learn(now)
    holds = _holds_at(now)
    _plan_on(holds, _calibrated_feed(learned, now, HOUR, lead_scale=1.0))
    assert "day profile" not in holds.forecast_origin
    profiled = dataclasses.replace(
        learned, profile=tuple(200.0 + i for i in range(48)), profile_share=(0.0, 0.4, *[0.2] * 14)
    )
    _plan_on(holds, _calibrated_feed(profiled, now, HOUR, lead_scale=1.0))
    assert "with the feed's day profile (up to 0.4 of its change)" in holds.forecast_origin


def _calibrated_feed(learned: Calibration, now: datetime, step: timedelta, *, lead_scale: float) -> signal_pb2.Forecast:
    """A feed's forecast of 48 points `step` apart from `now`, at 300, with `learned` beside it."""
    feed = signal_pb2.Forecast(source="replay", version=1)
    feed.issued_at.FromDatetime(now)
    for i in range(1, 49):
        feed.points.add(value=300.0).at.FromDatetime(now + i * step)
    feed.calibration.CopyFrom(calibration_message(learned, lead_scale=lead_scale))
    return feed


def _holds_at(now: datetime) -> CostHolds:
    return CostHolds(
        target="unused",
        signal="grid",
        policy=HoldPolicy(),
        config=HoldConfig(frozenset({"defer"})),
        on_release=lambda: None,
        clock=lambda: now,
    )


def _plan_on(holds: CostHolds, feed: signal_pb2.Forecast) -> None:
    """The holds take `feed` as the feed's forecast, with 280 the signal's value now."""
    holds._feed_forecast = feed
    holds._refresh_forecast(signal_pb2.SignalState(value=280.0))
