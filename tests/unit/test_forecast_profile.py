"""The day profile beside the forecast: the week's mean by half hour of the day, and the share of
its change the calibration learns where a feed's forecasts miss the day's shape (and not where
they carry it)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from lowtide import forecast_profile
from lowtide.forecast_calibration import BUCKET_EDGES_H, Issued, Record
from lowtide.forecast_error import IidError
from lowtide.forecast_replay import gaps

STEP = timedelta(minutes=30)
START = datetime(2024, 3, 1, tzinfo=UTC)
SIX_HOURS = timedelta(hours=6)


def _day(k: int) -> float:
    """A grid's day: low at night, a peak in the evening (half hour k from midnight)."""
    return 200 + 80 * math.sin(2 * math.pi * (k - 30) / 48)


def _other(k: int) -> float:
    """Weather: a swing over about three and a half days, no shape by time of day."""
    return 30 * math.sin(2 * math.pi * k / 173)


def test_the_profile_is_the_last_weeks_mean_by_half_hour_of_the_day() -> None:
    # Eight days: the first is more than a week before `now` and left out.
    values = [(START + k * STEP, 1000.0 if k < 48 else 100.0 + k % 48 + (k // 48) % 2) for k in range(8 * 48)]
    now = values[-1][0]
    profile = forecast_profile.Rolling(values).at(now)
    assert len(profile) == forecast_profile.SLOTS
    # Days 1-7: four odd (+1) and three even.
    assert profile == pytest.approx([100 + s + 4 / 7 for s in range(48)])
    assert forecast_profile.change(profile, START, START + timedelta(hours=12)) == pytest.approx(
        (124 + 4 / 7) / (100 + 4 / 7) - 1
    )


def test_a_feed_with_a_value_an_hour_has_every_half_hour_filled() -> None:
    profile = forecast_profile.day_profile([(START + timedelta(hours=h), 100.0 + h) for h in range(24)])
    assert profile[forecast_profile.slot(START + timedelta(hours=5, minutes=30))] in (105.0, 106.0)
    assert forecast_profile.day_profile([]) == ()
    assert forecast_profile.change((), START, START + SIX_HOURS) == 0.0


def _record(forecast: str, days: int = 9) -> Record:
    """A feed issuing a 24 h forecast every half hour and the values that came: the day's shape
    plus weather. `flat`: each forecast the present value throughout (it misses the day's shape);
    `shaped`: the values to come, 1 % off point by point."""
    record = Record()
    for k in range(days * 48):
        value = _day(k) + _other(k)
        rng = random.Random(k)
        ahead = [_day(k + i) + _other(k + i) for i in range(1, 49)]
        points = [value] * 48 if forecast == "flat" else IidError(0.01).perturb([value, *ahead], STEP, rng)[1:]
        record.add_forecast(
            Issued(START + k * STEP, tuple((START + (k + i) * STEP, v) for i, v in enumerate(points, 1)))
        )
        record.add_actual(START + k * STEP, value)
    return record


def test_a_forecast_that_misses_the_days_shape_is_moved_toward_it() -> None:
    days = 9
    now = START + (days * 48 - 1) * STEP
    learned = _record("flat", days).learn(now)
    share = learned.profile_share[BUCKET_EDGES_H.index(6)]  # 6 to 8 h ahead
    assert share > 0.5
    k = days * 48 - 1
    actual = _day(k) + _other(k)
    later = now + SIX_HOURS
    truth = _day(k + 12) + _other(k + 12)
    ((_, expected, _),) = [
        p for p in learned.correct(now, [(now, actual), (later, actual)], now=now, actual=actual) if p[0] == later
    ]
    # The flat forecast is off by |truth - actual|; read with the profile, by less than half that.
    assert abs(expected - truth) < 0.5 * abs(truth - actual)


def test_a_forecast_that_carries_the_days_shape_gives_the_profile_little() -> None:
    learned = _record("shaped").learn(START + (9 * 48 - 1) * STEP)
    # From 2 h ahead the forecast's change is many times its noise: the profile tells nothing more.
    # (Over the next half hour a noisy forecast's change is mostly noise, and the profile's share
    # there is rightly larger.)
    from_2h = [share for lo, share in zip(BUCKET_EDGES_H, learned.profile_share, strict=True) if lo >= 2]
    assert from_2h
    assert max(from_2h) < 0.1


def test_the_re_play_judges_caution_on_the_forecasts_own_reading() -> None:
    # The profile as it stands now holds the values the re-played jobs went on to see: the
    # re-play reads the record's forecasts as if there were no profile.
    days = 9
    record = _record("flat", days)
    now = START + (days * 48 - 1) * STEP
    learned = record.learn(now)
    assert learned.profile_share
    bare = learned.without_profile()
    assert not bare.profile_share and bare.follow == learned.follow
    day = timedelta(hours=24)
    assert gaps(record.issued, record.actuals, learned, now, day) == gaps(record.issued, record.actuals, bare, now, day)
    # (The profile does move what a plan now sees.)
    later = now + SIX_HOURS
    actual = record.actuals[now]
    read = learned.correct(now, [(later, actual)], now=now, actual=actual)
    assert read != bare.correct(now, [(later, actual)], now=now, actual=actual)
