"""A forecast keeps the scores it took (domain.forecast): the same start, span and caution score
the same, whether taken again or anew, and the scores kept stay within their bound."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

import scheduler_service.domain.forecast as forecast_module
from scheduler_service.domain.forecast import Forecast

AT = datetime(2026, 3, 1, tzinfo=UTC)
HOUR = timedelta(hours=1) // timedelta(microseconds=1)
POINTS = [(AT + timedelta(hours=i), 100.0 + 10 * i, 0.1) for i in range(10)]


def test_a_score_taken_again_is_the_score_taken_anew() -> None:
    kept = Forecast.of(POINTS)
    first = [kept.score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    again = [kept.score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    anew = [Forecast.of(POINTS).score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    assert first == again == anew
    # The caution counts: one expected error (10 %) above the mean.
    assert first[8 + 1] == pytest.approx(first[1] * 1.1)


def test_the_scores_kept_stay_within_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast_module, "_SCORES_KEPT", 3)
    kept = Forecast.of(POINTS)
    for i in range(8):
        kept.score(i * HOUR, HOUR, 1.0)
    assert 0 < len(kept._scores) <= 3
    # A forecast made from another keeps none of its scores.
    assert Forecast.of(POINTS)._scores == {}


def test_two_threads_scoring_at_once_get_the_scores_one_gets_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader plans in a thread while submits are planned on the event loop, on the same
    forecast: its kept scores are shared, with no lock (see Forecast._scores). A small bound
    makes them clear often while the other thread scores."""
    monkeypatch.setattr(forecast_module, "_SCORES_KEPT", 5)
    starts = [(i * HOUR // 7, HOUR, c) for c in (0.0, 0.5, 1.0) for i in range(60)]
    alone = [Forecast.of(POINTS).score(*key) for key in starts]
    shared = Forecast.of(POINTS)

    def score(times: int) -> list[list[float]]:
        return [[shared.score(*key) for key in starts] for _ in range(times)]

    # Threads switched as often as the interpreter can, so the two interleave within a score.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            both = list(pool.map(score, [200, 200]))
    finally:
        sys.setswitchinterval(switch)
    assert all(scores == alone for scored in both for scores in scored)
    assert len(shared._scores) <= 5 + 2
