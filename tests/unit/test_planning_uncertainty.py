"""Planning on a forecast that states its expected error: a window that only looks cheaper
because of noise is not waited for, zero error plans as before, and re-planning on a perfect
forecast is never worse than planning once."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_service.domain.planning import Capacity, Forecast, PlanKind, PlanTask, plan
from scheduler_service.domain.pool_share import contended_share
from tests.unit.test_planning import ROOMY, T0, at, capacities, forecasts, mean_at, minutes, task, task_lists


def with_errors(forecast: Forecast, errors: list[float]) -> Forecast:
    """The same points, each stating an expected error (cycled; the first point states none)."""
    points = [(forecast.time_of(t), v) for t, v in zip(forecast.times, forecast.values, strict=True)]
    stated = [(when, value, 0.0 if i == 0 else errors[i % len(errors)]) for i, (when, value) in enumerate(points)]
    return Forecast.of(stated, end=forecast.end)


error_lists = st.lists(st.floats(0, 0.5, allow_nan=False), min_size=1, max_size=8)


def test_a_dip_within_the_noise_is_not_waited_for_and_a_real_one_is() -> None:
    # Now 100 (known); in an hour 97, but a forecast that far ahead is off by 15 %.
    noisy = Forecast.of([(at(0), 100.0, 0.0), (at(30), 120.0, 0.05), (at(60), 97.0, 0.15), (at(90), 130.0, 0.15)])
    assert plan([task(latest=90)], noisy, ROOMY, T0, signal_low=False)[0].release_at == T0
    # Planned on its values alone it waits for the 97.
    assert plan([task(latest=90)], noisy, ROOMY, T0, signal_low=False, caution=0)[0].release_at == at(60)
    # A dip well beyond the noise is still waited for, and the plan states the forecast mean.
    deep = Forecast.of([(at(0), 100.0, 0.0), (at(30), 120.0, 0.05), (at(60), 60.0, 0.15), (at(90), 130.0, 0.15)])
    chosen = plan([task(latest=90)], deep, ROOMY, T0, signal_low=False)[0]
    assert (chosen.release_at, chosen.expected_intensity) == (at(60), 60.0)
    assert "allowing for its expected error" in chosen.reason


def test_a_re_plan_keeps_the_last_plan_unless_a_start_is_surely_better() -> None:
    forecast = Forecast.of([(at(0), 100.0, 0.0), (at(30), 95.0, 0.02), (at(60), 90.0, 0.1), (at(90), 60.0, 0.1)])
    # Planned afresh, 90 at an hour is not surely under 100 (and 95 at half an hour is): half an hour.
    assert plan([task(latest=60)], forecast, ROOMY, T0, signal_low=False)[0].release_at == at(30)
    # Planned for the hour before, the plan stays (95 allowing for its error is not under 90).
    kept = replace(task(latest=60), planned=at(60))
    assert plan([kept], forecast, ROOMY, T0, signal_low=False)[0].release_at == at(60)
    # A start surely better than the plan is taken: 60 at 90 minutes, even at 66.
    moved = replace(task(latest=90), planned=at(60))
    assert plan([moved], forecast, ROOMY, T0, signal_low=False)[0].release_at == at(90)
    # A last plan outside the window counts for nothing.
    gone = replace(task(latest=30), planned=at(60))
    assert plan([gone], forecast, ROOMY, T0, signal_low=False)[0].release_at == at(30)


def test_tasks_sharing_a_full_pool_wait_for_a_dip_the_noise_keeps_a_lone_task_from() -> None:
    # Now 100 (known); in two hours 90, off by 15 % as every later point (130 elsewhere), each
    # point's error its own (a calibration learned that the next point shares none of it).
    values = [100.0, 130.0, 130.0, 130.0, 90.0, 130.0, 130.0, 130.0, 130.0]
    points = [(at(30 * i), v, 0.0 if i == 0 else 0.15) for i, v in enumerate(values)]
    six = [task(i, latest=240) for i in range(6)]

    def starts(capacity: Capacity, shared: float | None) -> list[datetime]:
        forecast = Forecast.of(points, error_shared=shared)
        return [p.release_at for p in plan(six, forecast, capacity, T0, signal_low=False)]

    # With room for all, none waits for it: the lowest of a window's noisy points is lower than
    # what comes, and 90 is not surely under 100.
    assert set(starts(ROOMY, 0.0)) == {T0}
    # Six tasks in a pool of two share its starts: they take about its three lowest, whose
    # forecasts are less far under what comes than the lowest alone, so each weighs the error
    # less. The first two to choose (equally tight: in the order given) take the dip's two runs
    # rather than starting now.
    assert starts(Capacity(2), 0.0)[:4] == [at(120), at(120), T0, T0]
    # Errors not known to be independent (a feed stating its own, or a short record), or shared
    # by the next point: the caution is weighed whole, and the first two start now.
    for shared in (None, 0.9):
        assert starts(Capacity(2), shared)[:4] == [T0, T0, at(120), at(120)]


def test_the_share_of_caution_falls_as_the_tasks_take_more_of_the_starts() -> None:
    def day(shared: float | None = 0.0) -> Forecast:
        return Forecast.of([(at(30 * i), 100.0, 0.1) for i in range(49)], error_shared=shared)

    def share(tasks: int, slots: int, hours: float = 4, shared: float | None = 0.0) -> float:
        return contended_share([task(i, latest=60 * hours) for i in range(tasks)], slots, T0, day(shared))

    # A task with the starts to itself keeps its caution; tasks taking every start keep none.
    assert share(1, 1) == 1.0
    assert share(9, 1) == 0.0
    # Between, the more tasks a slot, the less; the longer the window, the more.
    assert 1.0 > share(8, 4) > share(8, 2) > share(8, 1) > 0.0
    assert share(8, 2, hours=24) > share(8, 2)
    # The more of its error the next point shares, the fewer independent values to choose among,
    # and the more caution is kept; unknown, all of it.
    assert share(8, 2) < share(8, 2, shared=0.5) < share(8, 2, shared=0.9) <= 1.0
    assert share(8, 2, shared=None) == 1.0
    # Tasks without a choice choose no start.
    fixed = [task(i, latest=0) for i in range(8)]
    assert contended_share(fixed, 1, T0, day()) == 1.0


def test_of_two_equal_forecast_windows_the_nearer_and_surer_one() -> None:
    forecast = Forecast.of([(at(0), 300.0, 0.0), (at(30), 100.0, 0.05), (at(60), 300.0, 0.1), (at(90), 100.0, 0.2)])
    assert plan([task(latest=90)], forecast, ROOMY, T0, signal_low=False)[0].release_at == at(30)


@given(task_lists(), forecasts(), capacities())
def test_with_zero_error_or_no_caution_the_plan_is_as_before(
    tasks: list[PlanTask], forecast: Forecast, capacity: Capacity
) -> None:
    before = plan(tasks, forecast, capacity, T0, signal_low=False)
    assert plan(tasks, with_errors(forecast, [0.0]), capacity, T0, signal_low=False) == before
    blind = plan(tasks, with_errors(forecast, [0.1, 0.3]), capacity, T0, signal_low=False, caution=0)
    assert [(p.release_at, p.expected_intensity, p.kind, p.over_capacity) for p in blind] == [
        (p.release_at, p.expected_intensity, p.kind, p.over_capacity) for p in before
    ]


@settings(max_examples=200)
@given(task_lists(), forecasts(), capacities(), error_lists, st.lists(st.none() | st.integers(-60, 600)))
def test_with_errors_never_after_the_latest_start_and_capacity_never_exceeded(
    tasks: list[PlanTask], forecast: Forecast, capacity: Capacity, errors: list[float], last: list[int | None]
) -> None:
    # Some tasks come with a last plan (anywhere, in their window or not).
    tasks = [
        replace(t, planned=None if m is None else at(m))
        for t, m in zip(tasks, (last + [None] * len(tasks))[: len(tasks)], strict=True)
    ]
    plans = plan(tasks, with_errors(forecast, errors), capacity, T0, signal_low=False)
    durations = {t.task_id: t.duration for t in tasks}
    for t, p in zip(tasks, plans, strict=True):
        assert T0 <= p.release_at <= max(t.latest_start, T0)
    runs = [(c.start, c.end, c.count) for c in capacity.committed]
    runs += [(p.release_at, p.release_at + durations[p.task_id], 1) for p in plans if not p.over_capacity]
    for p in plans:
        if p.kind is PlanKind.FORECAST and not p.over_capacity:
            end = p.release_at + durations[p.task_id]
            for instant in {p.release_at} | {s for s, _, _ in runs if p.release_at <= s < end}:
                assert sum(n for s, e, n in runs if s <= instant < e) <= capacity.max_running


def _replanned(t: PlanTask, forecast: Forecast) -> datetime:
    """Where the task starts when planned again at every minute until it is released, each plan
    knowing the last one."""
    release = plan([t], forecast, ROOMY, T0, signal_low=False)[0].release_at
    now = T0 + minutes(1)
    while now < release:
        release = plan([replace(t, planned=release)], forecast, ROOMY, now, signal_low=False)[0].release_at
        now += minutes(1)
    return release


@settings(max_examples=60)
@given(task_lists(), forecasts())
def test_on_a_perfect_forecast_re_planning_is_never_worse_than_planning_once(
    tasks: list[PlanTask], forecast: Forecast
) -> None:
    for t, once in zip(tasks, plan(tasks, forecast, ROOMY, T0, signal_low=False), strict=True):
        again = _replanned(t, forecast)
        assert again <= max(t.latest_start, T0)
        assert mean_at(forecast, again, t.duration) <= mean_at(forecast, once.release_at, t.duration)


def test_a_longer_window_is_planned_with_its_own_lower_caution() -> None:
    # Now 100 (known); later 95, each point off by 10 %: at caution 1 not surely under 100, at
    # caution 0 it is. A caution falling with the window waits in a day's window, not in 4 hours'.
    ahead = [(at(30 * i), 95.0, 0.1) for i in range(1, 60)]
    forecast = Forecast.of([(at(0), 100.0, 0.0), *ahead])

    def by_window(window: timedelta) -> float:
        return 1.0 if window <= timedelta(hours=4) else 0.0

    short, long = task(1, latest=240), task(2, latest=24 * 60)
    plans = plan([short, long], forecast, ROOMY, T0, signal_low=False, caution=by_window)
    assert [p.release_at for p in plans] == [T0, at(30)]
    # The same with a pool (the auction) and with a caution of the task's own.
    plans = plan([short, long], forecast, Capacity(max_running=2), T0, signal_low=False, caution=by_window)
    assert [p.release_at for p in plans] == [T0, at(30)]
    own = replace(long, caution=1.0)
    assert plan([own], forecast, ROOMY, T0, signal_low=False, caution=by_window)[0].release_at == T0
    # One caution for every task, as before: both start now.
    assert [p.release_at for p in plan([short, long], forecast, ROOMY, T0, signal_low=False)] == [T0, T0]


def test_a_task_is_planned_with_the_caution_of_the_window_it_has_left() -> None:
    # As above; a task submitted 20 h ago with a day's window has 4 h left: a start now cannot be
    # undone, and what is left to wait for is a 4 h window's, planned with its caution.
    ahead = [(at(30 * i), 95.0, 0.1) for i in range(1, 60)]
    forecast = Forecast.of([(at(0), 100.0, 0.0), *ahead])

    def by_window(window: timedelta) -> float:
        return 1.0 if window <= timedelta(hours=4) else 0.0

    late = replace(task(1, latest=240), earliest=T0 - timedelta(hours=20))
    fresh = task(2, latest=24 * 60)
    plans = plan([late, fresh], forecast, ROOMY, T0, signal_low=False, caution=by_window)
    assert [p.release_at for p in plans] == [T0, at(30)]


def test_a_caution_by_window_is_taken_to_a_step_that_tasks_of_nearly_equal_windows_share() -> None:
    # Thousands of waiting tasks have windows a few minutes apart: each weighing its starts with
    # a caution of its own made each its own table of scored starts (a plan three times as dear).
    from scheduler_service.domain.planning import CAUTION_STEP, caution_of

    def by_window(window: timedelta) -> float:
        return 1.0 - window / timedelta(hours=24)

    # Sixty tasks a minute apart: their cautions span 0.04, a few steps.
    windows = [timedelta(hours=20, minutes=i) for i in range(60)]
    cautions = [caution_of(task(i, latest=w / timedelta(minutes=1)), by_window, T0) for i, w in enumerate(windows)]
    assert len(set(cautions)) <= 4
    assert all(abs(c - by_window(w)) <= CAUTION_STEP / 2 for c, w in zip(cautions, windows, strict=True))
    assert caution_of(task(1, latest=4 * 60), by_window, T0) not in cautions
    # A caution the same for every task, or a task's own, is taken as it is.
    assert caution_of(task(1, latest=60), 0.3, T0) == 0.3
    assert caution_of(replace(task(1, latest=60), caution=0.123), by_window, T0) == 0.123
