"""The rate a worker stream may send its costly messages at (domain.allowance)."""

from __future__ import annotations

from scheduler_service.domain.token_bucket import TokenBucket as Allowance


def test_a_burst_then_the_rate() -> None:
    allowance = Allowance(rate=50, burst=100)
    assert all(allowance.take(10.0) for _ in range(100))
    assert not allowance.take(10.0)
    # Half a second later: 25 more.
    assert [allowance.take(10.5) for _ in range(26)] == [True] * 25 + [False]


def test_a_pause_refills_up_to_the_burst_only() -> None:
    allowance = Allowance(rate=50, burst=100)
    assert allowance.take(0.0)
    assert sum(allowance.take(3600.0) for _ in range(150)) == 100


def test_a_steady_sender_under_the_rate_is_never_refused() -> None:
    allowance = Allowance(rate=50, burst=100)
    # Twenty a second (five times what a worker checking its holds every 250 ms can send), for a minute.
    assert all(allowance.take(n * 0.05) for n in range(1_200))
