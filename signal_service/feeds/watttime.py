"""WattTime v3 (api.watttime.org): basic-auth `GET /login` -> `{"token": ...}`, a bearer token
valid for 30 minutes; then one of two signals (`[signal] watttime_signal`), never converted into
one another:

- `index` (the default): `GET /v3/signal-index?region=CAISO_NORTH&signal_type=co2_moer` ->
  `{"data": [{"point_time", "value"}], "meta": {"units": "percentile", ...}}`, a percentile (0-100:
  where the current marginal emissions sit in the recent range), so the unit is `percentile` and
  the threshold must be one too. WattTime forecasts marginal emissions, not the index, so this
  signal has no forecast and none is asked for.
- `moer`: `GET /v3/forecast?region=CAISO_NORTH&signal_type=co2_moer` -> `{"data": [{"point_time",
  "value"}], "meta": {"region", "signal_type", "units": "lbs_co2_per_mwh", "generated_at", ...}}`,
  24 hours or more of 5-minute points in lbs/MWh, the first for the current five minutes: it is
  the current value, the points after it the forecast, as WattTime gives them. Subscribers only
  (and CAISO_NORTH for everyone): a refusal (HTTP 401/402/403) fails every poll, since it takes
  the current value too, and makes the forecast unavailable as for a plan without forecasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from lowtide.config import WATTTIME_SIGNALS
from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import (
    FeedError,
    ForecastUnavailable,
    HttpJson,
    HttpStatusError,
    Unauthorized,
    Waiting,
    number,
    parse_time,
)

log = logging.getLogger("lowtide.signal.feed")

PUBLIC_URL = "https://api.watttime.org"
SIGNAL_TYPE = "co2_moer"
# Each signal's unit, as lowtide names it, and as WattTime's answers name it in meta.units.
UNITS = {"index": "percentile", "moer": "lbs/MWh"}
_API_UNITS = {"index": "percentile", "moer": "lbs_co2_per_mwh"}
# A plan without forecasts (or a region outside it) is answered with one of these on /v3/forecast
# (a 401 after a fresh login: the token is good, the endpoint is not for it).
_NOT_ON_PLAN = frozenset({401, 402, 403})
# Tokens last 30 minutes; renewing at 25 leaves room for a slow login and clock drift.
TOKEN_RENEW_AFTER = 25 * 60.0


class NotOnPlan(FeedError):
    """/v3/forecast refused this account (the moer signal's current value and forecast alike)."""


class WattTime:
    source = "watttime"

    def __init__(
        self,
        http: HttpJson,
        *,
        username: str,
        password: str,
        region: str,
        signal: str = "index",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (username and password and region):
            raise ConfigError("[signal] username, password and region: the watttime feed needs all three")
        if signal not in WATTTIME_SIGNALS:
            raise ConfigError(f"[signal] watttime_signal: must be one of {', '.join(WATTTIME_SIGNALS)}")
        self.signal = signal
        self.unit = UNITS[signal]
        self.has_forecast = signal == "moer"
        self._auth = httpx.BasicAuth(username, password)
        self._region = region
        self._http = http
        self._clock = clock
        self._token: str | None = None
        self._token_at = 0.0
        # moer: what the last current() read after its point (or why it read nothing), until
        # forecast() takes it, so a poll asks /v3/forecast once for both.
        self._ahead: list[Point] | FeedError | None = None
        self.logins = 0
        forecast = (
            "/v3/forecast after the current point"
            if self.has_forecast
            else "none: WattTime forecasts lbs/MWh, not the percentile index (watttime_signal = moer for it)"
        )
        log.info(
            "feed.watttime",
            extra={"signal": signal, "unit": self.unit, "region": region, "forecast": forecast},
        )

    async def _login(self) -> str:
        try:
            body = await self._http.get("/login", auth=self._auth)
        except HttpStatusError as error:
            # Not an answer about the data asked for: a refused login is never "not on the plan".
            raise FeedError(f"{error} (are [signal] username and password right?)") from None
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
        if self.signal == "moer":
            return await self._current_moer()
        path = "/v3/signal-index"
        body = await self._get(path, {"region": self._region, "signal_type": SIGNAL_TYPE})
        try:
            self._check_units(path, body.get("meta", {}))
            entry = body["data"][0]
            return Reading(number(entry["value"]), parse_time(entry["point_time"]), self.unit)
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None

    async def _current_moer(self) -> Reading:
        """The forecast's first point (the current five minutes); the rest kept for forecast()."""
        self._ahead = None
        try:
            points = await self._moer_points()
        except FeedError as error:
            self._ahead = error
            raise
        first, *rest = points
        self._ahead = rest
        return Reading(first.value, first.at, self.unit)

    async def forecast(self) -> list[Point]:
        if not self.has_forecast:
            raise ForecastUnavailable("watttime: the index signal has no forecast (watttime_signal = moer has one)")
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return (await self._moer_points())[1:]
        if isinstance(ahead, NotOnPlan):
            raise ForecastUnavailable(str(ahead)) from None
        if isinstance(ahead, Waiting):
            raise Waiting(str(ahead)) from None
        if isinstance(ahead, FeedError):
            raise FeedError(f"no forecast: {ahead}") from None
        return ahead

    async def _moer_points(self) -> list[Point]:
        path = "/v3/forecast"
        try:
            body = await self._get(path, {"region": self._region, "signal_type": SIGNAL_TYPE})
        except HttpStatusError as error:
            if error.status in _NOT_ON_PLAN:
                raise NotOnPlan(
                    f"{error} (watttime_signal = moer reads /v3/forecast, which is for subscribers; "
                    "without a plan that has it, use watttime_signal = index)"
                ) from None
            raise
        try:
            meta = body.get("meta", {})
            for name, wanted in (("region", self._region), ("signal_type", SIGNAL_TYPE)):
                got = meta.get(name, wanted)
                if got != wanted:
                    raise FeedError(f"{path}: the forecast is for {name} {got!r}, not {wanted!r}")
            self._check_units(path, meta)
            points = [Point(parse_time(e["point_time"]), number(e["value"])) for e in body["data"]]
        except (KeyError, TypeError, AttributeError) as error:
            raise FeedError(f"{path}: unexpected answer ({error!r})") from None
        if not points:
            raise FeedError(f"{path}: no points in the answer, not even the current one")
        return points

    def _check_units(self, path: str, meta: Any) -> None:
        """The values are in the signal's unit: any other is refused, never converted."""
        wanted = _API_UNITS[self.signal]
        units = meta.get("units", wanted)
        if units != wanted:
            raise FeedError(f"{path}: values in {units!r}, expected {wanted!r} (watttime_signal = {self.signal})")

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
