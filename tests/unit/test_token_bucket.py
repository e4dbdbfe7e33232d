"""The rate a worker stream may send its costly messages at (domain.token_bucket)."""

from __future__ import annotations

from scheduler_service.domain.token_bucket import TokenBucket


def test_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=50, burst=100)
    assert all(bucket.take(10.0) for _ in range(100))
    assert not bucket.take(10.0)
    # Half a second later: 25 more.
    assert [bucket.take(10.5) for _ in range(26)] == [True] * 25 + [False]


def test_a_pause_refills_up_to_the_burst_only() -> None:
    bucket = TokenBucket(rate=50, burst=100)
    assert bucket.take(0.0)
    assert sum(bucket.take(3600.0) for _ in range(150)) == 100


def test_a_steady_sender_under_the_rate_is_never_refused() -> None:
    bucket = TokenBucket(rate=50, burst=100)
    # Twenty a second (five times what a worker checking its holds every 250 ms can send), for a minute.
    assert all(bucket.take(n * 0.05) for n in range(1_200))
