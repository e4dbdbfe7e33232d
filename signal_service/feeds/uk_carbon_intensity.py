"""National Grid ESO's Carbon Intensity API (api.carbonintensity.org.uk, no key).

Current: `GET /intensity` -> `{"data": [{"from", "to", "intensity": {"forecast", "actual", "index"}}]}`,
where `actual` is null until the half hour is measured, so the forecast stands in for it.
With a region: `GET /regional/regionid/{id}` -> `{"data": [{"regionid", "shortname", "data": [{...}]}]}`
(regions have forecasts only). Forecast: `GET /intensity/{from}/fw48h` -> `{"data": [...]}`, or
`/regional/intensity/{from}/fw48h/regionid/{id}` -> `{"data": {"regionid", "data": [...]}}`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, number, parse_time

PUBLIC_URL = "https://api.carbonintensity.org.uk"


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

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
