"""A feed that publishes its past forecasts beside the values that came (the UK Carbon Intensity
API, national) seeds its signal's calibration with them when its replica first leads it, so the
signal states a learned error from the start instead of the prior for days.

What they are, honestly: per half hour, the forecast the API last published for it (made shortly
before; the API does not say when), beside the value measured. They are stored as forecasts of
one point issued `SEED_LEAD` (30 minutes) before their half hour, so they teach the calibration
the error and bias at the shortest leads (its 30 minute to 1 hour bucket) only: the longer leads
keep the prior until the forecasts the service keeps live teach them. (The caution the
calibration re-plays on the record sees these as half-hour-ahead forecasts: over the seeded days
it chooses between starting now and half an hour later only.)

Bounded: at most `days` requests of a day each, newest first, a day the record mostly has already
skipped (a restart asks for nothing it stored), each answer read for at most 96 half hours, and
all of it within `timeout`; a failure stops the seeding, never the feed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lowtide.errors import DatabaseUnavailable, InvalidArgument
from signal_service.domain import ValueRange, validate_value
from signal_service.feeds.base import Feed, FeedError
from signal_service.signals import Signals

log = logging.getLogger("lowtide.signal.feed")

SEED_LEAD = timedelta(minutes=30)
_DAY = timedelta(days=1)
# A day with at least this many of its 48 half hours' values recorded is not asked for again.
_KNOWN = 40

Past = Callable[[datetime, datetime], Awaitable[list[tuple[datetime, float, float]]]]


@dataclass(frozen=True)
class Seeding:
    days: int
    timeout: float


async def seed_calibration(feed: Feed, signals: Signals, name: str, seeding: Seeding) -> int:
    """Stores the feed's past forecasts and values for the signal's calibration, and learns from
    them; how many half hours were stored."""
    past: Past | None = getattr(feed, "past_forecasts", None)
    calibrations = signals.calibrations
    if past is None or not getattr(feed, "has_past_forecasts", False) or calibrations is None or seeding.days <= 0:
        return 0
    definition = signals.resolve(name)
    now = datetime.now(UTC)
    end = now.replace(minute=30 * (now.minute // 30), second=0, microsecond=0)
    stored = asked = 0
    try:
        async with asyncio.timeout(seeding.timeout):
            for _ in range(seeding.days):
                start = end - _DAY
                if await calibrations.actuals_between(name, start, end) < _KNOWN:
                    asked += 1
                    pairs = [p for p in await past(start, end) if _plausible(p, definition.unit, definition.values)]
                    await calibrations.record_past(name, pairs, lead=SEED_LEAD)
                    stored += len(pairs)
                end = start
    except TimeoutError:
        log.warning("calibration.seed_timeout", extra={"signal": name, "feed": feed.source, "stored": stored})
    except (FeedError, DatabaseUnavailable) as error:
        log.info("calibration.seed_failed", extra={"signal": name, "feed": feed.source, "error": str(error)})
    except Exception:
        # Never the feed's end: the seeding is a head start, not its job.
        log.exception("calibration.seed_failed", extra={"signal": name, "feed": feed.source})
    log.info("calibration.seeded", extra={"signal": name, "feed": feed.source, "requests": asked, "stored": stored})
    if stored:
        # What was stored is learned from at the service's next tick, not at the next
        # calibrate_every (by the loop that learns and loads: never two learnings racing).
        calibrations.learn_soon(name)
    return stored


def _plausible(pair: tuple[datetime, float, float], unit: str, accepted: ValueRange) -> bool:
    _, forecast, actual = pair
    try:
        for value in (forecast, actual):
            validate_value(value, unit, field="forecast", accepted=accepted)
    except InvalidArgument:
        return False
    return True
