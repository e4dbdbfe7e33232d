"""Planned release on the bundled 2020 GB trace: a fortnight of half-hour jobs, each planned on
a 48-hour forecast issued at its arrival. A perfect forecast finds the best window; a forecast
with 5 % error keeps most of that saving and beats the plain threshold hold. (`make bench` runs
the same over the whole year.)"""

from __future__ import annotations

import bisect
import random
from datetime import UTC, datetime, timedelta

import pytest

from scheduler_service.domain.planning import Capacity, Forecast, PlanKind, PlanTask, plan
from signal_service.domain import Point
from signal_service.feeds.replay import load_trace

FIRST = datetime(2020, 3, 1, tzinfo=UTC)
JOBS = 14 * 48
STEP = timedelta(minutes=30)
SLACK = timedelta(hours=8)
HORIZON = timedelta(hours=48)


@pytest.fixture(scope="module")
def trace() -> list[Point]:
    return load_trace()


def forecast_at(trace: list[Point], now: datetime, error: float, rng: random.Random) -> Forecast:
    """The trace ahead of `now` with multiplicative noise; the current value is known."""
    times = [p.at for p in trace]
    here = bisect.bisect_right(times, now) - 1
    ahead = bisect.bisect_left(times, now + HORIZON)
    future = [(p.at, p.value * (1 + error * rng.gauss())) for p in trace[here + 1 : ahead]]
    return Forecast.of([(now, trace[here].value), *future], end=now + HORIZON)


def savings(trace: list[Point], error: float) -> tuple[float, float, float]:
    """(planner, oracle, threshold at last week's median) saving against starting at arrival."""
    truth = Forecast.of((p.at, p.value) for p in trace)
    times = [p.at for p in trace]
    rng = random.Random(8)
    at_once = planned = best = held = 0.0
    for n in range(JOBS):
        now = FIRST + n * STEP
        latest = now + SLACK
        at_once += truth.mean(now, STEP)
        (chosen,) = plan(
            [PlanTask(n, now, latest, STEP)], forecast_at(trace, now, error, rng), Capacity(1), now, signal_low=False
        )
        assert chosen.kind is PlanKind.FORECAST
        assert now <= chosen.release_at <= latest
        planned += truth.mean(chosen.release_at, STEP)
        starts = times[bisect.bisect_left(times, now) : bisect.bisect_right(times, latest)]
        best += min(truth.mean(s, STEP) for s in starts)
        week = sorted(p.value for p in trace[bisect.bisect_left(times, now - timedelta(days=7)) : times.index(now)])
        median = week[len(week) // 2]
        release = next((s for s in starts if truth.mean(s, timedelta(0)) < median), latest)
        held += truth.mean(release, STEP)
    return 1 - planned / at_once, 1 - best / at_once, 1 - held / at_once


def test_a_perfect_forecast_finds_the_best_window(trace: list[Point]) -> None:
    planner, oracle, _ = savings(trace, 0.0)
    assert oracle > 0.05
    assert planner == pytest.approx(oracle, abs=1e-9)


def test_a_forecast_with_five_percent_error_keeps_most_of_the_saving(trace: list[Point]) -> None:
    planner, oracle, threshold = savings(trace, 0.05)
    assert planner >= 0.8 * oracle
    assert planner > threshold
