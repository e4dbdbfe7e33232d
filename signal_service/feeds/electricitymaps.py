"""Electricity Maps (api.electricitymaps.com, `auth-token` header).

Current: `GET /v3/carbon-intensity/latest?zone=DE` -> `{"zone", "carbonIntensity", "datetime",
"updatedAt", "emissionFactorType", "isEstimated", ...}`. Forecast (not on the free plan):
`GET /v3/carbon-intensity/forecast?zone=DE` -> `{"zone", "forecast": [{"carbonIntensity", "datetime"}], ...}`.

A zone the API does not find is answered, unless told not to, with the grid where the caller's
IP address is: a typo would silently read another country's grid. So every request disables the
caller lookup, and an answer for another zone than the one asked is refused, naming both.

The intensity is lifecycle (LCA: construction and fuel supply included) unless `[signal]
emission_factor = "direct"` (combustion only); both are asked for by name and checked in the
answer, so the figure's basis is never left to the API's default.
"""

from __future__ import annotations

import logging
from typing import Any

from lowtide.config import EMISSION_FACTORS
from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import (
    FeedError,
    ForecastUnavailable,
    HttpJson,
    HttpStatusError,
    number,
    parse_time,
)

log = logging.getLogger("lowtide.signal.feed")

# The current host (api.electricitymap.org, without the s, is the older name).
PUBLIC_URL = "https://api.electricitymaps.com"
# A plan without forecasts is answered with one of these on /forecast while /latest works.
_NOT_ON_PLAN = frozenset({401, 402, 403})


class ElectricityMaps:
    source = "electricitymaps"
    unit = "gCO2/kWh"
    has_forecast = True

    def __init__(self, http: HttpJson, *, zone: str, token: str, emission_factor: str = "lifecycle") -> None:
        if not zone:
            raise ConfigError("[signal] region: the electricitymaps feed needs a zone, e.g. DE or GB")
        if emission_factor not in EMISSION_FACTORS:
            raise ConfigError(f"[signal] emission_factor: must be one of {', '.join(EMISSION_FACTORS)}")
        self.zone = zone
        self.emission_factor = emission_factor
        self._params = {
            "zone": zone,
            "emissionFactorType": emission_factor,
            # The documented switch; the v3 docs have also named it shouldUseFallbackCallerLookup,
            # and both are sent so neither generation of the API falls back to the caller's IP.
            "disableCallerLookup": "true",
            "shouldUseFallbackCallerLookup": "false",
        }
        self._headers = {"auth-token": token}
        self._http = http
        log.info(
            "feed.electricitymaps",
            extra={"zone": zone, "emission_factor": emission_factor, "base_url": http.base_url},
        )

    async def current(self) -> Reading:
        path = "/v3/carbon-intensity/latest"
        body = await self._http.get(path, params=self._params, headers=self._headers)
        self._check(path, body)
        try:
            return Reading(number(body["carbonIntensity"]), parse_time(body["datetime"]), self.unit)
        except (KeyError, TypeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    async def forecast(self) -> list[Point]:
        path = "/v3/carbon-intensity/forecast"
        try:
            body = await self._http.get(path, params=self._params, headers=self._headers)
        except HttpStatusError as error:
            if error.status in _NOT_ON_PLAN:
                raise ForecastUnavailable(f"{error} (forecasts are not on every Electricity Maps plan)") from None
            raise
        self._check(path, body)
        try:
            return [Point(parse_time(e["datetime"]), number(e["carbonIntensity"])) for e in body["forecast"]]
        except (KeyError, TypeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    def _check(self, path: str, body: Any) -> None:
        """The answer is for the zone asked, on the emission factor asked."""
        if not isinstance(body, dict):
            raise FeedError(f"{path}: unexpected answer ({str(body)[:200]!r})")
        zone = body.get("zone")
        if not isinstance(zone, str) or zone.casefold() != self.zone.casefold():
            raise FeedError(
                f"{path}: the answer is for zone {zone!r}, not the configured {self.zone!r} "
                "([signal] region); is the zone spelt as in Electricity Maps' /v3/zones?"
            )
        factor = body.get("emissionFactorType")
        if factor is not None and factor != self.emission_factor:
            raise FeedError(
                f"{path}: the answer is on the {factor!r} emission factor, not the configured "
                f"{self.emission_factor!r} ([signal] emission_factor)"
            )

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
