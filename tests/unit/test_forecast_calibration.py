"""The forecast calibration: it learns a feed's error by lead, its bias and how its errors
persist from the forecasts issued and the values that came, reads nothing after `now`, and
starts from the prior."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

import lowtide.forecast_replay as replay_module
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
from lowtide.forecast_error import ErrorModel, HorizonError, IidError
from lowtide.forecast_replay import SLOPES, covered_jobs, replayed

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
    points = [(now, 100.0), (now + STEP, 100.0), (now + timedelta(hours=30), 100.0)]
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


def test_the_record_is_re_played_with_each_windows_own_caution() -> None:
    record = _record(IidError(0.15), 3)
    now = START + 3 * 48 * STEP
    calibration = record.learn(now)
    # A 4 h job's caution is the same at any slope; an 8 h job's at slope 0.5 is a doubling's less.
    grid = [(1.0, 0.0), (1.0, 0.5), (0.5, 0.0)]
    costs = replayed(record.issued, record.actuals, [calibration], now, grid)
    # Each hour's arrival is a job of each window in turn, while the record holds the window.
    whole = costs[: 24 * len(JOB_SLACKS)]
    by_window = [whole[i :: len(JOB_SLACKS)] for i in range(len(JOB_SLACKS))]
    assert all(job[0] == job[1] for job in by_window[0])
    assert all(job[1] == job[2] for job in by_window[1])
    assert any(job[0] != job[2] for job in by_window[1])


def _jobs(
    cheaper: Callable[[int, float, float], float], count: int = 60, slopes: tuple[float, ...] = SLOPES
) -> list[list[float]]:
    """A re-play's costs (jobs of each window in turn, columns the grid's (caution, slope) pairs
    of the one variant, then the bare forecasts): 100, less `cheaper(window_h, caution, slope)`,
    with a little noise."""
    rng = random.Random(3)
    costs = []
    for _ in range(count):
        for slack in JOB_SLACKS:
            hours = slack // timedelta(hours=1)
            row = [100 - cheaper(hours, c, k) + rng.gauss(0, 0.1) for c in CAUTIONS for k in slopes]
            costs.append([*row, 110 + rng.gauss(0, 0.1)])
    return costs


def test_a_record_that_pays_less_caution_in_longer_windows_learns_the_slope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def waiting_pays_longer(hours: int, caution: float, slope: float) -> float:
        # Every window pays best at its own caution: 0.5 at 4 h, falling 0.25 a doubling.
        own = 0.5 - 0.25 * math.log2(hours / 4)
        return -abs(caution - slope * math.log2(hours / 4) - own)

    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(waiting_pays_longer))
    monkeypatch.setattr(replay_module, "covered_jobs", lambda *_: MIN_JOBS)
    learned = Record().learn(START)
    assert (learned.caution, learned.caution_slope) == (0.5, 0.25)
    assert learned.caution_for(timedelta(hours=24)) < learned.caution_for(timedelta(hours=4))


def test_without_a_clear_gain_by_window_the_caution_is_the_same_for_every_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def one_caution_pays(hours: int, caution: float, slope: float) -> float:
        return -abs(caution - slope * math.log2(hours / 4) - 1.0)

    monkeypatch.setattr(replay_module, "replayed", lambda *_: _jobs(one_caution_pays))
    monkeypatch.setattr(replay_module, "covered_jobs", lambda *_: MIN_JOBS)
    learned = Record().learn(START)
    assert (learned.caution, learned.caution_slope) == (1.0, 0.0)


def test_a_record_of_forecasts_one_point_ahead_learns_no_caution_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A feed's past as seeded: each value forecast half an hour ahead. Its jobs re-played say
    nothing of waiting a day, so no caution falls with the window, whatever they paid."""

    def waiting_pays_longer(hours: int, caution: float, slope: float) -> float:
        return -abs(caution - slope * math.log2(hours / 4) - (0.5 - 0.25 * math.log2(hours / 4)))

    record = Record()
    for i in range(7 * 48):
        at = START + i * STEP
        record.add_forecast(Issued(at - STEP, ((at, 300.0),)))
        record.add_actual(at, 300.0)
    now = START + 7 * 48 * STEP
    assert covered_jobs(record.issued, record.actuals, now, timedelta(hours=24)) == 0

    def replayed_paying(
        _issued: object, _actuals: object, variants: list[object], _now: object, grid: list[tuple[float, float]]
    ) -> list[list[float]]:
        # Whatever is tried, for every variant: a caution falling with the window would pay.
        rows = []
        for slack in JOB_SLACKS * 60:
            hours = slack // timedelta(hours=1)
            row = [100 - waiting_pays_longer(hours, c, k) for _ in variants for c, k in grid]
            rows.append([*row, 110.0])
        return rows

    monkeypatch.setattr(replay_module, "replayed", replayed_paying)
    assert record.learn(now).caution_slope == 0.0
    # The same record, had it covered the long windows, would have learned the slope.
    monkeypatch.setattr(replay_module, "covered_jobs", lambda *_: MIN_JOBS)
    assert record.learn(now).caution_slope == 0.25
