"""The day-ahead price feeds against a real local HTTP server answering as Energy-Charts and the
ENTSO-E Transparency Platform document: hourly and 15-minute days, daylight-saving days, negative
prices, a day not published, error bodies and a slow answer. Published prices are known: each is
stated with an expected error of 0, and nothing is forecast beyond them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest

from lowtide.config import SignalConfig
from lowtide.errors import ConfigError
from signal_service.feeds import feed_unit, make_feed
from signal_service.feeds.base import FeedError, HttpJson
from signal_service.feeds.energy_charts import EnergyCharts
from signal_service.feeds.entsoe import Entsoe, eic_code
from tests.signal.grid_server import Answer, GridApi, grid_api


@pytest.fixture
def api() -> Iterator[GridApi]:
    with grid_api() as running:
        yield running


def http(api: GridApi, *, timeout: float = 0.5) -> HttpJson:
    return HttpJson(api.url, timeout=timeout, attempts=2, backoff_initial=0.01, backoff_max=0.02)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def clock(text: str) -> datetime:
    return at(text)


def day(start: str, count: int, step: timedelta, prices: Sequence[object]) -> dict[str, object]:
    """An Energy-Charts /price answer: `count` units of `step` from `start` (UTC)."""
    first = at(start)
    return {
        "license_info": "CC BY 4.0 (creativecommons.org/licenses/by/4.0) from Bundesnetzagentur | SMARD.de",
        "unix_seconds": [int((first + i * step).timestamp()) for i in range(count)],
        "price": list(prices),
        "unit": "EUR / MWh",
        "deprecated": False,
    }


HOUR = timedelta(hours=1)
QUARTER = timedelta(minutes=15)


def energy_charts(api: GridApi, now: str, *, timeout: float = 0.5) -> EnergyCharts:
    return EnergyCharts(http(api, timeout=timeout), zone="DE-LU", now=lambda: clock(now))


# -- Energy-Charts ------------------------------------------------------------------------------


async def test_energy_charts_hourly_day_the_price_of_now_and_the_published_hours_at_error_0(api: GridApi) -> None:
    # 4 Dec 2026 in Berlin (UTC+1): 23:00Z the day before to 23:00Z; negative prices at noon.
    prices = [90.5, 85.0, 80.0, 78.2, 79.0, 88.0, 104.0, 120.0, 110.0, 60.0, 10.0, -5.5]
    prices += [-12.0, -3.0, 20.0, 70.0, 115.0, 140.0, 130.0, 118.0, 100.0, 95.0, 92.0, 91.0]
    api.on("/price", Answer(day("2026-12-03T23:00", 24, HOUR, prices)))
    feed = energy_charts(api, "2026-12-04T11:20")
    now, ahead = await feed.current(), await feed.forecast()
    await feed.aclose()
    # 11:00Z is the 13th hour after 23:00Z.
    assert (now.value, now.observed_at, now.unit) == (-12.0, at("2026-12-04T11:00"), "EUR/MWh")
    # From the current hour to the last published one, each known: expected error 0.
    assert [p.at for p in ahead] == [at("2026-12-04T11:00") + i * HOUR for i in range(12)]
    assert [p.value for p in ahead] == prices[12:]
    assert {p.expected_error for p in ahead} == {0.0}
    # One request served the value and the forecast; the zone and the window were asked for.
    [request] = api.to("/price")
    query = parse_qs(request.query)
    assert query == {"bzn": ["DE-LU"], "start": ["2026-12-04T10:00Z"], "end": ["2026-12-06T11:00Z"]}


async def test_energy_charts_15_minute_day(api: GridApi) -> None:
    values = [float(v) for v in range(96)]
    api.on("/price", Answer(day("2026-12-03T23:00", 96, QUARTER, values)))
    feed = energy_charts(api, "2026-12-04T08:50")
    now, ahead = await feed.current(), await feed.forecast()
    await feed.aclose()
    # 08:45Z is the 39th quarter hour after 23:00Z.
    assert (now.value, now.observed_at) == (39.0, at("2026-12-04T08:45"))
    assert ahead[0].at == at("2026-12-04T08:45") and ahead[1].at == at("2026-12-04T09:00")
    assert len(ahead) == 96 - 39 and ahead[-1].at == at("2026-12-04T22:45")


@pytest.mark.parametrize(
    ("start", "hours", "last"),
    [
        # 29 Mar 2026 in Berlin has 23 hours (clocks forward at 02:00 CET), 25 Oct 2026 has 25.
        ("2026-03-28T23:00", 23, "2026-03-29T21:00"),
        ("2026-10-24T22:00", 25, "2026-10-25T22:00"),
    ],
)
async def test_energy_charts_daylight_saving_days_are_whole_and_in_order(
    api: GridApi, start: str, hours: int, last: str
) -> None:
    api.on("/price", Answer(day(start, hours, HOUR, [float(h) for h in range(hours)])))
    feed = energy_charts(api, start)
    ahead = await feed.forecast()
    await feed.aclose()
    assert len(ahead) == hours and ahead[-1].at == at(last)
    assert all(b.at - a.at == HOUR for a, b in itertools.pairwise(ahead))


async def test_energy_charts_a_day_not_published_is_no_price_and_no_forecast(api: GridApi) -> None:
    # Today's prices are published, tomorrow's not yet: nothing is forecast past midnight.
    api.on("/price", Answer(day("2026-12-03T23:00", 24, HOUR, [50.0] * 24)))
    feed = energy_charts(api, "2026-12-04T20:30")
    ahead = await feed.forecast()
    assert ahead[-1].at == at("2026-12-04T22:00") and len(ahead) == 3
    # Only yesterday's answer (today's missing, or nulls): no price for now, the last good one stays.
    api.on("/price", Answer(day("2026-12-02T23:00", 24, HOUR, [50.0] * 24)))
    with pytest.raises(FeedError, match="no price published for 2026-12-04T20:30Z"):
        await feed.current()
    api.on("/price", Answer(day("2026-12-03T23:00", 24, HOUR, [50.0] * 20 + [None] * 4)))
    with pytest.raises(FeedError, match="no price published"):
        await feed.current()
    await feed.aclose()


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Answer({"detail": "No data for this range and bidding zone"}, status=404), "No data for this range"),
        (Answer({"detail": [{"msg": "value is not a valid enumeration member"}]}, status=422), "HTTP 422"),
        (Answer({**day("2026-12-03T23:00", 24, HOUR, [1.0] * 24), "unit": "DKK / MWh"}), "'DKK / MWh', not EUR/MWh"),
        (Answer({"unix_seconds": [1, 2], "price": [1.0], "unit": "EUR / MWh"}), "of one length"),
        (Answer({**day("2026-12-03T23:00", 2, HOUR, [1.0, "high"])}), "expected a number"),
        (Answer("<html>Bad Gateway</html>", status=200), "malformed JSON"),
    ],
)
async def test_energy_charts_error_bodies_raise_feed_error(api: GridApi, answer: Answer, message: str) -> None:
    api.on("/price", answer)
    feed = energy_charts(api, "2026-12-04T11:20")
    with pytest.raises(FeedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        await feed.current()
    await feed.aclose()


async def test_energy_charts_a_slow_answer_is_given_up(api: GridApi) -> None:
    api.on("/price", Answer(day("2026-12-03T23:00", 24, HOUR, [50.0] * 24), delay=0.5))
    feed = energy_charts(api, "2026-12-04T11:20", timeout=0.1)
    with pytest.raises(FeedError, match=r"no answer within 0\.1s"):
        await feed.current()
    await feed.aclose()


# -- ENTSO-E ------------------------------------------------------------------------------------

NS = "urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3"


def period(start: str, end: str, resolution: str, points: Sequence[tuple[int, float]]) -> str:
    body = "".join(
        f"<Point><position>{position}</position><price.amount>{price}</price.amount></Point>"
        for position, price in points
    )
    return (
        f"<Period><timeInterval><start>{start}</start><end>{end}</end></timeInterval>"
        f"<resolution>{resolution}</resolution>{body}</Period>"
    )


def series(*periods: str, eic: str = "10Y1001A1001A82H", curve: str = "A01", currency: str = "EUR") -> str:
    return (
        "<TimeSeries><mRID>1</mRID><auction.type>A01</auction.type><businessType>A62</businessType>"
        f'<in_Domain.mRID codingScheme="A01">{eic}</in_Domain.mRID>'
        f'<out_Domain.mRID codingScheme="A01">{eic}</out_Domain.mRID>'
        "<contract_MarketAgreement.type>A01</contract_MarketAgreement.type>"
        f"<currency_Unit.name>{currency}</currency_Unit.name>"
        f"<price_Measure_Unit.name>MWH</price_Measure_Unit.name><curveType>{curve}</curveType>"
        f"{''.join(periods)}</TimeSeries>"
    )


def document(*timeseries: str) -> str:
    return (
        f'<?xml version="1.0" encoding="utf-8"?><Publication_MarketDocument xmlns="{NS}">'
        "<mRID>0cf5a5e3b2f94c6c8a1b</mRID><revisionNumber>1</revisionNumber><type>A44</type>"
        '<sender_MarketParticipant.mRID codingScheme="A01">10X1001A1001A450</sender_MarketParticipant.mRID>'
        "<createdDateTime>2026-12-04T10:11:12Z</createdDateTime>"
        f"{''.join(timeseries)}</Publication_MarketDocument>"
    )


def acknowledgement(code: str, text: str) -> str:
    return (
        '<?xml version="1.0" encoding="utf-8"?><Acknowledgement_MarketDocument '
        'xmlns="urn:iec62325.351:tc57wg16:451-1:acknowledgementdocument:7:0">'
        "<mRID>5d6c</mRID><createdDateTime>2026-12-04T10:11:12Z</createdDateTime>"
        f"<Reason><code>{code}</code><text>{text}</text></Reason></Acknowledgement_MarketDocument>"
    )


def entsoe(api: GridApi, now: str, *, zone: str = "DE-LU", timeout: float = 0.5) -> Entsoe:
    return Entsoe(http(api, timeout=timeout), zone=zone, token="tok-123", now=lambda: clock(now))


async def test_entsoe_hourly_document_with_negative_prices(api: GridApi) -> None:
    hours = [(h + 1, 100.0 - 10 * h) for h in range(24)]
    api.on("/api", Answer(document(series(period("2026-12-03T23:00Z", "2026-12-04T23:00Z", "PT60M", hours)))))
    feed = entsoe(api, "2026-12-04T11:20")
    now, ahead = await feed.current(), await feed.forecast()
    await feed.aclose()
    # 11:00Z is position 13: 100 - 120.
    assert (now.value, now.observed_at, now.unit) == (-20.0, at("2026-12-04T11:00"), "EUR/MWh")
    assert [p.value for p in ahead] == [100.0 - 10 * h for h in range(12, 24)]
    assert {p.expected_error for p in ahead} == {0.0} and ahead[-1].at == at("2026-12-04T22:00")
    [request] = api.to("/api")
    query = parse_qs(request.query)
    assert query == {
        "securityToken": ["tok-123"],
        "documentType": ["A44"],
        "contract_MarketAgreement.type": ["A01"],
        "in_Domain": ["10Y1001A1001A82H"],
        "out_Domain": ["10Y1001A1001A82H"],
        "periodStart": ["202612041000"],
        "periodEnd": ["202612061100"],
    }


async def test_entsoe_15_minute_day_with_a03_points_left_out_filled_forward(api: GridApi) -> None:
    # Curve type A03: position 2 and 3 repeat position 1's price and are not sent.
    points = [(1, 50.0), (4, 42.5), *[(q, float(q)) for q in range(5, 97)]]
    doc = document(series(period("2026-12-03T23:00Z", "2026-12-04T23:00Z", "PT15M", points), curve="A03"))
    api.on("/api", Answer(doc))
    feed = entsoe(api, "2026-12-03T23:35")
    now, ahead = await feed.current(), await feed.forecast()
    await feed.aclose()
    assert (now.value, now.observed_at) == (50.0, at("2026-12-03T23:30"))
    assert [(p.at, p.value) for p in ahead[:3]] == [
        (at("2026-12-03T23:30"), 50.0),
        (at("2026-12-03T23:45"), 42.5),
        (at("2026-12-04T00:00"), 5.0),
    ]
    assert len(ahead) == 94 and ahead[-1].at == at("2026-12-04T22:45")


async def test_entsoe_the_finer_of_two_series_for_one_day_is_kept(api: GridApi) -> None:
    hourly = period("2026-12-03T23:00Z", "2026-12-04T23:00Z", "PT60M", [(h + 1, 1000.0) for h in range(24)])
    quarters = period("2026-12-03T23:00Z", "2026-12-04T23:00Z", "PT15M", [(q + 1, float(q)) for q in range(96)])
    api.on("/api", Answer(document(series(hourly), series(quarters))))
    feed = entsoe(api, "2026-12-04T00:20")
    ahead = await feed.forecast()
    await feed.aclose()
    assert ahead[0].at == at("2026-12-04T00:15") and ahead[0].value == 5.0
    assert all(p.value < 1000 for p in ahead)


async def test_entsoe_daylight_saving_day(api: GridApi) -> None:
    hours = [(h + 1, float(h)) for h in range(23)]
    api.on("/api", Answer(document(series(period("2026-03-28T23:00Z", "2026-03-29T22:00Z", "PT60M", hours)))))
    feed = entsoe(api, "2026-03-28T23:10")
    ahead = await feed.forecast()
    await feed.aclose()
    assert len(ahead) == 23 and ahead[-1].at == at("2026-03-29T21:00")
    assert all(b.at - a.at == HOUR for a, b in itertools.pairwise(ahead))


async def test_entsoe_a_day_not_published_and_error_bodies(api: GridApi) -> None:
    feed = entsoe(api, "2026-12-04T11:20")
    no_data = "No matching data found for Data item Day-ahead Prices [12.1.D] (10Y1001A1001A82H, 10Y1001A1001A82H)"
    api.on("/api", Answer(acknowledgement("999", no_data)))
    with pytest.raises(FeedError, match=r"nothing published: No matching data found .* \(code 999\)"):
        await feed.current()
    api.on("/api", Answer(acknowledgement("999", "The amount of requested data exceeds allowed limit"), status=400))
    with pytest.raises(FeedError, match="HTTP 400: The amount of requested data exceeds allowed limit"):
        await feed.current()
    api.on("/api", Answer("<html><body><h1>Unauthorized</h1></body></html>", status=401))
    with pytest.raises(FeedError, match=r"HTTP 401: the security token was refused") as refused:
        await feed.current()
    assert "tok-123" not in str(refused.value)
    yesterday = period("2026-12-02T23:00Z", "2026-12-03T23:00Z", "PT60M", [(h + 1, 1.0) for h in range(24)])
    api.on("/api", Answer(document(series(yesterday))))
    with pytest.raises(FeedError, match="no price published for 2026-12-04T11:20Z"):
        await feed.current()
    api.on("/api", Answer(document(series(yesterday, currency="PLN"))))
    with pytest.raises(FeedError, match="prices in PLN/MWH, not EUR/MWh"):
        await feed.current()
    api.on("/api", Answer(document(series(yesterday, eic="10YFR-RTE------C"))))
    with pytest.raises(FeedError, match="the answer is for 10YFR-RTE------C, not 10Y1001A1001A82H"):
        await feed.current()
    api.on("/api", Answer("<Publication_MarketDocument><TimeSeries>"))
    with pytest.raises(FeedError, match="malformed XML"):
        await feed.current()
    await feed.aclose()


async def test_entsoe_an_entity_expansion_is_refused_unexpanded(api: GridApi) -> None:
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        "<Publication_MarketDocument>&lol2;</Publication_MarketDocument>"
    )
    api.on("/api", Answer(bomb))
    feed = entsoe(api, "2026-12-04T11:20")
    with pytest.raises(FeedError, match="refused XML"):
        await feed.current()
    await feed.aclose()


async def test_entsoe_a_slow_answer_is_given_up(api: GridApi) -> None:
    api.on("/api", Answer(document(), delay=0.5))
    feed = entsoe(api, "2026-12-04T11:20", timeout=0.1)
    with pytest.raises(FeedError, match=r"no answer within 0\.1s"):
        await feed.current()
    await feed.aclose()


def test_entsoe_zones_by_name_or_eic_and_what_the_config_needs() -> None:
    assert eic_code("de-lu") == "10Y1001A1001A82H"
    assert eic_code("10YNL----------L") == "10YNL----------L"
    with pytest.raises(ConfigError, match="'Atlantis' is not a bidding zone"):
        eic_code("Atlantis")
    with pytest.raises(ConfigError, match=r"\[signals.price\] token"):
        make_feed(SignalConfig(feed="entsoe", region="DE-LU"), where="[signals.price]")
    with pytest.raises(ConfigError, match=r"\[signal\] region"):
        make_feed(SignalConfig(feed="energy-charts"))
    for feed in ("energy-charts", "entsoe"):
        assert feed_unit(SignalConfig(feed=feed)) == "EUR/MWh"
