"""WattTime v3 (api.watttime.org): basic-auth `GET /login` -> `{"token": ...}`, a bearer token
valid for 30 minutes; then `GET /v3/signal-index?region=CAISO_NORTH&signal_type=co2_moer` ->
`{"data": [{"point_time", "value"}], "meta": {"units": "percentile", ...}}`.

The signal index is a percentile (0-100: where the current marginal emissions sit in the recent
range), not grams, so this feed's unit is `percentile` and the threshold must be one too.

Forecast: `GET /v3/forecast?region=CAISO_NORTH&signal_type=co2_moer` -> `{"data": [{"point_time",
"value"}], "meta": {"region", "signal_type", "units": "lbs_co2_per_mwh", "generated_at", ...}}`,
24 hours or more of 5-minute points, the first for the current five minutes (subscribers only,
and CAISO_NORTH for everyone). Its values are marginal emissions, not the index, so they are put
on the index's 0-100 scale by their place in the forecast's own range (0 at its lowest, 100 at
its highest, linear between). Being linear, that scaling keeps which window has the lowest mean,
all the planner asks of a forecast; it is lowtide's scaling, not WattTime's index.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import (
    FeedError,
    ForecastUnavailable,
    HttpJson,
    HttpStatusError,
    Unauthorized,
    number,
    parse_time,
)

PUBLIC_URL = "https://api.watttime.org"
SIGNAL_TYPE = "co2_moer"
# A plan without forecasts (or a region outside it) is answered with one of these on /v3/forecast.
_NOT_ON_PLAN = frozenset({402, 403})
# Tokens last 30 minutes; renewing at 25 leaves room for a slow login and clock drift.
TOKEN_RENEW_AFTER = 25 * 60.0


class WattTime:
    source = "watttime"
    unit = "percentile"

    def __init__(
        self,
        http: HttpJson,
        *,
        username: str,
        password: str,
        region: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (username and password and region):
            raise ConfigError("[signal] username, password and region: the watttime feed needs all three")
        self._auth = httpx.BasicAuth(username, password)
        self._region = region
        self._http = http
        self._clock = clock
        self._token: str | None = None
        self._token_at = 0.0
        self.logins = 0

    async def _login(self) -> str:
        body = await self._http.get("/login", auth=self._auth)
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise FeedError(f"/login: no token in the answer ({str(body)[:200]!r})")
        self._token, self._token_at = token, self._clock()
        self.logins += 1
        return token

    async def _get(self, path: str, params: dict[str, str]) -> Any:
        token = self._token
        if token is None or self._clock() - self._token_at >= TOKEN_RENEW_AFTER:
            token = await self._login()
        try:
            return await self._http.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
        except Unauthorized:
            # Revoked or expired early (another client logged in as us, a server restart):
            # one fresh login, then the error stands.
            token = await self._login()
            return await self._http.get(path, params=params, headers={"Authorization": f"Bearer {token}"})

    async def current(self) -> Reading:
        path = "/v3/signal-index"
        body = await self._get(path, {"region": self._region, "signal_type": SIGNAL_TYPE})
        try:
            units = body.get("meta", {}).get("units", self.unit)
            if units != self.unit:
                raise FeedError(f"{path}: values in {units!r}, expected {self.unit!r}")
            entry = body["data"][0]
            return Reading(number(entry["value"]), parse_time(entry["point_time"]), self.unit)
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    async def forecast(self) -> list[Point]:
        path = "/v3/forecast"
        try:
            body = await self._get(path, {"region": self._region, "signal_type": SIGNAL_TYPE})
        except HttpStatusError as error:
            if error.status in _NOT_ON_PLAN:
                raise ForecastUnavailable(f"{error} (WattTime's forecast is for subscribers)") from None
            raise
        try:
            meta = body.get("meta", {})
            for name, wanted in (("region", self._region), ("signal_type", SIGNAL_TYPE)):
                got = meta.get(name, wanted)
                if got != wanted:
                    raise FeedError(f"{path}: the forecast is for {name} {got!r}, not {wanted!r}")
            times = [parse_time(e["point_time"]) for e in body["data"]]
            values = [number(e["value"]) for e in body["data"]]
        except (KeyError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None
        if meta.get("units") != self.unit:
            values = _scaled(values)
        return [Point(at, value) for at, value in zip(times, values, strict=True)]

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()


def _scaled(values: list[float]) -> list[float]:
    """The values on 0-100 by their place between the lowest and the highest; a flat forecast
    (every window alike) is 50 throughout."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high == low:
        return [50.0] * len(values)
    return [100.0 * (value - low) / (high - low) for value in values]
