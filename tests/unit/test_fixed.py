"""Fixed-start decisions: capacity, admission windows, hold lead, hits and misses."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.fixed import (
    FixedStart,
    Interval,
    Miss,
    MissFacts,
    MissPolicy,
    Reservation,
    admit,
    admit_all,
    hold_lead,
    is_hit,
    miss_reason,
    p90,
    reservation_capacity,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def window(start: float, end: float) -> Interval:
    return Interval(at(start), at(end))


@pytest.mark.parametrize(("workers", "capacity"), [(1, 1), (2, 1), (3, 1), (10, 5)])
def test_half_of_the_pool_is_reservable_and_at_least_one(workers: int, capacity: int) -> None:
    assert reservation_capacity(workers, 0.5) == capacity


def test_the_window_spans_tolerance_before_and_duration_plus_tolerance_after() -> None:
    fixed = FixedStart(at(10), timedelta(seconds=5), MissPolicy.RUN_LATE, timedelta(minutes=3))
    assert fixed.window == Interval(at(10) - timedelta(seconds=5), at(13) + timedelta(seconds=5))


def test_admission_refuses_the_first_stretch_over_capacity() -> None:
    existing = [Reservation(1, window(0, 10)), Reservation(2, window(5, 15))]
    assert admit(window(20, 30), existing, capacity=1) is None
    conflict = admit(window(8, 12), existing, capacity=2)
    assert conflict is not None
    assert conflict.conflict == window(8, 10)
    assert conflict.task_ids == (1, 2)
    assert admit(window(12, 14), existing, capacity=2) is None


def test_touching_windows_do_not_overlap() -> None:
    assert admit(window(10, 20), [Reservation(1, window(0, 10))], capacity=1) is None


def test_a_batch_is_admitted_in_order_against_itself() -> None:
    result = admit_all([(0, window(0, 10)), (1, window(5, 8))], [], capacity=1)
    assert result is not None and result[0] == 1


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 30)), max_size=25), st.integers(1, 4))
def test_admitted_windows_never_overlap_more_than_capacity(spans: list[tuple[int, int]], capacity: int) -> None:
    accepted: list[Reservation] = []
    for i, (start, length) in enumerate(spans):
        new = window(start, start + length)
        if admit(new, accepted, capacity) is None:
            accepted.append(Reservation(i, new))
    for minute in range(0, 131):
        instant = Interval(at(minute), at(minute + 0.5))
        assert sum(r.window.overlaps(instant) for r in accepted) <= capacity


def test_hold_lead_follows_the_pools_run_times_within_bounds() -> None:
    max_hold = timedelta(minutes=5)
    assert hold_lead(timedelta(seconds=1), None, max_hold) == timedelta(seconds=1)
    assert hold_lead(timedelta(seconds=1), 30.0, max_hold) == timedelta(seconds=30)
    assert hold_lead(timedelta(seconds=1), 3600.0, max_hold) == max_hold
    assert hold_lead(timedelta(seconds=40), 30.0, max_hold) == timedelta(seconds=40)


def test_p90_of_run_times() -> None:
    assert p90([]) is None
    assert p90([float(i) for i in range(1, 11)]) == 9.0
    assert p90([2.0]) == 2.0


def test_hits() -> None:
    assert is_hit(at(0) + timedelta(milliseconds=900), at(0), timedelta(seconds=1))
    assert not is_hit(at(0) + timedelta(seconds=2), at(0), timedelta(seconds=1))
    assert is_hit(at(0), at(0), timedelta(0))
    # Tolerance 0: the first scheduling step at or after the time counts; later is a miss.
    assert is_hit(at(0) + timedelta(milliseconds=30), at(0), timedelta(0))
    assert not is_hit(at(0) + timedelta(milliseconds=200), at(0), timedelta(0))


# Miss reasons: what really happened, most decisive first.
TEN = MissFacts(
    pool="ten", queue="default", activity_type="work", start_at=at(0), workers_in_pool=3, workers_for_type=3
)


def facts(**changes: object) -> MissFacts:
    return replace(TEN, **changes)  # type: ignore[arg-type]


def test_a_start_while_no_scheduler_ran_says_so_whatever_the_slots() -> None:
    down = facts(scheduler_ran=False, down_from=at(-1), down_to=at(2), slots=30)
    assert miss_reason(down) == Miss(
        "scheduler_down",
        "the scheduler was not running at the start time "
        "(down from 2026-06-01T11:59:00+00:00 to 2026-06-01T12:02:00+00:00)",
    )
    assert miss_reason(facts(scheduler_ran=False, down_to=at(2))).message == (
        "the scheduler was not running at the start time (down to 2026-06-01T12:02:00+00:00)"
    )


def test_a_paused_queue_or_late_dependencies() -> None:
    assert miss_reason(facts(queue_paused=True, slots=30)) == Miss("queue_paused", "queue default was paused")
    assert miss_reason(facts(dependencies_pending=True, slots=30)) == Miss(
        "dependencies", "its dependencies had not completed by the start + tolerance"
    )


def test_no_worker_of_the_pool_or_none_that_runs_the_type() -> None:
    assert miss_reason(facts(workers_in_pool=0, workers_for_type=0)) == Miss(
        "no_worker", "no worker of pool ten connected"
    )
    assert miss_reason(facts(workers_for_type=0)) == Miss(
        "no_worker_for_type", "no worker of pool ten runs activity type work on queue default"
    )


def test_no_free_slot_says_what_took_the_slots() -> None:
    assert miss_reason(facts(slots=2, busy=2, busy_fixed=1)) == Miss(
        "no_free_slot",
        "no free slot: all 2 slots of the workers of pool ten that run it were busy (1 with regular work)",
    )
    assert miss_reason(facts(slots=1, busy=1)).message == (
        "no free slot: the one slot of the workers of pool ten that run it was busy (1 with regular work)"
    )
    assert miss_reason(facts(slots=3, busy=2, busy_fixed=2, held_for_others=1)) == Miss(
        "capacity_fixed",
        "held capacity in use by other fixed tasks: all 3 slots of the workers of pool ten that run it ran or were "
        "held for other fixed starts",
    )


def test_free_slots_are_never_called_capacity_in_use() -> None:
    assert miss_reason(facts(slots=30)) == Miss(
        "not_dispatched",
        "not dispatched by the start + tolerance although 30 slots of the workers of pool ten that run it were free",
    )
    assert miss_reason(facts(slots=30, needs_resources=True)) == Miss(
        "resources", "the resources it needs were not free"
    )
    assert "1 slot of" in miss_reason(facts(slots=1)).message and "was free" in miss_reason(facts(slots=1)).message
