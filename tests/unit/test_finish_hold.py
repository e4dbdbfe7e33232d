"""A worker's report waits for the next group of single submits as long as their pace says one is
due (MAX_HOLD at most, MIN_HOLD at least), and not at all under a trickle or once they stopped."""

from __future__ import annotations

import pytest

from scheduler_service.domain.finish_hold import MAX_HOLD, MIN_HOLD, SubmitPace


def _paced(gap: float, count: int = 20) -> SubmitPace:
    pace = SubmitPace()
    for i in range(count):
        pace.submitted(i * gap)
    return pace


def test_no_submit_yet_or_only_one_means_no_wait() -> None:
    assert SubmitPace().hold(0.0) == 0.0
    one = SubmitPace()
    one.submitted(5.0)
    assert one.hold(5.001) == 0.0


@pytest.mark.parametrize("rate", [100, 300, 1000])
def test_a_steady_flow_is_waited_for_one_gap(rate: int) -> None:
    gap = 1 / rate
    pace = _paced(gap)
    last = 19 * gap
    # A report some milliseconds after the last submit waits a gap: the next one comes within it.
    assert pace.hold(last + gap / 3) == pytest.approx(max(gap, MIN_HOLD))
    assert pace.hold(last + gap / 3) <= MAX_HOLD


@pytest.mark.parametrize("rate", [1, 10, 50])
def test_a_trickle_is_not_waited_for(rate: int) -> None:
    pace = _paced(1 / rate)
    assert pace.hold(19 / rate + 0.003) == 0.0


def test_a_flow_that_stopped_is_not_waited_for() -> None:
    pace = _paced(0.005)
    last = 19 * 0.005
    assert pace.hold(last + 0.002) > 0
    assert pace.hold(last + 0.05) == 0.0


def test_a_burst_waits_the_least_and_a_pause_ends_it() -> None:
    pace = _paced(0.0)
    assert pace.hold(0.0005) == MIN_HOLD
    assert pace.hold(0.5) == 0.0


def test_one_long_pause_does_not_keep_the_mean_up_for_long() -> None:
    pace = _paced(0.003)
    pace.submitted(19 * 0.003 + 3600.0)
    for i in range(1, 25):
        pace.submitted(19 * 0.003 + 3600.0 + i * 0.003)
    assert 0 < pace.hold(19 * 0.003 + 3600.0 + 24 * 0.003 + 0.001) <= MAX_HOLD
