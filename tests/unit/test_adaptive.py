"""The adaptive concurrency limit (Vegas with a multiplicative decrease on failures): pure, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.adaptive import (
    AdaptiveSettings,
    LimitState,
    SampleRow,
    Window,
    classify,
    gather,
    initial_state,
    merge,
    next_limit,
    ready,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)

settings_strategy = st.builds(
    lambda low, span, backoff, tolerance: AdaptiveSettings(
        min=low, max=low + span, backoff=backoff, tolerance=tolerance
    ),
    st.integers(1, 50),
    st.integers(0, 500),
    st.floats(0.5, 1.0),
    st.floats(0.0, 0.2),
)

window_strategy = st.builds(
    lambda ok, failed, timed_out, latency, in_flight: Window(
        samples=ok + failed + timed_out,
        succeeded=ok,
        failed=failed,
        timed_out=timed_out,
        latency_ms=latency if ok else None,
        in_flight=in_flight,
    ),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.integers(0, 100),
    st.floats(0.01, 1e6),
    st.floats(0.0, 1e4),
)


def healthy(limit: float, latency: float = 100.0) -> Window:
    """A window of a type that uses its limit, with every attempt succeeding at `latency`."""
    return Window(samples=100, succeeded=100, latency_ms=latency, in_flight=limit)


def burst(limit: float, rate: float = 0.5) -> Window:
    failed = int(100 * rate)
    return Window(samples=100, succeeded=100 - failed, failed=failed, latency_ms=100.0, in_flight=limit)


@given(settings_strategy, st.lists(window_strategy, min_size=1, max_size=40), st.floats(-1e4, 1e4))
def test_the_limit_never_leaves_min_and_max(settings: AdaptiveSettings, windows: list[Window], start: float) -> None:
    state = LimitState(limit=start)
    now = T0
    for window in windows:
        now += SECOND
        state = next_limit(state, window, settings, now)
        assert settings.min <= state.limit <= settings.max
        assert settings.min <= state.value <= settings.max


@given(settings_strategy, st.floats(1.0, 1000.0), st.floats(0.21, 1.0))
def test_a_failure_burst_lowers_the_limit(settings: AdaptiveSettings, start: float, rate: float) -> None:
    state = LimitState(limit=min(settings.max, max(settings.min, start)))
    after = next_limit(state, burst(state.limit, rate), settings, T0)
    assert after.limit < state.limit or after.limit == settings.min
    assert not after.slow_start


@given(st.integers(2, 400), st.integers(1, 30))
def test_it_climbs_back_when_healthy(top: int, windows: int) -> None:
    settings = AdaptiveSettings(min=1, max=top)
    state = LimitState(limit=1.0, slow_start=False, baseline_ms=100.0, baseline_at=T0)
    now = T0
    for _ in range(windows):
        now += SECOND
        before = state.limit
        state = next_limit(state, healthy(state.limit), settings, now)
        assert state.limit > before or state.limit == top


def test_a_burst_at_200_is_down_near_20_within_a_few_windows() -> None:
    settings = AdaptiveSettings(min=1, max=200)
    state = LimitState(limit=200.0)
    for _ in range(3):
        state = next_limit(state, burst(state.limit, 0.9), settings, T0)
    assert state.value == 25


def test_run_time_far_above_the_baseline_lowers_the_limit_and_near_it_keeps_it() -> None:
    settings = AdaptiveSettings()
    state = LimitState(limit=40.0, baseline_ms=100.0, baseline_at=T0, slow_start=False)
    # queue = 40 x (1 - 100/200) = 20, above 6 x log10: it falls.
    assert next_limit(state, healthy(40, 200.0), settings, T0 + SECOND).limit == 39.0
    # queue = 40 x (1 - 100/110) = 3.6, between 3 and 6: it stays.
    assert next_limit(state, healthy(40, 110.0), settings, T0 + SECOND).limit == 40.0


def test_slow_start_climbs_by_six_steps_until_the_first_decrease() -> None:
    settings = AdaptiveSettings()
    state = initial_state(settings)
    state = next_limit(state, healthy(1), settings, T0)
    assert state.limit == 7.0
    state = next_limit(state, burst(7, 0.05), settings, T0 + SECOND)
    assert state.limit == pytest.approx(6.3)
    state = next_limit(state, healthy(6.3), settings, T0 + 2 * SECOND)
    assert state.limit == pytest.approx(7.3)


def test_a_type_limited_by_its_demand_keeps_its_limit() -> None:
    settings = AdaptiveSettings()
    state = LimitState(limit=50.0, baseline_ms=100.0, baseline_at=T0)
    after = next_limit(state, Window(samples=40, succeeded=40, latency_ms=100.0, in_flight=4.0), settings, T0)
    assert after.limit == 50.0
    assert after.reason.startswith("demand-limited")


def test_failures_within_the_tolerance_are_noise() -> None:
    settings = AdaptiveSettings(tolerance=0.02)
    state = LimitState(limit=20.0, baseline_ms=100.0, baseline_at=T0, slow_start=False)
    window = Window(samples=100, succeeded=99, failed=1, latency_ms=100.0, in_flight=20.0)
    assert next_limit(state, window, settings, T0).limit == 21.0


def test_the_baseline_is_measured_again_after_probe() -> None:
    settings = AdaptiveSettings(probe=timedelta(seconds=30))
    state = LimitState(limit=20.0, baseline_ms=100.0, baseline_at=T0, slow_start=False)
    kept = next_limit(state, healthy(20, 150.0), settings, T0 + 10 * SECOND)
    assert kept.baseline_ms == 100.0
    probed = next_limit(state, healthy(20, 150.0), settings, T0 + 30 * SECOND)
    assert probed.baseline_ms == 150.0 and probed.baseline_at == T0 + 30 * SECOND


def test_initial_defaults_to_min_and_is_clamped() -> None:
    assert initial_state(AdaptiveSettings(min=3, max=10)).limit == 3.0
    assert initial_state(AdaptiveSettings(min=3, max=10, initial=8)).limit == 8.0


def test_a_small_window_is_not_ready_and_merges_into_the_next() -> None:
    settings = AdaptiveSettings(min_samples=10)
    a = Window(samples=4, succeeded=4, latency_ms=100.0, in_flight=2.0)
    b = Window(samples=6, succeeded=5, failed=1, latency_ms=200.0, in_flight=4.0)
    assert not ready(a, settings)
    both = merge(a, b)
    assert ready(both, settings)
    assert both.samples == 10 and both.failed == 1
    assert both.latency_ms == (400 + 1000) / 9
    assert both.in_flight == (2 * 4 + 4 * 6) / 10


def test_what_an_ended_attempt_says_about_the_downstream() -> None:
    assert classify("completed", None, None) == "ok"
    assert classify("pending", "Unavailable", False) == "failed"
    assert classify("failed", "Unavailable", False) == "failed"
    assert classify("pending", "StartToCloseTimeout", False) == "timed_out"
    assert classify("pending", "HeartbeatTimeout", False) == "timed_out"
    assert classify("failed", "BadInput", True) is None
    assert classify("pending", "WorkerLost", False) is None
    assert classify("cancelled", None, None) is None


def test_windows_are_gathered_over_replicas() -> None:
    def row(replica: str, start: int, ok: int, failed: int, run_ms: float) -> SampleRow:
        return SampleRow(
            replica, "api", T0 + start * SECOND, T0 + (start + 1) * SECOND, ok, failed, 0, run_ms, run_ms * 0.5
        )

    # Replica a: two one-second rows with 10 s of run time: 5 in flight; replica b: 3 in flight.
    windows = gather([row("a", 0, 10, 0, 4000), row("a", 1, 10, 2, 6000), row("b", 0, 30, 0, 3000)])
    window = windows["api"]
    assert (window.samples, window.succeeded, window.failed) == (52, 50, 2)
    assert window.in_flight == 8.0
    assert window.latency_ms == (2000 + 3000 + 1500) / 50
