"""Planned release: the cheapest window before the latest start, capacity, fallbacks, ties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_service.domain.planning import (
    Capacity,
    Commitment,
    Forecast,
    Plan,
    PlanKind,
    PlanTask,
    plan,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ROOMY = Capacity(max_running=100)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def half_hourly(*values: float, start: float = 0) -> Forecast:
    return Forecast.of((at(start + 30 * i), v) for i, v in enumerate(values))


def task(task_id: int = 1, *, earliest: float = 0, latest: float, duration: float = 30) -> PlanTask:
    return PlanTask(task_id, at(earliest), at(latest), minutes(duration))


def plan_one(t: PlanTask, forecast: Forecast | None, *, signal_low: bool = False) -> Plan:
    (only,) = plan([t], forecast, ROOMY, T0, signal_low=signal_low)
    return only


# The forecast: a step function, means over any interval.


def test_a_forecast_holds_each_value_until_the_next_point_and_the_last_for_one_more_step() -> None:
    forecast = half_hourly(100, 200, 400)
    assert forecast.end == at(90)
    assert forecast.mean(at(0), minutes(30)) == 100
    assert forecast.mean(at(15), minutes(30)) == 150
    assert forecast.mean(at(0), minutes(90)) == pytest.approx(700 / 3)
    assert forecast.mean(at(70), minutes(0)) == 400
    assert forecast.covers(at(0), at(90))
    assert not forecast.covers(at(0), at(91))
    assert not forecast.covers(at(-1), at(30))


def test_a_forecast_takes_points_in_any_order_and_the_later_of_two_at_one_time() -> None:
    forecast = Forecast.of([(at(30), 200.0), (at(0), 100.0), (at(30), 250.0)], end=at(45))
    assert forecast.mean(at(30), minutes(15)) == 250
    assert forecast.breakpoints(at(0), at(60)) == [at(0), at(30)]
    assert Forecast.of([(at(0), 5.0)]).end == at(0)
    with pytest.raises(ValueError, match="at least one point"):
        Forecast.of([])
    with pytest.raises(ValueError, match="before its last point"):
        Forecast.of([(at(0), 1.0), (at(30), 1.0)], end=at(10))


def test_steps_may_vary() -> None:
    # The GB trace goes from half-hourly to quarter-hourly rows.
    forecast = Forecast.of([(at(0), 300.0), (at(30), 200.0), (at(45), 50.0), (at(60), 100.0)])
    assert forecast.end == at(75)
    chosen = plan_one(task(latest=45, duration=15), forecast)
    assert chosen.release_at == at(45)
    assert chosen.expected_intensity == 50


# One task: the cheapest start in its window.


def test_the_cheapest_window_before_the_latest_start() -> None:
    chosen = plan_one(task(latest=90), half_hourly(300, 200, 100, 250, 50))
    assert chosen.release_at == at(60)
    assert chosen.expected_intensity == 100
    assert chosen.kind is PlanKind.FORECAST
    assert "lowest forecast mean 100" in chosen.reason


def test_a_long_task_is_placed_on_its_mean_over_the_whole_run() -> None:
    # The single cheapest half hour (at 30) sits between two dear ones; the best hour is later.
    chosen = plan_one(task(latest=120, duration=60), half_hourly(400, 10, 400, 120, 120, 500))
    assert chosen.release_at == at(90)
    assert chosen.expected_intensity == 120


def test_the_best_start_may_lie_between_forecast_points() -> None:
    # A 45-minute run: ending where the dear value begins beats starting on any point.
    chosen = plan_one(task(latest=30, duration=45), half_hourly(300, 100, 900))
    assert chosen.release_at == at(15)
    assert chosen.expected_intensity == pytest.approx(500 / 3)


def test_the_earliest_start_is_respected_and_so_is_now() -> None:
    forecast = half_hourly(10, 20, 30, 40, start=-60)
    chosen = plan_one(task(earliest=-60, latest=30), forecast)
    # The cheapest rows are in the past; of the starts from now on, now is the cheapest.
    assert chosen.release_at == T0
    # Not before its own earliest start either, however cheap the half hour before it.
    later = plan_one(task(earliest=31, latest=45), half_hourly(50, 10, 30, 5))
    assert later.release_at == at(31)


def test_a_deadline_on_the_finish_is_a_latest_start_one_duration_earlier() -> None:
    t = PlanTask.finishing_by(7, T0, at(120), minutes(30))
    assert t.latest_start == at(90)
    chosen = plan_one(t, half_hourly(300, 200, 250, 260, 1))
    assert chosen.release_at == at(30)


def test_ties_go_to_the_earliest_start() -> None:
    chosen = plan_one(task(latest=120), half_hourly(*[180.0] * 6))
    assert chosen.release_at == T0
    repeat = plan_one(task(latest=150), half_hourly(200, 90, 200, 90, 200, 200))
    assert repeat.release_at == at(30)


def test_no_slack_means_now() -> None:
    forecast = half_hourly(500, 10)
    for latest in (0, -30):
        chosen = plan_one(task(earliest=-60, latest=latest), forecast)
        assert chosen.release_at == T0
        assert chosen.kind is PlanKind.NO_SLACK
        assert chosen.expected_intensity == 500
    assert plan_one(task(latest=-30), None).release_at == T0


# Without a usable forecast: the threshold hold, bounded by the latest start.


def test_without_a_forecast_the_threshold_hold_decides() -> None:
    held = plan_one(task(latest=240), None, signal_low=False)
    assert held.kind is PlanKind.THRESHOLD
    assert held.release_at == at(240)
    assert held.expected_intensity is None
    assert held.reason.startswith("no forecast; held until the signal falls")
    released = plan_one(task(latest=240), None, signal_low=True)
    assert released.release_at == T0
    assert released.kind is PlanKind.THRESHOLD


def test_a_forecast_that_ends_too_soon_or_starts_too_late_is_not_used() -> None:
    short = plan_one(task(latest=240), half_hourly(100, 50, 20))
    assert short.kind is PlanKind.THRESHOLD
    assert "does not cover the window" in short.reason
    late = plan_one(task(latest=60), half_hourly(100, 50, 20, 30, 40, start=10))
    assert late.kind is PlanKind.THRESHOLD
    # The caller that knows the current value puts it in front, and the forecast is used.
    points = [(T0, 300.0), *((at(10 + 30 * i), v) for i, v in enumerate([100.0, 50.0, 20.0, 30.0, 40.0]))]
    assert plan_one(task(latest=60), Forecast.of(points)).release_at == at(60)


def test_a_new_forecast_gives_a_new_plan() -> None:
    t = task(latest=120)
    first = plan_one(t, half_hourly(300, 50, 300, 300, 300, 300))
    assert first.release_at == at(30)
    # Half an hour on, the forecast has moved the cheap window; planning again follows it.
    later, now = half_hourly(300, 40, 300, 300, start=30), at(30)
    (again,) = plan([t], later, ROOMY, now, signal_low=False)
    assert again.release_at == at(60)


# Capacity: many tasks, one cheap window.


def test_tasks_spread_over_the_next_best_windows_when_the_cheapest_is_full() -> None:
    forecast = half_hourly(400, 300, 100, 200, 350, 500)
    tasks = [task(i, latest=120) for i in range(1, 4)]
    plans = plan(tasks, forecast, Capacity(max_running=1), T0, signal_low=False)
    assert sorted(p.release_at for p in plans) == [at(30), at(60), at(90)]
    assert all(not p.over_capacity for p in plans)
    assert [p.task_id for p in plans] == [1, 2, 3]
    assert any("the pool is full" in p.reason for p in plans)


def test_the_tightest_deadline_chooses_first() -> None:
    forecast = half_hourly(400, 300, 100, 200, 350, 500)
    roomy, tight = task(1, latest=120), task(2, latest=60)
    plans = plan([roomy, tight], forecast, Capacity(max_running=1), T0, signal_low=False)
    by_id = {p.task_id: p.release_at for p in plans}
    assert by_id == {2: at(60), 1: at(90)}


def test_reservations_take_their_share_of_the_pool() -> None:
    forecast = half_hourly(400, 300, 100, 200, 350, 500)
    reserved = Capacity(max_running=2, committed=(Commitment(at(55), at(95), count=2),))
    (chosen,) = plan([task(latest=120)], forecast, reserved, T0, signal_low=False)
    # 60 (100) and 90 (200) overlap the reservation; the next best run starts as it ends.
    assert chosen.release_at == at(95)
    assert chosen.expected_intensity == pytest.approx((25 * 200 + 5 * 350) / 30)
    assert "the pool is full at 2026-06-01T13:00:00+00:00 (100)" in chosen.reason


def test_a_task_with_no_room_anywhere_still_starts_by_its_latest_start() -> None:
    forecast = half_hourly(400, 300, 100, 200, 350, 500)
    full = Capacity(max_running=1, committed=(Commitment(at(-10), at(200)),))
    (chosen,) = plan([task(latest=90)], forecast, full, T0, signal_low=False)
    assert chosen.over_capacity
    assert T0 <= chosen.release_at <= at(90)
    assert "full throughout" in chosen.reason


def test_a_resolution_must_be_positive_and_a_duration_not_negative() -> None:
    with pytest.raises(ValueError, match="resolution"):
        plan([], None, ROOMY, T0, signal_low=False, resolution=timedelta(0))
    with pytest.raises(ValueError, match="negative"):
        task(latest=30, duration=-1)


# Properties.

HORIZON = 16 * 60  # minutes of forecast after now; every generated window fits inside it


@st.composite
def forecasts(draw: st.DrawFn) -> Forecast:
    """Integer values on whole minutes, from up to 30 minutes before now to beyond any window."""
    first = -draw(st.integers(0, 30))
    steps = draw(st.lists(st.integers(1, 90), min_size=0, max_size=25))
    values = draw(st.lists(st.integers(0, 500), min_size=len(steps) + 2, max_size=len(steps) + 2))
    offsets = [first]
    for step in steps:
        if offsets[-1] + step < HORIZON:
            offsets.append(offsets[-1] + step)
    offsets.append(HORIZON)
    return Forecast.of(((at(o), float(v)) for o, v in zip(offsets, values, strict=False)), end=at(HORIZON + 60))


@st.composite
def task_lists(draw: st.DrawFn) -> list[PlanTask]:
    count = draw(st.integers(1, 6))
    tasks = []
    for task_id in range(1, count + 1):
        earliest = draw(st.integers(-60, 240))
        slack = draw(st.integers(-30, 480))
        duration = draw(st.integers(1, 120))
        tasks.append(task(task_id, earliest=earliest, latest=max(earliest, 0) + slack, duration=duration))
    return tasks


@st.composite
def capacities(draw: st.DrawFn) -> Capacity:
    max_running = draw(st.integers(1, 3))
    committed = []
    for _ in range(draw(st.integers(0, max_running))):
        start = draw(st.integers(-60, 600))
        committed.append(Commitment(at(start), at(start + draw(st.integers(1, 240)))))
    return Capacity(max_running, tuple(committed))


def mean_at(forecast: Forecast, start: datetime, duration: timedelta) -> float:
    return round(forecast.mean(start, duration), 6)


@given(task_lists(), st.none() | forecasts(), capacities(), st.booleans())
def test_never_after_the_latest_start_nor_before_now(
    tasks: list[PlanTask], forecast: Forecast | None, capacity: Capacity, signal_low: bool
) -> None:
    for t, p in zip(tasks, plan(tasks, forecast, capacity, T0, signal_low=signal_low), strict=True):
        assert p.task_id == t.task_id
        assert p.release_at >= T0
        assert p.release_at >= t.earliest or p.kind is PlanKind.NO_SLACK
        assert p.release_at <= max(t.latest_start, T0)
        if forecast is None:
            assert p.kind in (PlanKind.THRESHOLD, PlanKind.NO_SLACK)


@given(task_lists(), forecasts())
def test_on_a_perfect_forecast_the_best_start_and_never_worse_than_at_once(
    tasks: list[PlanTask], forecast: Forecast
) -> None:
    # With room for everything each task gets the best start in its window: no start on a
    # minute (where every forecast point lies) is cheaper, and none earlier is as cheap.
    for t, p in zip(tasks, plan(tasks, forecast, ROOMY, T0, signal_low=False), strict=True):
        assert p.expected_intensity is not None
        if p.kind is PlanKind.NO_SLACK:
            continue
        earliest = max(t.earliest, T0)
        assert p.expected_intensity <= mean_at(forecast, earliest, t.duration)
        start = earliest
        while start <= t.latest_start:
            value = mean_at(forecast, start, t.duration)
            assert value >= p.expected_intensity
            if start < p.release_at:
                assert value > p.expected_intensity, f"{start} ties with the later {p.release_at}"
            start += minutes(1)


@settings(max_examples=200)
@given(task_lists(), forecasts(), capacities())
def test_capacity_is_never_exceeded(tasks: list[PlanTask], forecast: Forecast, capacity: Capacity) -> None:
    plans = plan(tasks, forecast, capacity, T0, signal_low=False)
    durations = {t.task_id: t.duration for t in tasks}
    # Runs that must happen (reservations, tasks with no slack) and the planned ones; a task
    # that found no room at all queues behind the others and is not a planned run.
    runs = [(c.start, c.end, c.count) for c in capacity.committed]
    runs += [(p.release_at, p.release_at + durations[p.task_id], 1) for p in plans if not p.over_capacity]
    for p in plans:
        if p.kind is not PlanKind.FORECAST or p.over_capacity:
            continue
        end = p.release_at + durations[p.task_id]
        for instant in {p.release_at} | {s for s, _, _ in runs if p.release_at <= s < end}:
            running = sum(n for s, e, n in runs if s <= instant < e)
            assert running <= capacity.max_running, f"{running} running at {instant}"


@given(task_lists(), forecasts())
def test_with_room_for_everything_no_task_is_over_capacity(tasks: list[PlanTask], forecast: Forecast) -> None:
    pool = Capacity(max_running=len(tasks))
    assert not any(p.over_capacity for p in plan(tasks, forecast, pool, T0, signal_low=False))


@given(task_lists())
def test_a_task_without_slack_runs_at_once(tasks: list[PlanTask]) -> None:
    forecast = half_hourly(*[100.0] * 40, start=-30)
    for t, p in zip(tasks, plan(tasks, forecast, Capacity(1), T0, signal_low=False), strict=True):
        if t.latest_start <= max(t.earliest, T0):
            assert p.kind is PlanKind.NO_SLACK
            assert p.release_at == max(T0, t.latest_start)


@given(task_lists(), st.floats(0, 1000, allow_nan=False))
def test_on_a_flat_forecast_every_task_starts_as_early_as_it_may(tasks: list[PlanTask], value: float) -> None:
    forecast = half_hourly(*[value] * 40, start=-30)
    for t, p in zip(tasks, plan(tasks, forecast, ROOMY, T0, signal_low=False), strict=True):
        assert p.release_at == min(max(t.earliest, T0), max(t.latest_start, T0))
