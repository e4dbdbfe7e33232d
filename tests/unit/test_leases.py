"""The lease a worker gets, busy or idle (domain.leases), without I/O."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler_service.domain.leases import LeaseState, LeaseTerms, lease_left, renewal

TERMS = LeaseTerms.of(lease_timeout=timedelta(seconds=10), idle_heartbeat_interval=timedelta(seconds=30))
times = st.floats(min_value=0, max_value=1e5, allow_nan=False)


def test_the_terms_are_the_lease_busy_and_the_idle_interval_plus_the_lease_idle() -> None:
    assert (TERMS.busy, TERMS.idle) == (10.0, 40.0)


def test_an_idle_worker_heard_from_keeps_its_lease_for_the_idle_interval_plus_the_lease() -> None:
    state = LeaseState(heard_at=100.0, heard=True, leased_slots=4)
    assert renewal(state, busy=False, slots=4, now=100.5, terms=TERMS) == 39.5
    assert (state.heard, state.leased_busy) == (False, False)


def test_nothing_is_renewed_for_a_worker_not_heard_from_whose_state_and_slots_stand() -> None:
    state = LeaseState(heard_at=100.0, leased_busy=False, leased_slots=4)
    assert renewal(state, busy=False, slots=4, now=110.0, terms=TERMS) is None


def test_a_new_idle_session_gets_its_idle_lease_at_the_first_tick_without_a_heartbeat() -> None:
    # Its hello recorded the busy length; the first tick finds it idle and lengthens it.
    state = LeaseState(heard_at=100.0, leased_slots=4)
    assert renewal(state, busy=False, slots=4, now=101.0, terms=TERMS) == 39.0


def test_a_changed_slot_count_is_recorded_without_a_heartbeat() -> None:
    state = LeaseState(heard_at=100.0, leased_busy=False, leased_slots=4)
    assert renewal(state, busy=False, slots=0, now=105.0, terms=TERMS) == 35.0
    assert state.leased_slots == 0


def test_work_sent_to_a_worker_silent_for_long_runs_the_busy_lease_from_when_it_was_sent() -> None:
    # Heard 25 s ago while idle (15 s of its idle lease left), then given work: 10 s from now,
    # neither 15 s (the idle lease) nor -15 s (10 s from when it was last heard).
    state = LeaseState(heard_at=100.0, leased_busy=False, leased_slots=4)
    assert renewal(state, busy=True, slots=4, now=125.0, terms=TERMS) == 10.0
    # Still silent a tick later: nothing to record, and the lease runs out as set.
    assert renewal(state, busy=True, slots=4, now=126.0, terms=TERMS) is None
    assert lease_left(state, busy=True, now=135.0, terms=TERMS) == 0.0


def test_a_worker_that_finishes_its_work_gets_the_idle_lease_from_when_it_was_last_heard() -> None:
    state = LeaseState(heard_at=100.0, busy_since=90.0, leased_busy=True, leased_slots=4)
    assert renewal(state, busy=False, slots=4, now=101.0, terms=TERMS) == 39.0
    assert state.busy_since is None


@given(heard_at=times, since=times, ahead=st.floats(min_value=0, max_value=1e4, allow_nan=False))
# Found by hypothesis: renewed the moment it went busy, (since + 10 s) - now came to 10.000000000000004 s.
@example(heard_at=0.0, since=22.69094555348057, ahead=0.0)
def test_a_busy_lease_never_runs_longer_than_the_lease_timeout(heard_at: float, since: float, ahead: float) -> None:
    now = max(heard_at, since) + ahead
    state = LeaseState(heard_at=heard_at, busy_since=since)
    assert lease_left(state, busy=True, now=now, terms=TERMS) <= TERMS.busy


@given(heard_at=times, ahead=st.floats(min_value=0, max_value=1e4, allow_nan=False), busy=st.booleans())
def test_a_worker_heard_from_just_now_gets_the_full_lease_for_its_state(
    heard_at: float, ahead: float, busy: bool
) -> None:
    state = LeaseState(heard_at=heard_at + ahead, heard=True, leased_busy=not busy)
    left = renewal(state, busy=busy, slots=0, now=heard_at + ahead, terms=TERMS)
    assert left == pytest.approx(TERMS.busy if busy else TERMS.idle)
