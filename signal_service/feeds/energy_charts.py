"""Fraunhofer ISE's Energy-Charts API (api.energy-charts.info, no key): day-ahead prices.

`GET /price?bzn=DE-LU&start=2026-12-04T10:00Z&end=2026-12-06T10:00Z` -> `{"license_info",
"unix_seconds": [...], "price": [...], "unit": "EUR / MWh", "deprecated": false}`: one price per
market time unit (an hour, or 15 minutes since the auction moved to them), a null where none is
published. Prices are in EUR/MWh in every bidding zone, whatever its currency. An unknown zone or
an empty range is answered with an error status and `{"detail": ...}`.

One request serves a poll: the price of now and the published prices ahead come from one answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, number
from signal_service.feeds.prices import UNIT, Price, from_starts, ordered, price_now, published_ahead

log = logging.getLogger("lowtide.signal.feed")

PUBLIC_URL = "https://api.energy-charts.info"
PATH = "/price"
# Asked from a little before now (the current unit began up to an hour ago) to two days ahead
# (the auction publishes tomorrow's prices at noon, so at most ~36 hours are ever published).
_BEHIND = timedelta(hours=1)
_AHEAD = timedelta(hours=48)
# A forecast asked right after the value (the runner's order) reuses the value's answer.
_REUSE = 30.0


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


class EnergyCharts:
    source = "energy-charts"
    unit = UNIT
    has_forecast = True

    def __init__(
        self,
        http: HttpJson,
        *,
        zone: str,
        now: Callable[[], datetime] = _now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not zone:
            raise ConfigError("[signal] region: the energy-charts feed needs a bidding zone, e.g. DE-LU or FR")
        self.zone = zone
        self._http = http
        self._now = now
        self._clock = clock
        self._kept: tuple[float, list[Price]] | None = None
        self._warned_deprecated = False

    async def current(self) -> Reading:
        prices = await self._prices()
        self._kept = (self._clock(), prices)
        return price_now(prices, self._now(), what=f"{PATH}?bzn={self.zone}")

    async def forecast(self) -> list[Point]:
        kept, self._kept = self._kept, None
        if kept is not None and self._clock() - kept[0] <= _REUSE:
            prices = kept[1]
        else:
            prices = await self._prices()
        return published_ahead(prices, self._now())

    async def _prices(self) -> list[Price]:
        now = self._now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        params = {"bzn": self.zone, "start": _iso(now - _BEHIND), "end": _iso(now + _AHEAD)}
        body = await self._http.get(PATH, params=params)
        return self._parse(body)

    def _parse(self, body: Any) -> list[Price]:
        what = f"{PATH}?bzn={self.zone}"
        if not isinstance(body, dict):
            raise FeedError(f"{what}: unexpected answer ({str(body)[:200]!r})")
        unit = body.get("unit")
        if not isinstance(unit, str) or unit.replace(" ", "") != UNIT:
            raise FeedError(f"{what}: prices in {unit!r}, not {UNIT}")
        if body.get("deprecated") is True and not self._warned_deprecated:
            # The API announces an endpoint's end six months ahead this way.
            self._warned_deprecated = True
            log.warning("feed.deprecated", extra={"feed": self.source, "path": PATH})
        seconds, values = body.get("unix_seconds"), body.get("price")
        if not isinstance(seconds, list) or not isinstance(values, list) or len(seconds) != len(values):
            raise FeedError(f"{what}: expected the arrays unix_seconds and price of one length")
        try:
            rows = sorted(
                (
                    (datetime.fromtimestamp(number(s), UTC), None if v is None else number(v))
                    for s, v in zip(seconds, values, strict=True)
                ),
                key=lambda row: row[0],
            )
        except (OverflowError, OSError, ValueError):
            raise FeedError(f"{what}: a time in unix_seconds is out of range") from None
        return ordered(from_starts([at for at, _ in rows], [value for _, value in rows]))

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
