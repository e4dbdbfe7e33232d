"""The ENTSO-E Transparency Platform's day-ahead prices (web-api.tp.entsoe.eu, a security token).

`GET /api?securityToken=...&documentType=A44&contract_MarketAgreement.type=A01&in_Domain=EIC&
out_Domain=EIC&periodStart=yyyyMMddHHmm&periodEnd=yyyyMMddHHmm` -> a `Publication_MarketDocument`
(XML, IEC 62325): `TimeSeries` with `currency_Unit.name` (EUR), `price_Measure_Unit.name` (MWH),
`curveType`, and `Period`s of a `timeInterval` (`start`, `end`, UTC), a `resolution` (PT60M,
PT15M) and `Point`s of `position` (1 is the interval's first unit) and `price.amount`. Under curve
type A03 a point is left out when its price equals the one before, so positions are filled
forward. Nothing published for the period is an `Acknowledgement_MarketDocument` whose `Reason`
says so (code 999); a bad request is the same document with HTTP 400, a bad token HTTP 401.

The XML is parsed by defusedxml (no DTD, no entity expansion) after HttpJson has bounded its size.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from xml.etree.ElementTree import Element

import defusedxml.ElementTree as SafeXml
from defusedxml import DefusedXmlException

from lowtide.errors import ConfigError
from signal_service.domain import Point, Reading
from signal_service.feeds.base import FeedError, HttpJson, HttpStatusError, parse_time
from signal_service.feeds.prices import MAX_PRICES, UNIT, Price, ordered, price_now, published_ahead

PUBLIC_URL = "https://web-api.tp.entsoe.eu"
PATH = "/api"
_BEHIND = timedelta(hours=1)
_AHEAD = timedelta(hours=48)
_REUSE = 30.0
_RESOLUTION = re.compile(r"PT(?:(\d+)H)?(?:(\d+)M)?")
_EIC = re.compile(r"[0-9A-Z-]{16}")

# Bidding zones by name, as Energy-Charts and most tools spell them, to their EIC codes (the
# Transparency Platform's area list). A region not named here may be given as its EIC code.
ZONES = {
    "AT": "10YAT-APG------L",
    "BE": "10YBE----------2",
    "BG": "10YCA-BULGARIA-R",
    "CH": "10YCH-SWISSGRIDZ",
    "CZ": "10YCZ-CEPS-----N",
    "DE-AT-LU": "10Y1001A1001A63L",
    "DE-LU": "10Y1001A1001A82H",
    "DK1": "10YDK-1--------W",
    "DK2": "10YDK-2--------M",
    "EE": "10Y1001A1001A39I",
    "ES": "10YES-REE------0",
    "FI": "10YFI-1--------U",
    "FR": "10YFR-RTE------C",
    "GR": "10YGR-HTSO-----Y",
    "HR": "10YHR-HEP------M",
    "HU": "10YHU-MAVIR----U",
    "IE-SEM": "10Y1001A1001A59C",
    "IT-CALABRIA": "10Y1001C--00096J",
    "IT-CENTRE-NORTH": "10Y1001A1001A70O",
    "IT-CENTRE-SOUTH": "10Y1001A1001A71M",
    "IT-NORTH": "10Y1001A1001A73I",
    "IT-SARDINIA": "10Y1001A1001A74G",
    "IT-SICILY": "10Y1001A1001A75E",
    "IT-SOUTH": "10Y1001A1001A788",
    "LT": "10YLT-1001A0008Q",
    "LV": "10YLV-1001A00074",
    "NL": "10YNL----------L",
    "NO1": "10YNO-1--------2",
    "NO2": "10YNO-2--------T",
    "NO3": "10YNO-3--------J",
    "NO4": "10YNO-4--------9",
    "NO5": "10Y1001A1001A48H",
    "PL": "10YPL-AREA-----S",
    "PT": "10YPT-REN------W",
    "RO": "10YRO-TEL------P",
    "RS": "10YCS-SERBIATSOV",
    "SE1": "10Y1001A1001A44P",
    "SE2": "10Y1001A1001A45N",
    "SE3": "10Y1001A1001A46L",
    "SE4": "10Y1001A1001A47J",
    "SI": "10YSI-ELES-----O",
    "SK": "10YSK-SEPS-----K",
}


def eic_code(region: str) -> str:
    """The EIC code of a bidding zone named (DE-LU) or given by its code; ConfigError if neither."""
    name = region.strip().upper()
    if name in ZONES:
        return ZONES[name]
    if _EIC.fullmatch(name):
        return name
    raise ConfigError(
        f"[signal] region: {region!r} is not a bidding zone the entsoe feed knows; give its EIC code "
        f"(16 characters, e.g. 10Y1001A1001A82H) or one of {', '.join(ZONES)}"
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y%m%d%H%M")


def _local(tag: str) -> str:
    """A tag without its namespace: the document's version (7:0, 7:3) changes the namespace only."""
    return tag.rpartition("}")[2]


def _child(element: Element, name: str) -> Element | None:
    return next((c for c in element if _local(c.tag) == name), None)


def _children(element: Element, name: str) -> Iterator[Element]:
    return (c for c in element if _local(c.tag) == name)


def _text(element: Element, name: str, *, what: str) -> str:
    child = _child(element, name)
    if child is None or not (child.text or "").strip():
        raise FeedError(f"{what}: a {_local(element.tag)} without {name}")
    return (child.text or "").strip()


def _resolution(text: str, *, what: str) -> timedelta:
    match = _RESOLUTION.fullmatch(text)
    step = timedelta(hours=int(match[1] or 0), minutes=int(match[2] or 0)) if match else timedelta(0)
    if step <= timedelta(0):
        raise FeedError(f"{what}: a resolution of {text!r}, not PT60M or PT15M")
    return step


def _reason(root: Element) -> str:
    reason = _child(root, "Reason")
    if reason is None:
        return "no reason given"
    code, text = _child(reason, "code"), _child(reason, "text")
    said = (text.text or "").strip() if text is not None else ""
    number = (code.text or "").strip() if code is not None else "?"
    return f"{said} (code {number})"


def _parse(body: bytes, *, what: str) -> Element:
    try:
        return SafeXml.fromstring(body, forbid_dtd=True)
    except DefusedXmlException as error:
        raise FeedError(f"{what}: refused XML ({type(error).__name__})") from None
    except SafeXml.ParseError as error:
        raise FeedError(f"{what}: malformed XML ({error}): {body[:120]!r}") from None


class Entsoe:
    source = "entsoe"
    unit = UNIT
    has_forecast = True

    def __init__(
        self,
        http: HttpJson,
        *,
        zone: str,
        token: str,
        now: Callable[[], datetime] = _now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not zone:
            raise ConfigError("[signal] region: the entsoe feed needs a bidding zone, e.g. DE-LU or its EIC code")
        if not token:
            raise ConfigError(
                "[signal] token: the entsoe feed needs the security token of a Transparency Platform "
                "account (asked for by email to the platform, then found under My Account Settings)"
            )
        self.zone = zone
        self.eic = eic_code(zone)
        self._token = token
        self._http = http
        self._now = now
        self._clock = clock
        self._kept: tuple[float, list[Price]] | None = None

    async def current(self) -> Reading:
        prices = await self._prices()
        self._kept = (self._clock(), prices)
        return price_now(prices, self._now(), what=self._what)

    async def forecast(self) -> list[Point]:
        kept, self._kept = self._kept, None
        prices = kept[1] if kept is not None and self._clock() - kept[0] <= _REUSE else await self._prices()
        return published_ahead(prices, self._now())

    @property
    def _what(self) -> str:
        return f"{PATH} A44 {self.zone}"

    async def _prices(self) -> list[Price]:
        now = self._now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        params = {
            "securityToken": self._token,
            "documentType": "A44",
            "contract_MarketAgreement.type": "A01",
            "in_Domain": self.eic,
            "out_Domain": self.eic,
            "periodStart": _stamp(now - _BEHIND),
            "periodEnd": _stamp(now + _AHEAD),
        }
        try:
            body = await self._http.get_bytes(PATH, params=params)
        except HttpStatusError as error:
            # The platform explains a refused request in an Acknowledgement document; the token is
            # a query parameter, and never part of what is said.
            if error.body.lstrip().startswith(b"<"):
                with_reason = _parse(error.body, what=self._what)
                raise FeedError(f"{self._what}: HTTP {error.status}: {_reason(with_reason)}") from None
            hint = ": the security token was refused ([signal] token)" if error.status == 401 else ""
            raise FeedError(f"{self._what}: HTTP {error.status}{hint}") from None
        return self._read(_parse(body, what=self._what))

    def _read(self, root: Element) -> list[Price]:
        what = self._what
        kind = _local(root.tag)
        if kind == "Acknowledgement_MarketDocument":
            raise FeedError(f"{what}: nothing published: {_reason(root)}")
        if kind != "Publication_MarketDocument":
            raise FeedError(f"{what}: expected a Publication_MarketDocument, got {kind}")
        periods: list[tuple[timedelta, list[Price]]] = []
        count = 0
        for series in _children(root, "TimeSeries"):
            self._check_series(series)
            for period in _children(series, "Period"):
                step, prices = self._period(period)
                count += len(prices)
                if count > MAX_PRICES:
                    raise FeedError(f"{what}: over {MAX_PRICES} prices in one answer")
                periods.append((step, prices))
        # Where a finer and a coarser series cover the same time (a zone publishing both during a
        # move to 15 minutes), the finer one is kept.
        periods.sort(key=lambda period: period[0])
        return ordered(price for _, prices in periods for price in prices)

    def _check_series(self, series: Element) -> None:
        what = self._what
        domain = _child(series, "in_Domain.mRID")
        if domain is not None and (domain.text or "").strip() not in ("", self.eic):
            raise FeedError(
                f"{what}: the answer is for {(domain.text or '').strip()}, not {self.eic} ([signal] region)"
            )
        currency = _text(series, "currency_Unit.name", what=what)
        measure = _text(series, "price_Measure_Unit.name", what=what)
        if (currency, measure) != ("EUR", "MWH"):
            raise FeedError(f"{what}: prices in {currency}/{measure}, not {UNIT}")

    def _period(self, period: Element) -> tuple[timedelta, list[Price]]:
        what = self._what
        interval = _child(period, "timeInterval")
        if interval is None:
            raise FeedError(f"{what}: a Period without timeInterval")
        start = parse_time(_text(interval, "start", what=what))
        end = parse_time(_text(interval, "end", what=what))
        step = _resolution(_text(period, "resolution", what=what), what=what)
        units = int((end - start) / step)
        if not 0 < units <= MAX_PRICES:
            raise FeedError(f"{what}: a Period of {units} units of {step}")
        given: dict[int, float] = {}
        for point in _children(period, "Point"):
            try:
                position = int(_text(point, "position", what=what))
                amount = float(_text(point, "price.amount", what=what))
            except ValueError:
                raise FeedError(f"{what}: a Point whose position or price.amount is not a number") from None
            if not 1 <= position <= units:
                raise FeedError(f"{what}: a Point at position {position} of a Period of {units}")
            given[position] = amount
        # Filled forward: under curve type A03 a position left out has the price before it.
        prices, last = [], None
        for position in range(1, units + 1):
            last = given.get(position, last)
            if last is not None:
                at = start + (position - 1) * step
                prices.append(Price(at, at + step, last))
        return step, prices

    def interval(self, refresh: float) -> float:
        return max(refresh, self._http.blocked_for())

    async def aclose(self) -> None:
        await self._http.aclose()
