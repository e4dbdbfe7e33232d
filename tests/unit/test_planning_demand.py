"""Planning beside the work expected to come: a pool too small for every task in the cheapest
window keeps it for the tasks that will have no other, a pending task never loses its room to
work that has not come, and the expected work is the last day's submissions again."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from unittest.mock import patch

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler_service.domain import planning
from scheduler_service.domain.demand import Submitted, expected_arrivals
from scheduler_service.domain.planning import Capacity, Forecast, PlanKind, PlanTask, plan
from tests.unit.test_planning import ROOMY, T0, at, capacities, forecasts, minutes, task, task_lists

ONE = Capacity(1)
HALF_HOUR = timedelta(minutes=30)


def test_the_cheap_window_is_left_to_expected_work_that_has_no_other() -> None:
    # Now 110; a night at 50 in an hour; after it 200. A pending task could run now or at night;
    # a task expected in 45 minutes, with half an hour of slack, has only the night or 200.
    forecast = Forecast.of([(at(0), 110.0), (at(30), 120.0), (at(60), 50.0), (at(90), 200.0), (at(120), 200.0)])
    pending = task(1, latest=90, duration=30)
    alone = plan([pending], forecast, ONE, T0, signal_low=False, resolution=HALF_HOUR)
    assert alone[0].release_at == at(60)
    coming = PlanTask(-1, at(45), at(75), HALF_HOUR)
    [chosen] = plan([pending], forecast, ONE, T0, signal_low=False, resolution=HALF_HOUR, expected=[coming])
    assert (chosen.release_at, chosen.kind, chosen.over_capacity) == (T0, PlanKind.FORECAST, False)
    # Two slots hold both: the pending task takes the night again.
    [both] = plan([pending], forecast, Capacity(2), T0, signal_low=False, resolution=HALF_HOUR, expected=[coming])
    assert both.release_at == at(60)


def test_a_pending_task_keeps_the_night_when_its_other_starts_cost_more_than_the_expected_works() -> None:
    # Now 300: moving the pending task costs 250, moving the expected one costs 150 (to 200).
    forecast = Forecast.of([(at(0), 300.0), (at(30), 300.0), (at(60), 50.0), (at(90), 200.0), (at(120), 200.0)])
    pending = task(1, latest=90, duration=30)
    coming = PlanTask(-1, at(45), at(75), HALF_HOUR)
    [chosen] = plan([pending], forecast, ONE, T0, signal_low=False, resolution=HALF_HOUR, expected=[coming])
    assert chosen.release_at == at(60)


def test_a_pending_task_is_never_refused_room_for_expected_work() -> None:
    # The only start of the pending task is where the expected work was planned.
    forecast = Forecast.of([(at(0), 100.0), (at(60), 50.0), (at(90), 100.0)])
    pending = task(1, earliest=60, latest=60, duration=30)
    coming = [PlanTask(-n, at(50), at(80), HALF_HOUR) for n in range(1, 4)]
    [chosen] = plan([pending], forecast, ONE, T0, signal_low=False, resolution=HALF_HOUR, expected=coming)
    assert (chosen.release_at, chosen.over_capacity) == (at(60), False)
    # Nor with slack, the expected work filling every slot.
    roomy = task(1, latest=60, duration=30)
    [chosen] = plan([roomy], forecast, ONE, T0, signal_low=False, resolution=HALF_HOUR, expected=coming)
    assert not chosen.over_capacity


def test_expected_work_is_the_last_days_submissions_a_day_later() -> None:
    day = timedelta(days=1)
    recent = [
        Submitted(T0 - day, timedelta(hours=8), HALF_HOUR),  # a day ago exactly: expected now, not ahead
        Submitted(T0 - timedelta(hours=23), timedelta(hours=8), HALF_HOUR, count=2),
        Submitted(T0 - timedelta(hours=2), timedelta(hours=4), timedelta(minutes=10)),
        Submitted(T0 - timedelta(days=3), timedelta(hours=8), HALF_HOUR),  # too old
        Submitted(T0 + timedelta(hours=1), timedelta(hours=8), HALF_HOUR),  # not yet submitted
    ]
    expected = expected_arrivals(recent, T0)
    assert [(t.earliest, t.latest_start, t.duration) for t in expected] == [
        (T0 + timedelta(hours=1), T0 + timedelta(hours=9), HALF_HOUR),
        (T0 + timedelta(hours=1), T0 + timedelta(hours=9), HALF_HOUR),
        (T0 + timedelta(hours=22), T0 + timedelta(hours=26), timedelta(minutes=10)),
    ]
    assert [t.task_id for t in expected] == [-1, -2, -3]
    assert len(expected_arrivals(recent, T0, limit=2)) == 2


@st.composite
def expected_lists(draw: st.DrawFn) -> list[PlanTask]:
    coming = []
    for n in range(1, draw(st.integers(0, 6)) + 1):
        earliest = draw(st.integers(1, 300))
        slack = draw(st.integers(0, 300))
        coming.append(PlanTask(-n, at(earliest), at(earliest + slack), minutes(draw(st.integers(1, 120)))))
    return coming


@settings(max_examples=200)
@given(task_lists(), forecasts(), capacities(), expected_lists(), st.lists(st.none() | st.integers(-60, 600)))
# Found by hypothesis: the auction (run only beside expected work) weighs scores, not room, and
# gave task 1 a start as cheap as the greedy plan's that left task 3 none (2 tasks without room
# against 1 alone).
@example(
    tasks=[
        task(1, latest=15, duration=21),
        task(2, latest=1, duration=1),
        task(3, earliest=1, latest=35, duration=20),
        task(4, latest=6, duration=1),
        task(5, latest=1, duration=1),
    ],
    forecast=Forecast.of([(at(0), 0.0), (at(9), 1.0), (at(960), 0.0)], end=at(1020)),
    capacity=ONE,
    coming=[PlanTask(-1, at(1), at(1), minutes(1))],
    last=[],
)
def test_beside_expected_work_never_after_the_latest_start_and_capacity_never_exceeded(
    tasks: list[PlanTask], forecast: Forecast, capacity: Capacity, coming: list[PlanTask], last: list[int | None]
) -> None:
    tasks = [
        replace(t, planned=None if m is None else at(m))
        for t, m in zip(tasks, (last + [None] * len(tasks))[: len(tasks)], strict=True)
    ]
    plans = plan(tasks, forecast, capacity, T0, signal_low=False, expected=coming)
    assert [p.task_id for p in plans] == [t.task_id for t in tasks]
    durations = {t.task_id: t.duration for t in tasks}
    for t, p in zip(tasks, plans, strict=True):
        assert T0 <= p.release_at <= max(t.latest_start, T0)
    # The given tasks and the commitments never over-book the pool (expected work takes no
    # room from them).
    runs = [(c.start, c.end, c.count) for c in capacity.committed]
    runs += [(p.release_at, p.release_at + durations[p.task_id], 1) for p in plans if not p.over_capacity]
    for p in plans:
        if p.kind is not PlanKind.FORECAST or p.over_capacity:
            continue
        end = p.release_at + durations[p.task_id]
        for instant in {p.release_at} | {s for s, _, _ in runs if p.release_at <= s < end}:
            assert sum(n for s, e, n in runs if s <= instant < e) <= capacity.max_running
    # Expected work never leaves a given task without room that it had without it.
    alone = plan(tasks, forecast, capacity, T0, signal_low=False)
    assert {p.task_id for p in plans if p.over_capacity} <= {p.task_id for p in alone if p.over_capacity}


@given(task_lists(), forecasts(), expected_lists())
def test_with_room_for_everything_expected_work_changes_nothing(
    tasks: list[PlanTask], forecast: Forecast, coming: list[PlanTask]
) -> None:
    assert plan(tasks, forecast, ROOMY, T0, signal_low=False, expected=coming) == plan(
        tasks, forecast, ROOMY, T0, signal_low=False
    )


@settings(max_examples=200)
@given(task_lists(), forecasts(), capacities(), expected_lists())
def test_a_plan_too_large_for_the_auction_still_keeps_the_latest_start_and_the_pool(
    tasks: list[PlanTask], forecast: Forecast, capacity: Capacity, coming: list[PlanTask]
) -> None:
    # Beyond its bound of work the auction is not run: expected work takes room greedily.
    with patch.object(planning, "AUCTION_WORK", 0):
        plans = plan(tasks, forecast, capacity, T0, signal_low=False, expected=coming)
        alone = plan(tasks, forecast, capacity, T0, signal_low=False)
    assert {p.task_id for p in plans if p.over_capacity} <= {p.task_id for p in alone if p.over_capacity}
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


def test_too_large_for_the_auction_the_cheap_window_is_still_left_to_expected_work() -> None:
    forecast = Forecast.of([(at(0), 110.0), (at(30), 120.0), (at(60), 50.0), (at(90), 200.0), (at(120), 200.0)])
    coming = PlanTask(-1, at(45), at(75), HALF_HOUR)
    with patch.object(planning, "AUCTION_WORK", 0):
        [chosen] = plan(
            [task(1, latest=90, duration=30)],
            forecast,
            ONE,
            T0,
            signal_low=False,
            resolution=HALF_HOUR,
            expected=[coming],
        )
    assert chosen.release_at == T0
