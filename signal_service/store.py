"""The signal service's storage adapter: domain values in and out, every query from sql/queries.sql."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from lowtide.db import Database, load_queries
from signal_service.domain import Point, Reading, SignalForecast, SignalState, is_stale
from signal_service.rows import ForecastRow, FreshSignal, HistoryValue, ListedSignal, SignalRow

Q = load_queries("signal_service.sql")

# The history is for plots and benchmarks, not an archive: a week, or the last 10,000 versions
# of a signal, whichever is less, so a fast replay cannot grow the table without bound.
HISTORY_VERSIONS = 10_000
HISTORY_AGE = timedelta(days=7)


# Each feed runs on one replica at a time: the holder of its lease. The default signal's lease
# keeps the name it had when a service ran one feed, so replicas of both kinds never both poll.
FEED_LEASE = "signal-feed"


def feed_lease(signal: str, *, default: str) -> str:
    """The name of the lease of the feed that drives `signal`."""
    return FEED_LEASE if signal == default else f"{FEED_LEASE}:{signal}"


class SignalStore:
    def __init__(
        self, db: Database, *, history_versions: int = HISTORY_VERSIONS, history_age: timedelta = HISTORY_AGE
    ) -> None:
        self.db = db
        self._keep = {"keep_versions": history_versions, "keep_age": history_age}

    async def ensure(self, name: str, *, unit: str, threshold: float) -> None:
        """Creates the signal if needed and applies the configured unit and threshold, so every
        replica (and every subscriber) agrees on what `high` means."""
        async with self.db.transaction() as tx:
            params = {"name": name, "unit": unit, "threshold": threshold}
            if await tx.execute(Q["ensure_signal"], params) > 0:
                await tx.execute(Q["notify_signal"], {"name": name})

    async def get(self, name: str) -> SignalState | None:
        row = await self.db.fetch_one_as(SignalRow, Q["get_signal"], {"name": name})
        return None if row is None else row.state()

    async def states(self) -> list[SignalState]:
        return [state for state, _ in await self.snapshot()]

    async def snapshot(self) -> list[tuple[SignalState, int]]:
        """Every signal's state with the version of its forecast (0: none yet), in one read."""
        return [(row.state(), row.forecast_version) for row in await self.db.fetch_as(ListedSignal, Q["list_signals"])]

    async def record(self, name: str, reading: Reading, *, source: str) -> SignalState | None:
        """Stores a validated reading as the latest value, appends it to the history and tells
        the other replicas, all in one transaction. None when the signal does not exist."""
        params: dict[str, Any] = {
            "name": name,
            "value": reading.value,
            "observed_at": reading.observed_at,
            "source": source,
        }
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(SignalRow, Q["record_value"], params)
            if row is None:
                return None
            await tx.execute(Q["record_history"], {**params, "version": row.version})
            await tx.execute(
                Q["trim_history"],
                {"name": name, "version": row.version, **self._keep},
            )
            await tx.execute(Q["notify_signal"], {"name": name})
        return row.state()

    async def touch(self, name: str, version: int) -> SignalState | None:
        """The feed confirmed the stored value: staleness counts from now, and the other
        replicas are told; None when it changed meanwhile."""
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(SignalRow, Q["touch_signal"], {"name": name, "version": version})
            if row is None:
                return None
            await tx.execute(Q["notify_signal"], {"name": name})
        return row.state()

    async def mark_stale(self, stale_after: timedelta, per_signal: Mapping[str, timedelta] | None = None) -> list[str]:
        """Marks stale the signals with no update for stale_after (or their own, in
        `per_signal`; the rule is the domain's, timed by the database's clock); returns their
        names. Any replica may run this: a signal already marked, or updated meanwhile, is not
        marked (nor announced) again."""
        own = per_signal or {}
        async with self.db.transaction() as tx:
            rows = await tx.fetch_as(FreshSignal, Q["fresh_signals"])
            marked = []
            for row in rows:
                if not is_stale(row.updated_at, own.get(row.name, stale_after), row.now):
                    continue
                if await tx.execute(Q["mark_stale"], {"name": row.name, "version": row.version}) > 0:
                    await tx.execute(Q["notify_signal"], {"name": row.name})
                    marked.append(row.name)
        return marked

    async def history(self, name: str, *, since: datetime | None, limit: int) -> list[Point]:
        rows = await self.db.fetch_as(HistoryValue, Q["history"], {"name": name, "since": since, "limit": limit})
        return [Point(row.observed_at, row.value) for row in rows]

    async def set_forecast(self, name: str, points: Sequence[Point], *, source: str) -> SignalForecast | None:
        """Stores a forecast and tells the other replicas, when it differs from the stored one;
        the new forecast, or None when it was the same (or the signal does not exist)."""
        params = {
            "name": name,
            "at": [p.at for p in points],
            "values": [p.value for p in points],
            # NULL elements where a point has none; empty when none has one.
            "errors": [p.expected_error for p in points] if any(p.expected_error is not None for p in points) else [],
            "source": source,
        }
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(ForecastRow, Q["set_forecast"], params)
            if row is None:
                return None
            await tx.execute(Q["notify_forecast"], {"name": name})
        return row.forecast()

    async def forecast(self, name: str) -> SignalForecast | None:
        row = await self.db.fetch_one_as(ForecastRow, Q["get_forecast"], {"name": name})
        return None if row is None else row.forecast()

    async def hold_feed_lease(self, holder: str, ttl: timedelta, *, lease: str = FEED_LEASE) -> bool:
        """Takes or renews a feed's lease; False while another replica holds it."""
        params = {"name": lease, "holder": holder, "ttl": ttl}
        return await self.db.execute(Q["hold_feed_lease"], params) > 0

    async def release_feed_lease(self, holder: str, *, lease: str = FEED_LEASE) -> None:
        await self.db.execute(Q["release_feed_lease"], {"name": lease, "holder": holder})
