"""National Grid ESO's Carbon Intensity API (api.carbonintensity.org.uk, no key).

Current: `GET /intensity` -> `{"data": [{"from", "to", "intensity": {"forecast", "actual", "index"}}]}`,
where `actual` is null until the half hour is measured, so the forecast stands in for it.
With a region: `GET /regional/regionid/{id}` -> `{"data": [{"regionid", "shortname", "data": [{...}]}]}`
(regions have forecasts only). Forecast: `GET /intensity/{from}/fw48h` -> `{"data": [...]}`, or
`/regional/intensity/{from}/fw48h/regionid/{id}` -> `{"data": {"regionid", "data": [...]}}`.
Past: `GET /intensity/{from}/{to}` (at most 14 days) -> `{"data": [...]}`, each half hour with the
forecast the API last published for it beside the actual value (national only: regions publish
no actual values).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, number, parse_time

PUBLIC_URL = "https://api.carbonintensity.org.uk"
# The most half hours one answer of past forecasts is read for (a day's is 48).
MAX_PAST = 2 * 48


def _now() -> datetime:
    return datetime.now(UTC)


class UkCarbonIntensity:
    source = "uk-carbon-intensity"
    unit = "gCO2/kWh"
    has_forecast = True

    def __init__(self, http: HttpJson, *, region: str = "", now: Callable[[], datetime] = _now) -> None:
        self._http = http
        self._region = region
        self._now = now

    async def current(self) -> Reading:
        if self._region:
            body = await self._http.get(f"/regional/regionid/{self._region}")
            try:
                entry = body["data"][0]["data"][0]
                value = number(entry["intensity"]["forecast"])
            except (KeyError, IndexError, TypeError) as error:
                raise FeedError(f"/regional/regionid/{self._region}: unexpected answer ({error!r})") from None
        else:
            body = await self._http.get("/intensity")
            try:
                entry = body["data"][0]
                intensity = entry["intensity"]
                actual = intensity.get("actual")
                value = number(actual if actual is not None else intensity["forecast"])
            except (KeyError, IndexError, TypeError, AttributeError) as error:
                raise FeedError(f"/intensity: unexpected answer ({error!r})") from None
        return Reading(value, parse_time(entry.get("from")), self.unit)

    async def forecast(self) -> list[Point]:
        start = self._now().astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")
        if self._region:
            path = f"/regional/intensity/{start}/fw48h/regionid/{self._region}"
        else:
            path = f"/intensity/{start}/fw48h"
        body = await self._http.get(path)
        try:
            data: Any = body["data"]
            entries = data["data"] if self._region else data
            return [Point(parse_time(e["from"]), number(e["intensity"]["forecast"])) for e in entries]
        except (KeyError, IndexError, TypeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    @property
    def has_past_forecasts(self) -> bool:
        return not self._region

    async def past_forecasts(self, start: datetime, end: datetime) -> list[tuple[datetime, float, float]]:
        """(half hour, its forecast, its actual value) over [start, end), the half hours with
        both; at most `MAX_PAST` of them (a day is 48)."""
        stamp = "%Y-%m-%dT%H:%MZ"
        path = f"/intensity/{start.astimezone(UTC).strftime(stamp)}/{end.astimezone(UTC).strftime(stamp)}"
        body = await self._http.get(path)
        found = []
        try:
            for entry in body["data"][:MAX_PAST]:
                intensity = entry["intensity"]
                at = parse_time(entry["from"])
                if intensity.get("actual") is None or intensity.get("forecast") is None or not start <= at < end:
                    continue
                found.append((at, number(intensity["forecast"]), number(intensity["actual"])))
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None
        return found

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
