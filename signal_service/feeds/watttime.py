"""WattTime v3 (api.watttime.org): basic-auth `GET /login` -> `{"token": ...}`, a bearer token
valid for 30 minutes; then `GET /v3/signal-index?region=CAISO_NORTH&signal_type=co2_moer` ->
`{"data": [{"point_time", "value"}], "meta": {"units": "percentile", ...}}`.

The signal index is a percentile (0-100: where the current marginal emissions sit in the recent
range), not grams, so this feed's unit is `percentile` and the threshold must be one too. No
forecast is offered: `/v3/forecast` is in lbs/MWh, and mixing it into a percentile signal would
mislead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, Unauthorized, number, parse_time

PUBLIC_URL = "https://api.watttime.org"
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
        body = await self._get(path, {"region": self._region, "signal_type": "co2_moer"})
        try:
            units = body.get("meta", {}).get("units", self.unit)
            if units != self.unit:
                raise FeedError(f"{path}: values in {units!r}, expected {self.unit!r}")
            entry = body["data"][0]
            return Reading(number(entry["value"]), parse_time(entry["point_time"]), self.unit)
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    async def forecast(self) -> list[Point]:
        return []

    def interval(self, refresh: float) -> float:
        return refresh

    async def aclose(self) -> None:
        await self._http.aclose()
