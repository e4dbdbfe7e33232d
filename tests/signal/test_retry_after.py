"""Retry-After on 429 and 503, for every feed (they share HttpJson): seconds or an HTTP-date,
at most an hour, and no request leaves before it has passed. Also the bound on a body's size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from signal_service.feeds.base import RETRY_AFTER_MAX, FeedError, HttpJson, RateLimited, Waiting, retry_after
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from tests.signal.grid_server import Answer, GridApi, grid_api
from tests.signal.test_feeds import uk_entry

NOW = datetime(2026, 12, 1, 14, 0, 0, tzinfo=UTC)
GOOD = Answer({"data": [uk_entry("2026-11-29T23:00Z", 99, 98)]})


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("Tue, 01 Dec 2026 14:00:30 GMT", 30.0),
        # A date already passed: go ahead.
        ("Tue, 01 Dec 2026 13:59:00 GMT", 0.0),
        # Asked for a day, or a date far off: an hour at most.
        ("86400", RETRY_AFTER_MAX),
        ("Wed, 02 Dec 2026 14:00:00 GMT", RETRY_AFTER_MAX),
        # Neither form: no wait from the header (the usual backoff applies).
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date_bounded_by_an_hour(header: str | None, wait: float | None) -> None:
    assert retry_after(header, NOW) == wait


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[GridApi]:
    with grid_api() as running:
        yield running


def http(api: GridApi, clock: Clock | None = None, **options: float) -> HttpJson:
    settings = {"timeout": 2.0, "attempts": 3, "backoff_initial": 0.01, "backoff_max": 0.02} | options
    if clock is None:
        return HttpJson(api.url, **settings)  # type: ignore[arg-type]
    return HttpJson(api.url, clock=clock, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [429, 503])
async def test_a_long_retry_after_ends_the_call_and_no_request_leaves_before_it(api: GridApi, status: int) -> None:
    api.on("/intensity", Answer({"error": "slow down"}, status=status, headers={"Retry-After": "120"}), GOOD)
    clock = Clock()
    feed = UkCarbonIntensity(http(api, clock))
    # Not retried within the call: the wait is far past the backoff's.
    with pytest.raises(RateLimited, match=f"HTTP {status}, asked to wait 120s"):
        await feed.current()
    assert len(api.requests) == 1
    # The runner's next poll comes no earlier ...
    assert feed.interval(5.0) == 120.0
    clock.now += 119.0
    assert feed.interval(0.1) == pytest.approx(1.0)
    # ... and a call before it sends nothing.
    with pytest.raises(Waiting, match="not sent"):
        await feed.current()
    assert len(api.requests) == 1
    clock.now += 1.0
    assert feed.interval(5.0) == 5.0
    assert (await feed.current()).value == 98.0
    assert len(api.requests) == 2
    await feed.aclose()


async def test_an_http_date_retry_after_is_obeyed_and_a_huge_one_is_capped_at_an_hour(api: GridApi) -> None:
    far = "Fri, 01 Jan 2027 00:00:00 GMT"
    api.on("/intensity", Answer("busy", status=503, headers={"Retry-After": far}))
    clock = Clock()
    feed = UkCarbonIntensity(http(api, clock))
    with pytest.raises(RateLimited):
        await feed.current()
    assert feed.interval(5.0) == RETRY_AFTER_MAX
    await feed.aclose()


async def test_a_short_retry_after_is_slept_within_the_call_and_the_request_retried(api: GridApi) -> None:
    # The date has a resolution of a second: the whole second it names, 2-3 s from now.
    named = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    soon = named.strftime("%a, %d %b %Y %H:%M:%S GMT")
    api.on("/intensity", Answer("busy", status=429, headers={"Retry-After": soon}), GOOD)
    feed = UkCarbonIntensity(http(api, backoff_max=5.0))
    reading = await feed.current()
    await feed.aclose()
    assert reading.value == 98.0
    first, second = api.to("/intensity")
    # The retry left no earlier than the date named (the requests carry monotonic times).
    wall_of = time.time() - time.monotonic()
    assert second.at + wall_of >= named.timestamp() - 0.05
    assert second.at > first.at


async def test_a_429_without_retry_after_is_retried_with_the_usual_backoff(api: GridApi) -> None:
    api.on("/intensity", Answer("busy", status=429), GOOD)
    feed = UkCarbonIntensity(http(api))
    assert (await feed.current()).value == 98.0
    assert feed.interval(5.0) == 5.0
    await feed.aclose()


async def test_a_body_over_the_bound_is_refused(api: GridApi) -> None:
    api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 99, 98)] * 100}))
    feed = UkCarbonIntensity(HttpJson(api.url, timeout=2.0, max_bytes=1000))
    with pytest.raises(FeedError, match="over the 1000"):
        await feed.current()
    await feed.aclose()
