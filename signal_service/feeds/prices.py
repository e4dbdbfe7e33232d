"""What the day-ahead price feeds share. An auction publishes the prices of whole delivery days
at once (at noon CET for the next day, per hour or per 15 minutes), so the price of now is looked
up among the published ones, and the prices ahead are known, not forecast: each is stated with an
expected error of 0, up to the end of the last published day and not beyond (no guess is made
for the hours the auction has not cleared yet)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError

UNIT = "EUR/MWh"
# The longest market time unit of a day-ahead auction; a longer step between two prices is a gap
# (a day not published), not one long price.
LONGEST_STEP = timedelta(hours=1)
# Three days at 15 minutes is under 300 prices: an answer with more is not a day-ahead answer.
MAX_PRICES = 5_000


@dataclass(frozen=True, slots=True)
class Price:
    """One published price, for delivery in [start, end)."""

    start: datetime
    end: datetime
    value: float


def from_starts(starts: Sequence[datetime], values: Sequence[float | None]) -> list[Price]:
    """Prices from their start times alone (Energy-Charts gives no end): each lasts until the next
    one, unless that is further than LONGEST_STEP (a gap), then as long as the step before it. A
    missing value (null) is no price."""
    if len(starts) > MAX_PRICES:
        raise FeedError(f"the answer has {len(starts)} prices, over the {MAX_PRICES} accepted")
    prices: list[Price] = []
    step = LONGEST_STEP
    for i, start in enumerate(starts):
        following = starts[i + 1] - start if i + 1 < len(starts) else None
        if following is not None and timedelta(0) < following <= LONGEST_STEP:
            step = following
        value = values[i]
        if value is not None:
            prices.append(Price(start, start + step, value))
    return prices


def ordered(prices: Iterable[Price]) -> list[Price]:
    """By start; where two overlap (a provider sending a day twice), the first given is kept."""
    kept: list[Price] = []
    for price in sorted(prices, key=lambda p: p.start):
        if kept and price.start < kept[-1].end:
            continue
        kept.append(price)
    return kept


def price_now(prices: Sequence[Price], now: datetime, *, what: str) -> Reading:
    """The published price of the market time unit `now` falls in; FeedError when none covers it
    (today's prices missing): the last good value stays, and turns stale if it lasts."""
    for price in prices:
        if price.start <= now < price.end:
            return Reading(price.value, price.start, UNIT)
    if not prices:
        raise FeedError(f"{what}: no prices published around {now:%Y-%m-%dT%H:%MZ}")
    raise FeedError(
        f"{what}: no price published for {now:%Y-%m-%dT%H:%MZ} "
        f"(the answer covers {prices[0].start:%Y-%m-%dT%H:%MZ} to {prices[-1].end:%Y-%m-%dT%H:%MZ})"
    )


def published_ahead(prices: Sequence[Price], now: datetime) -> list[Point]:
    """The prices of now and after, each known (expected error 0), up to the last published."""
    return [Point(p.start, p.value, 0.0) for p in prices if p.end > now]
