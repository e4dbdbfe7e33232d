"""The starts a plan weighs for a task (domain.starts): cut from one table scored once per
forecast, grid, span and caution, they are the starts scored for the task's window alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_service.domain.planning import Capacity, Forecast, PlanTask
from scheduler_service.domain.pool_load import Load
from scheduler_service.domain.starts import starts

NOW = datetime(2026, 6, 1, 12, 7, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(50, 400), min_size=8, max_size=40),
    errors=st.lists(st.sampled_from([0.0, 0.05, 0.2]), min_size=8, max_size=40),
    windows=st.lists(
        st.tuples(st.integers(-30, 600), st.integers(0, 900), st.sampled_from([0, 7, 30, 95]), st.integers(-1, 900)),
        min_size=1,
        max_size=6,
    ),
    step=st.sampled_from([1, 5, 30]),
    caution=st.sampled_from([0.0, 1.0, -0.5]),
)
def test_the_starts_cut_from_the_table_are_those_of_the_window_alone(
    values: list[int], errors: list[float], windows: list[tuple[int, int, int, int]], step: int, caution: float
) -> None:
    # Points every 30 minutes from 12:00, so that `now` (12:07) is off the grid.
    origin = NOW - 7 * MINUTE
    forecast = Forecast.of(
        [(origin + 30 * i * MINUTE, float(v), e) for i, (v, e) in enumerate(zip(values, errors, strict=False))]
    )
    tasks = []
    for i, (start, length, duration, kept) in enumerate(windows):
        earliest = NOW + start * MINUTE
        latest = earliest + length * MINUTE
        planned = None if kept < 0 else earliest + kept * MINUTE
        tasks.append(PlanTask(i, earliest, latest, duration * MINUTE, planned))
    load = Load.covering(tasks, Capacity(1), NOW, step * MINUTE)
    for t in tasks:
        earliest = max(t.earliest, NOW)
        # As the planner does: a task whose latest start has passed has no window to weigh (it
        # starts now), and one the forecast does not cover is planned on the threshold.
        if t.latest_start < earliest or not forecast.covers(earliest, t.latest_start + t.duration):
            continue
        # The first ask for a span and caution (on a load of its own) scores the window alone;
        # the second and later ones cut it from the table made for every window.
        alone = starts(t, forecast, Load.covering(tasks, Capacity(1), NOW, step * MINUTE), earliest, caution)
        starts(t, forecast, load, earliest, caution)
        assert starts(t, forecast, load, earliest, caution) == alone
    assert all(table is not None for _, table in load.memo.values())
