"""The forecast calibration: it learns a feed's error by lead, its bias and how its errors
persist from the forecasts issued and the values that came, reads nothing after `now`, and
starts from the prior."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

import lowtide.forecast_replay as replay_module
from lowtide import forecast_caution
from lowtide.calibrated_forecast import shared_error
from lowtide.forecast_calibration import (
    BUCKET_EDGES_H,
    CAUTIONS,
    JOB_SLACKS,
    MIN_JOBS,
    PRIOR_CAUTION,
    Issued,
    Record,
    prior_calibration,
)
from lowtide.forecast_caution import COLD_CAUTION, MAX_CAUTION
from lowtide.forecast_error import ErrorModel, HorizonError, IidError
from lowtide.forecast_replay import gaps as gaps_of
from lowtide.forecast_replay import replayed, windowed

STEP = timedelta(minutes=30)
START = datetime(2024, 3, 1, tzinfo=UTC)


def _truth(i: int) -> float:
    return 200 + 80 * math.sin(2 * math.pi * i / 48) + 30 * math.sin(2 * math.pi * i / 173)


def _record(model: ErrorModel, days: int, *, bias: float = 0.0, seed: int = 7) -> Record:
    """A feed issuing a 48 h forecast every half hour for `days`, drawn from `model` (and too
    high by `bias`), and the values that came."""
    record = Record()
    rows = days * 48
    for k in range(rows):
        truth = [_truth(k + i) for i in range(97)]
        drawn = model.perturb(truth, STEP, random.Random(f"{seed}:{k}"))
        points = tuple((START + (k + i) * STEP, v * (1 + bias)) for i, v in enumerate(drawn) if i)
        record.add_forecast(Issued(START + k * STEP, points))
        record.add_actual(START + k * STEP, _truth(k))
    return record


@pytest.mark.parametrize("model", [HorizonError(shift_at_24h=timedelta(0)), IidError(0.15)])
def test_the_error_learned_by_lead_is_the_models(model: ErrorModel) -> None:
    record = _record(model, 10)
    learned = record.learn(START + 10 * 48 * STEP)
    for hours in (1, 6, 24):
        lead = timedelta(hours=hours)
        assert learned.stddev(lead) == pytest.approx(model.stddev(lead), rel=0.25), hours
        assert learned.learned(lead)
        assert abs(learned.bias(lead)) < 0.03


def test_a_bias_is_learned_and_taken_out() -> None:
    learned = _record(IidError(0.05), 6, bias=0.10).learn(START + 6 * 48 * STEP)
    # Forecasts 10 % too high: the actual is 1 / 1.1 of them.
    assert learned.bias(timedelta(hours=6)) == pytest.approx(1 / 1.1 - 1, abs=0.02)
    ((_, value, error),) = learned.correct(START, [(START + timedelta(hours=6), 110.0)])
    assert value == pytest.approx(100.0, rel=0.03)
    assert error == pytest.approx(0.05, rel=0.25)


def test_without_a_record_the_prior_holds() -> None:
    now = START + timedelta(days=1)
    learned = Record().learn(now)
    prior = prior_calibration(now, HorizonError())
    assert learned.buckets == prior.buckets
    assert learned.caution == PRIOR_CAUTION
    assert not learned.learned(timedelta(hours=6))
    # The prior at the middle of the bucket (24 to 30 h).
    assert learned.stddev(timedelta(hours=24)) == pytest.approx(HorizonError().stddev(timedelta(hours=27)))


def test_nothing_after_now_is_read() -> None:
    record = _record(HorizonError(), 8)
    now = START + 4 * 48 * STEP
    early = record.learn(now)
    # The same record cut at `now` teaches the same.
    cut = Record()
    for f in record.issued:
        if f.issued_at <= now:
            cut.add_forecast(f)
    for at, value in record.actuals.items():
        if at <= now:
            cut.add_actual(at, value)
    assert cut.learn(now) == early


def test_a_persistent_error_moves_the_later_points() -> None:
    # Errors correlated along the horizon (AR(1), rho 0.9 per half hour): the error a forecast
    # makes now says much of the next hour's, little of tomorrow's.
    learned = _record(HorizonError(0.15, 0.15, shift_at_24h=timedelta(0)), 6).learn(START + 6 * 48 * STEP)
    assert learned.persists(timedelta(hours=0.5)) > 0.6
    assert learned.persists(timedelta(hours=24)) < 0.2
    now = START + timedelta(hours=2)
    # (The last a day later, at the same time of day: no change by the day profile.)
    points = [(now, 100.0), (now + STEP, 100.0), (now + timedelta(hours=24), 100.0)]
    # The value now came in 20 % under the forecast: the rest of it is expected as much lower
    # (the forecast's shape from the present).
    moved = learned.correct(START, points, now=now, actual=80.0)
    assert [v for _, v, _ in moved[1:]] == pytest.approx([80.0, 80.0], rel=0.05)
    unmoved = learned.correct(START, points)
    assert [v for _, v, _ in unmoved] == pytest.approx([100.0] * 3, rel=0.03)


def test_iid_noise_does_not_persist() -> None:
    learned = _record(IidError(0.15), 6).learn(START + 6 * 48 * STEP)
    assert learned.persists(timedelta(hours=1)) < 0.15


@dataclasses.dataclass(frozen=True)
class _LevelError:
    """Each forecast is the truth scaled by one factor drawn per forecast: its shape is right,
    its level off."""

    relative: float

    def stddev(self, horizon: timedelta) -> float:
        return self.relative if horizon > timedelta(0) else 0.0

    def perturb(self, truth: Sequence[float], step: timedelta, rng: random.Random) -> list[float]:
        factor = 1 + self.relative * rng.gauss(0, 1)
        return [truth[0], *(v * factor for v in truth[1:])]


def test_a_forecast_off_in_level_is_planned_on_its_shape_from_the_present() -> None:
    learned = _record(_LevelError(0.2), 6).learn(START + 6 * 48 * STEP)
    assert learned.follow[_bucket(6)] == pytest.approx(1.0, abs=0.1)
    now = START + timedelta(hours=2)
    # The forecast says 120 now and 150 in six hours; 100 came: 125 is what to expect then.
    points = [(now, 120.0), (now + timedelta(hours=6), 150.0)]
    (_, (_, later, _)) = learned.correct(START, points, now=now, actual=100.0)
    assert later == pytest.approx(125.0, rel=0.05)


def test_a_dip_that_is_partly_noise_is_expected_shallower() -> None:
    # 15 % independent noise on every point: the lowest points are partly noise, and a dip the
    # forecast shows is, on the record, followed only in part.
    learned = _record(IidError(0.15), 6).learn(START + 6 * 48 * STEP)
    now = START + timedelta(hours=2)
    (_, (_, later, _)) = learned.correct(
        now, [(now + STEP, 100.0), (now + timedelta(hours=6), 70.0)], now=now, actual=100.0
    )
    assert 72 < later < 95


def _bucket(hours: float) -> int:
    return max(i for i, edge in enumerate(BUCKET_EDGES_H) if edge <= hours)


def test_until_enough_jobs_re_play_a_forecast_whose_errors_persist_is_planned_to_wait_a_little() -> None:
    # Half a day of record: too few jobs re-played to choose a caution by.
    now = START + 24 * STEP
    level = _record(_LevelError(0.2), 1).learn(now)
    noise = _record(IidError(0.15), 1).learn(now)
    assert level.caution_jobs < MIN_JOBS and noise.caution_jobs < MIN_JOBS
    # A forecast off in level for hours: its lowest point says where the low values come, and a
    # later start, planned again on each new forecast, is worth a little more than its expected
    # value: a caution under 0, as much of the mildest tried as the errors are learned to persist.
    assert COLD_CAUTION < level.caution < -0.1
    assert level.caution == pytest.approx(COLD_CAUTION * level.persists(timedelta(hours=1)))
    # Independent noise on every point: the lowest of them is partly noise, and the expected
    # values are planned on.
    assert abs(noise.caution) < 0.02


def test_caution_is_not_chosen_where_it_did_not_pay() -> None:
    # Forecasts exactly right: no start comes dearer than forecast, so no caution changes what the
    # record's jobs paid, and the forecasts' expected values (caution 0) are planned on.
    learned = _record(IidError(0.0), 6).learn(START + 6 * 48 * STEP)
    assert learned.caution_jobs >= MIN_JOBS
    assert learned.caution == 0.0
    assert not learned.raw


def test_a_caution_by_window_is_the_4_h_one_falling_per_doubling_up_to_24_h() -> None:
    learned = dataclasses.replace(prior_calibration(START), caution=0.5, caution_slope=0.25)
    assert learned.caution_for(timedelta(hours=1)) == 0.5
    assert learned.caution_for(timedelta(hours=4)) == 0.5
    assert learned.caution_for(timedelta(hours=8)) == 0.25
    assert learned.caution_for(timedelta(hours=16)) == 0.0
    # No further than the longest window the record re-plays.
    assert learned.caution_for(timedelta(hours=48)) == learned.caution_for(timedelta(hours=24))
    assert prior_calibration(START).caution_for(timedelta(hours=24)) == PRIOR_CAUTION


def test_each_re_played_job_says_its_window() -> None:
    record = _record(IidError(0.15), 3)
    now = START + 3 * 48 * STEP
    calibration = record.learn(now)
    # A 4 h job's caution is the same at any slope (its window left is never longer); an 8 h
    # job's at slope 0.5 is a doubling's less while more than 4 h are left.
    jobs = replayed(record.issued, record.actuals, [calibration], now, [[(1.0, 0.0), (1.0, 0.5)]])
    assert {window for window, _ in jobs} == set(JOB_SLACKS)
    # A cost per (caution, slope) of the one variant, then the bare forecasts'.
    assert all(len(costs) == 3 for _, costs in jobs)
    assert all(costs[0] == costs[1] for window, costs in jobs if window == JOB_SLACKS[0])
    assert any(costs[0] != costs[1] for window, costs in jobs if window == JOB_SLACKS[1])


def _dipping_record(days: int) -> Record:
    """A feed whose forecasts (a level 300, 5 % noise) never show the dip that comes once a day,
    4 h at an hour that changes from day to day, 40 % under the level."""
    record = Record()
    rng = random.Random(5)
    dips = [rng.randrange(48) for _ in range(days + 3)]

    def came(i: int) -> float:
        day, row = divmod(i, 48)
        return 300 * (0.6 if dips[day] <= row < dips[day] + 8 else 1.0)

    for k in range(days * 48):
        drawn = IidError(0.05).perturb([300.0] * 97, STEP, random.Random(f"dip:{k}"))
        points = tuple((START + (k + i) * STEP, v) for i, v in enumerate(drawn) if i)
        record.add_forecast(Issued(START + k * STEP, points))
        record.add_actual(START + k * STEP, came(k))
    return record


def test_a_day_whose_dips_the_forecasts_miss_leaves_a_gap_under_the_lowest_forecast() -> None:
    record = _dipping_record(8)
    now = START + 8 * 48 * STEP
    gaps = gaps_of(record.issued, record.actuals, record.learn(now), now, JOB_SLACKS[-1])
    # One per hour's job whose day the record holds and its forecast covered.
    assert MIN_JOBS <= len(gaps) <= 7 * 24
    # Over a day the lowest value that came is well under the lowest forecast, in its errors;
    # over 4 h, most of which hold no dip, it is not.
    assert statistics.median(gaps) < -1
    short = gaps_of(record.issued, record.actuals, record.learn(now), now, JOB_SLACKS[0])
    assert statistics.median(short) > statistics.median(gaps)


@pytest.mark.parametrize(("gap", "longest"), [(-1.0, -0.5), (1.0, 0.5), (-9.0, -MAX_CAUTION), (0.0, 0.0)])
def test_the_longest_windows_caution_is_half_the_gap_a_prophet_would_wait_for(gap: float, longest: float) -> None:
    end = forecast_caution.longest([gap] * MIN_JOBS)
    learned = dataclasses.replace(
        prior_calibration(START), caution=0.25, caution_slope=forecast_caution.slope(0.25, end)
    )
    assert learned.caution_for(timedelta(hours=4)) == 0.25
    assert learned.caution_for(timedelta(hours=24)) == pytest.approx(longest)
    assert learned.caution_for(timedelta(hours=48)) == pytest.approx(longest)
    # Too few of the longest windows' jobs: one caution for every window.
    assert forecast_caution.longest([gap] * (MIN_JOBS - 1)) is None
    assert forecast_caution.slope(0.25, None) == 0.0


def _jobs(
    cheaper: Callable[[float, float], float], end: float | None, variants: int = 1
) -> list[tuple[timedelta, list[float]]]:
    """A re-play's jobs (each window in turn; columns each caution of one variant for every
    window, then each falling to `end` at 24 h, then the bare forecasts): 100, less
    `cheaper(window_h, the window's caution)`, with a little noise."""
    rng = random.Random(3)
    grid = [*((c, 0.0) for c in CAUTIONS), *((c, forecast_caution.slope(c, end)) for c in CAUTIONS)]
    jobs = []
    for _ in range(60):
        for slack in JOB_SLACKS:
            hours = slack / timedelta(hours=1)
            row = [100 - cheaper(hours, windowed(c, k, slack)) + rng.gauss(0, 0.1) for c, k in grid * variants]
            jobs.append((slack, [*row, 110 + rng.gauss(0, 0.1)]))
    return jobs


def _own(hours: float) -> float:
    """0.5 at 4 h, falling to -0.5 at 24 h (linear in the log of the window)."""
    return 0.5 - math.log2(hours / 4) / math.log2(6)


def _one_caution_pays_a_little(arrivals: int, variants: int = 1) -> list[tuple[timedelta, list[float]]]:
    """A re-play's jobs, an hour apart, of every window (columns, variant by variant: each caution
    for every window, then each falling by window; then the bare forecasts): the one caution 0
    for every window starts each 0.3 cheaper on average than any caution by window, 1.3 cheaper
    or 0.7 dearer from one arrival to the next."""
    jobs: list[tuple[timedelta, list[float]]] = []
    for i in range(arrivals):
        gain = 0.3 + (1.0 if i % 2 else -1.0)
        single = [100.0 - (gain if c == 0.0 else 0.0) for c in CAUTIONS]
        row = [*single, *[100.0] * len(CAUTIONS)] * variants
        jobs.extend((slack, [*row, 110.0]) for slack in JOB_SLACKS)
    return jobs


def test_the_caution_by_window_gives_way_only_to_a_gain_that_holds_over_days() -> None:
    jobs, default, width = _one_caution_pays_a_little(48), CAUTIONS.index(0.0), 2 * len(CAUTIONS)
    # A feed whose errors are independent point to point: its 144 jobs count as 144, and the
    # small gain is clear: the one caution for every window is planned with.
    noisy = forecast_caution.choose(jobs, 1, width, default, persistence=0.0)
    assert noisy.column == default
    # A feed whose errors persist along its forecasts: a day's jobs meet the same miss, two days of
    # them are about two days' luck, and the caution by window (the gaps') is kept.
    persistent = forecast_caution.choose(jobs, 1, width, default, persistence=0.8)
    assert persistent.column == default + len(CAUTIONS)
    assert forecast_caution.independent_jobs(24, 0.0) == 24
    assert forecast_caution.independent_jobs(24, 1.0) == pytest.approx(1.0)


def test_a_short_window_s_jobs_count_as_alike_as_the_day_long_ones_they_share_their_hours_with() -> None:
    # Errors that persist a little: the 4 h and 8 h jobs share their hours with the 24 h jobs
    # that arrived in the day before them, and meet the same misses. Counted by their own
    # windows the 144 jobs would be 52, and the small gain clear; counted as alike as the day-long
    # ones they are 21, and the caution by window is kept.
    jobs, default, width = _one_caution_pays_a_little(48), CAUTIONS.index(0.0), 2 * len(CAUTIONS)
    assert forecast_caution.independent_jobs(len(jobs), 0.25) == pytest.approx(144 / 6.75)
    assert forecast_caution.choose(jobs, 1, width, default, persistence=0.25).column == default + len(CAUTIONS)


@pytest.mark.parametrize(
    ("model", "by_window"), [(HorizonError(0.15, 0.15, shift_at_24h=timedelta(0)), True), (IidError(0.15), False)]
)
def test_a_feed_s_own_record_says_how_much_its_overlapping_jobs_count(
    monkeypatch: pytest.MonkeyPatch, model: ErrorModel, by_window: bool
) -> None:
    # The same re-play on two feeds' records: the one whose errors persist along its forecasts
    # keeps the caution by window (the gaps say a day's window waits); the one whose errors are
    # independent takes the one caution that paid a little on every job.
    def replayed_paying(_i: object, _a: object, variants: Sequence[object], *_: object) -> object:
        return _one_caution_pays_a_little(48, len(variants))

    record = _record(model, 6)
    monkeypatch.setattr(replay_module, "replayed", replayed_paying)
    monkeypatch.setattr(replay_module, "gaps", lambda *_: [-1.0] * MIN_JOBS)
    learned = record.learn(START + 6 * 48 * STEP)
    assert learned.caution == 0.0
    assert (learned.caution_slope != 0.0) is by_window


def test_a_record_whose_windows_pay_their_own_caution_plans_each_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(lambda h, c: -abs(c - _own(h)), -0.5))
    monkeypatch.setattr(replay_module, "gaps", lambda *_: [-1.0] * MIN_JOBS)
    learned = Record().learn(START)
    # A day's window is planned with half the gap its jobs left; a 4 h one with the caution that
    # paid for every window.
    assert learned.caution_for(timedelta(hours=24)) == pytest.approx(-0.5)
    assert learned.caution_for(timedelta(hours=4)) == learned.caution > learned.caution_for(timedelta(hours=24))


def test_a_short_window_keeps_its_own_caution_where_a_day_s_jobs_pay_another(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each window's jobs pay most with their own caution (1 at 4 h, -0.5 at a day), and the day's
    # weigh most: the one caution for every window that pays is the day's. A 4 h task is planned
    # with what paid for 4 h jobs, not with a day's.
    def cheaper(hours: float, caution: float) -> float:
        return -abs(caution - (1.0 - 1.5 * math.log2(hours / 4) / math.log2(6))) * (3 if hours == 24 else 1)

    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(cheaper, -0.5))
    monkeypatch.setattr(replay_module, "gaps", lambda *_: [-1.0] * MIN_JOBS)
    learned = Record().learn(START)
    assert learned.caution_for(timedelta(hours=4)) == 1.0
    assert learned.caution_for(timedelta(hours=24)) == pytest.approx(-0.5)


def test_where_the_re_play_cannot_tell_the_gap_says_how_long_windows_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(lambda h, c: 0.0, -0.5))
    monkeypatch.setattr(replay_module, "gaps", lambda *_: [-1.0] * MIN_JOBS)
    learned = Record().learn(START)
    assert learned.caution_for(timedelta(hours=4)) == PRIOR_CAUTION
    assert learned.caution_for(timedelta(hours=24)) == pytest.approx(-0.5)


def test_a_caution_by_window_that_clearly_cost_more_on_the_record_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # Forecasts whose lowest point says nothing of when the lowest value comes: holding out for
    # the gap in long windows starts their jobs dearer, and the re-play says so.
    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(lambda h, c: -abs(c - 1.0), -0.5))
    monkeypatch.setattr(replay_module, "gaps", lambda *_: [-1.0] * MIN_JOBS)
    learned = Record().learn(START)
    assert (learned.caution, learned.caution_slope) == (1.0, 0.0)


def test_a_record_of_forecasts_one_point_ahead_learns_no_caution_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A feed's past as seeded: each value forecast half an hour ahead. Its jobs re-played say
    nothing of waiting a day, so no caution changes with the window, whatever they paid."""
    record = Record()
    for i in range(7 * 48):
        at = START + i * STEP
        record.add_forecast(Issued(at - STEP, ((at, 300.0 + (i % 7)),)))
        record.add_actual(at, 300.0 - (i % 5))
    now = START + 7 * 48 * STEP
    assert gaps_of(record.issued, record.actuals, record.learn(now), now, JOB_SLACKS[-1]) == []

    def replayed_paying(_i: object, _a: object, variants: Sequence[object], *_: object) -> object:
        # Whatever is tried, for every variant: a caution by window would pay.
        return _jobs(lambda h, c: -abs(c - _own(h)), -0.5, len(variants))

    monkeypatch.setattr(replay_module, "replayed", replayed_paying)
    learned = record.learn(now)
    assert learned.caution_slope == 0.0


def test_the_error_a_point_shares_with_the_next_is_all_of_it_until_a_record_says_less() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    prior = prior_calibration(now)
    # No record: errors are not known to be independent.
    assert shared_error(prior) == 1.0
    # Learned from many forecasts, the persistence half an hour on; from few, blended toward 1.
    persistence = (0.0, 0.1, *([0.0] * (len(BUCKET_EDGES_H) - 2)))
    many = [dataclasses.replace(b, forecasts=992) for b in prior.buckets]
    few = [dataclasses.replace(b, forecasts=8) for b in prior.buckets]
    learned = dataclasses.replace(prior, buckets=tuple(many), persistence=persistence)
    short = dataclasses.replace(prior, buckets=tuple(few), persistence=persistence)
    assert shared_error(learned) == pytest.approx(0.108)
    assert shared_error(short) == pytest.approx(0.6)
