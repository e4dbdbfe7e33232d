"""The loop that polls a feed and stores what it reads through the same path as SetSignal.

One replica polls at a time, the holder of a lease in the database: replicas polling together
would spend the API's quota twice, and two replays begun at different moments would make the
signal flip between two points of the trace. Another replica takes over when the lease lapses.

A failed poll (FeedError), a refused value (InvalidArgument: NaN, negative, wrong unit) or an
unreachable database is logged and counted and the loop goes on: the last good value stays, and
the stale check tells subscribers if failures last longer than stale_after.

An API's Retry-After is obeyed: the next poll comes no earlier (the feed's `interval` says so),
the lease is kept for at least that long so another replica does not ask in its place, and a
call the feed did not send while waiting (Waiting) is no failed answer and is not counted. A
plan without forecasts (ForecastUnavailable) is logged once and asked again once a day, not
every refresh: the value keeps coming, and an upgraded plan is noticed without a restart. A feed
with no forecast in its unit (`has_forecast` false: WattTime's index) is never asked for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta

from lowtide.errors import DatabaseUnavailable, InvalidArgument
from signal_service.domain import Reading, SignalState
from signal_service.feeds.base import Feed, FeedError, ForecastUnavailable, Waiting
from signal_service.feeds.seed import Seeding, seed_calibration
from signal_service.signals import Signals
from signal_service.store import FEED_LEASE

log = logging.getLogger("lowtide.signal.feed")

# How long a feed whose plan has no forecast goes unasked for one.
FORECAST_UNAVAILABLE_RETRY = 24 * 3600.0


@dataclass
class FeedStats:
    fetches: int = 0
    errors: int = 0
    forecast_errors: int = 0
    # False once the feed said its plan gives no forecast (until a later try gets one).
    forecast_available: bool = True


def _repeated(signals: Signals, name: str, reading: Reading, source: str) -> SignalState | None:
    """The stored state, when the reading is what it holds: an API polled more often than it
    publishes answers the same observation again, and storing it again would only pad the
    history. A stale signal is stored anyway, to clear the mark."""
    latest = signals.fanout.latest(name)
    if (
        latest is not None
        and not latest.stale
        and latest.source == source
        and latest.value == reading.value
        and latest.observed_at == reading.observed_at
    ):
        return latest
    return None


async def poll_once(feed: Feed, signals: Signals, name: str, stats: FeedStats) -> bool:
    """One poll; True when a new value was stored."""
    try:
        stats.fetches += 1
        reading = await feed.current()
        if (latest := _repeated(signals, name, reading, feed.source)) is not None:
            # The feed answers, with what is stored (a day-ahead price holds for an hour): the
            # signal is fresh, and is not marked stale while its feed keeps answering.
            await signals.confirm(name, latest.version)
            return False
        await signals.set(name, reading.value, unit=reading.unit, observed_at=reading.observed_at, source=feed.source)
        return True
    except Waiting as waiting:
        # Nothing was asked: not a poll, and not a failure.
        stats.fetches -= 1
        log.debug("feed.waiting", extra={"feed": feed.source, "signal": name, "error": str(waiting)})
    except (FeedError, InvalidArgument) as error:
        stats.errors += 1
        log.warning(
            "feed.bad_answer", extra={"feed": feed.source, "signal": name, "error": str(error), "errors": stats.errors}
        )
    except DatabaseUnavailable as error:
        stats.errors += 1
        log.warning("feed.store_failed", extra={"feed": feed.source, "signal": name, "error": str(error)})
    except Exception:
        # A fault in an adapter must not end the loop: the signal would silently freeze (until
        # marked stale) instead of recovering at the next poll.
        stats.errors += 1
        log.exception("feed.failed", extra={"feed": feed.source, "signal": name})
    return False


async def refresh_forecast(feed: Feed, signals: Signals, name: str, stats: FeedStats) -> bool:
    """Stores the feed's forecast; False when the feed's plan has none (ask again much later)."""
    try:
        points = await feed.forecast()
        await signals.set_forecast(name, points, source=feed.source)
        if not stats.forecast_available:
            stats.forecast_available = True
            log.info("feed.forecast_available", extra={"feed": feed.source, "signal": name})
    except Waiting as waiting:
        log.debug("feed.waiting", extra={"feed": feed.source, "signal": name, "error": str(waiting)})
    except ForecastUnavailable as error:
        stats.forecast_errors += 1
        # Once, loudly; the daily tries after it only at debug.
        level = logging.WARNING if stats.forecast_available else logging.DEBUG
        stats.forecast_available = False
        retry = f"asked again in {FORECAST_UNAVAILABLE_RETRY / 3600:g}h; planned release falls back to the threshold"
        log.log(
            level,
            "feed.forecast_unavailable",
            extra={"feed": feed.source, "signal": name, "error": str(error), "retry": retry},
        )
        return False
    except (FeedError, InvalidArgument, DatabaseUnavailable) as error:
        # Some plans have no forecast; the current value matters far more, so this is quieter.
        stats.forecast_errors += 1
        log.info("feed.forecast_failed", extra={"feed": feed.source, "signal": name, "error": str(error)})
    except Exception:
        stats.forecast_errors += 1
        log.exception("feed.forecast_failed", extra={"feed": feed.source, "signal": name})
    return True


def _issue(feed: Feed) -> object:
    """Which forecast a feed that can say so (a recording: `forecast_issue()`) gives now; None
    for the others, which are asked every refresh."""
    issue = getattr(feed, "forecast_issue", None)
    return None if issue is None else issue()


def lease_ttl(interval: float) -> timedelta:
    """Long enough to outlast a few polls (and their retries), so a leader keeps it."""
    return timedelta(seconds=max(3 * interval, 2.0))


async def _leading(signals: Signals, holder: str, ttl: timedelta, lease: str) -> bool:
    try:
        return await signals.store.hold_feed_lease(holder, ttl, lease=lease)
    except DatabaseUnavailable:
        return False


async def run_feed(
    feed: Feed,
    signals: Signals,
    name: str,
    *,
    refresh: float,
    stats: FeedStats,
    holder: str,
    lease: str = FEED_LEASE,
    seeding: Seeding | None = None,
) -> None:
    """Polls while this replica holds the feed's lease, until cancelled; the forecast is
    refreshed at most once per `refresh` (once a day while the feed's plan has none), and as soon as a
    recording issues its next one. Each
    signal's feed runs in a loop of its own, under a lease of its own: one feed waiting on a
    slow API, or failing, never delays another."""
    loop = asyncio.get_running_loop()
    forecast_due = loop.time()
    issued = _issue(feed)
    leading = False
    seeder: asyncio.Task[int] | None = None
    try:
        while True:
            interval = feed.interval(refresh)
            now_leading = await _leading(signals, holder, lease_ttl(interval), lease)
            if now_leading != leading:
                leading = now_leading
                log.info("feed.leading" if leading else "feed.following", extra={"feed": feed.source, "signal": name})
            if leading:
                await poll_once(feed, signals, name, stats)
                if feed.has_forecast and (loop.time() >= forecast_due or _issue(feed) != issued):
                    issued = _issue(feed)
                    available = await refresh_forecast(feed, signals, name, stats)
                    forecast_due = loop.time() + (refresh if available else FORECAST_UNAVAILABLE_RETRY)
                if seeding is not None:
                    # Once, when first leading, after the first value and forecast are stored;
                    # beside the polls (its requests take up to its timeout: the signal is kept
                    # fresh and the lease renewed meanwhile).
                    seeder = loop.create_task(seed_calibration(feed, signals, name, seeding), name=f"seed-{name}")
                    seeding = None
            wait = feed.interval(refresh)
            if leading and wait > interval:
                # The API asked for a longer wait (Retry-After): the lease is kept through it and
                # the poll after it, so no other replica asks in this one's place meanwhile, and
                # one takes over as soon as ever if this one dies.
                await _leading(signals, holder, timedelta(seconds=wait) + lease_ttl(interval), lease)
            await asyncio.sleep(wait)
    finally:
        if seeder is not None and not seeder.done():
            seeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await seeder
        if leading:
            with contextlib.suppress(DatabaseUnavailable):
                await signals.store.release_feed_lease(holder, lease=lease)
        await feed.aclose()
