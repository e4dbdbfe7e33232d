"""Electricity Maps (api.electricitymap.org, `auth-token` header).

Current: `GET /v3/carbon-intensity/latest?zone=DE` -> `{"zone", "carbonIntensity", "datetime",
"updatedAt", "emissionFactorType", "isEstimated", ...}`. Forecast (not on every plan):
`GET /v3/carbon-intensity/forecast?zone=DE` -> `{"zone", "forecast": [{"carbonIntensity", "datetime"}], ...}`.
"""

from __future__ import annotations

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, number, parse_time

PUBLIC_URL = "https://api.electricitymap.org"


class ElectricityMaps:
    source = "electricitymaps"
    unit = "gCO2/kWh"

    def __init__(self, http: HttpJson, *, zone: str, token: str) -> None:
        if not zone:
            raise ConfigError("[signal] region: the electricitymaps feed needs a zone, e.g. DE or GB")
        self._zone = zone
        self._headers = {"auth-token": token}
        self._http = http

    async def current(self) -> Reading:
        body = await self._http.get("/v3/carbon-intensity/latest", params={"zone": self._zone}, headers=self._headers)
        try:
            return Reading(number(body["carbonIntensity"]), parse_time(body["datetime"]), self.unit)
        except (KeyError, TypeError) as error:
            raise FeedError(f"/v3/carbon-intensity/latest: unexpected answer ({error!r})") from None

    async def forecast(self) -> list[Point]:
        body = await self._http.get("/v3/carbon-intensity/forecast", params={"zone": self._zone}, headers=self._headers)
        try:
            return [Point(parse_time(e["datetime"]), number(e["carbonIntensity"])) for e in body["forecast"]]
        except (KeyError, TypeError) as error:
            raise FeedError(f"/v3/carbon-intensity/forecast: unexpected answer ({error!r})") from None

    def interval(self, refresh: float) -> float:
        return refresh

    async def aclose(self) -> None:
        await self._http.aclose()
