"""A forecast keeps the scores it took (domain.forecast): the same start, span and caution score
the same, whether taken again or anew, and the scores kept stay within their bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import scheduler_service.domain.forecast as forecast_module
from scheduler_service.domain.forecast import Forecast

AT = datetime(2026, 3, 1, tzinfo=UTC)
HOUR = timedelta(hours=1) // timedelta(microseconds=1)
POINTS = [(AT + timedelta(hours=i), 100.0 + 10 * i, 0.1) for i in range(10)]


def test_a_score_taken_again_is_the_score_taken_anew() -> None:
    kept = Forecast.of(POINTS)
    first = [kept._score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    again = [kept._score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    anew = [Forecast.of(POINTS)._score(i * HOUR, HOUR, c) for c in (0.0, 1.0) for i in range(8)]
    assert first == again == anew
    # The caution counts: one expected error (10 %) above the mean.
    assert first[8 + 1] == pytest.approx(first[1] * 1.1)


def test_the_scores_kept_stay_within_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast_module, "_SCORES_KEPT", 3)
    kept = Forecast.of(POINTS)
    for i in range(8):
        kept._score(i * HOUR, HOUR, 1.0)
    assert 0 < len(kept._scores) <= 3
    # A forecast made from another keeps none of its scores.
    assert Forecast.of(POINTS)._scores == {}
