"""Forecast error models: seeded, the current value exact, the stated error matching the drawn
one, correlated in time and shifting ramps for the horizon-growing model."""

from __future__ import annotations

import random
import statistics
from datetime import timedelta

import pytest

from lowtide.forecast_error import HorizonError, IidError, model_named

STEP = timedelta(minutes=30)
FLAT = [100.0] * 97


def _errors(model: IidError | HorizonError, seed: int, truth: list[float] = FLAT) -> list[float]:
    forecast = model.perturb(truth, STEP, random.Random(seed))
    return [f / t - 1 for f, t in zip(forecast, truth, strict=True)]


@pytest.mark.parametrize("model", [IidError(0.05), HorizonError()])
def test_the_same_seed_gives_the_same_forecast_and_now_is_exact(model: IidError | HorizonError) -> None:
    assert _errors(model, 1) == _errors(model, 1)
    assert _errors(model, 1) != _errors(model, 2)
    assert _errors(model, 1)[0] == 0.0
    assert model.stddev(timedelta(0)) == 0.0


def test_zero_error_is_the_truth() -> None:
    truth = [float(v) for v in range(50)]
    assert IidError(0.0).perturb(truth, STEP, random.Random(0)) == truth
    assert HorizonError(0.0, 0.0, shift_at_24h=timedelta(0)).perturb(truth, STEP, random.Random(0)) == truth


def test_the_horizon_error_grows_as_stated_and_is_correlated() -> None:
    model = HorizonError()
    assert model.stddev(timedelta(hours=1)) == pytest.approx(0.03)
    assert model.stddev(timedelta(hours=24)) == pytest.approx(0.15)
    draws = [_errors(model, seed) for seed in range(400)]
    for hours in (1, 12, 24):
        drawn = statistics.pstdev(d[2 * hours] for d in draws)
        assert drawn == pytest.approx(model.stddev(timedelta(hours=hours)), rel=0.15)
    # Next points are off together (AR(1), rho 0.9), unlike the i.i.d. model's.
    scaled = [[e / model.stddev(i * STEP) for i, e in enumerate(d) if i] for d in draws]
    lag1 = statistics.correlation(
        [s[i] for s in scaled for i in range(10, 40)], [s[i + 1] for s in scaled for i in range(10, 40)]
    )
    assert lag1 == pytest.approx(0.9, abs=0.05)
    iid = [_errors(IidError(0.05), seed) for seed in range(400)]
    assert abs(statistics.correlation([d[20] for d in iid], [d[21] for d in iid])) < 0.15


def test_the_horizon_error_shifts_a_ramp_in_time() -> None:
    # A step from 100 to 300 a day ahead: without value error, the forecast puts the ramp early
    # or late, more so than an hour ahead.
    model = HorizonError(0.0, 0.0, shift_at_24h=timedelta(hours=1))
    near = [100.0, 100.0, 300.0, *([300.0] * 50)]
    far = [*([100.0] * 48), *([300.0] * 49)]
    moved_far = sum(any(_errors(model, seed, far)[47:49]) for seed in range(100))
    assert moved_far > 90
    spread_far = statistics.pstdev(sum(_errors(model, seed, far)[47:49]) for seed in range(200))
    spread_near = statistics.pstdev(sum(_errors(model, seed, near)[1:3]) for seed in range(200))
    assert spread_far > 5 * spread_near > 0


def test_models_by_name() -> None:
    assert model_named("iid", relative=0.15) == IidError(0.15)
    assert model_named("horizon") == HorizonError()
    with pytest.raises(ValueError, match="unknown forecast error model"):
        model_named("perfect")
