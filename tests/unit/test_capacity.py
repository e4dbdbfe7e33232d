"""Desired capacity: workers for the claimable backlog, what runs and the reservations ahead."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.capacity import desired_workers


def test_no_work_wants_no_workers() -> None:
    assert desired_workers(claimable=0, running=0, slots_per_worker=4) == 0


def test_backlog_and_running_round_up_to_whole_workers() -> None:
    assert desired_workers(claimable=9, running=0, slots_per_worker=4) == 3
    assert desired_workers(claimable=5, running=3, slots_per_worker=4) == 2
    assert desired_workers(claimable=0, running=1, slots_per_worker=8) == 1


def test_each_reservation_ahead_takes_a_slot() -> None:
    assert desired_workers(claimable=4, running=0, slots_per_worker=4, reserved=1) == 2


def test_bounds_apply_last() -> None:
    assert desired_workers(claimable=0, running=0, slots_per_worker=4, min_workers=2) == 2
    assert desired_workers(claimable=100, running=0, slots_per_worker=4, max_workers=5) == 5


def test_a_worker_has_at_least_one_slot() -> None:
    assert desired_workers(claimable=3, running=0, slots_per_worker=0) == 3


@given(
    claimable=st.integers(0, 10_000),
    running=st.integers(0, 10_000),
    slots=st.integers(1, 256),
    reserved=st.integers(0, 100),
)
def test_enough_slots_and_never_a_whole_worker_too_many(
    claimable: int, running: int, slots: int, reserved: int
) -> None:
    wanted = desired_workers(claimable=claimable, running=running, slots_per_worker=slots, reserved=reserved)
    need = claimable + running + reserved
    assert wanted * slots >= need
    assert (wanted - 1) * slots < need or wanted == 0
