"""Each feed adapter against a real local HTTP server answering with the APIs' real shapes:
good answers, HTTP errors, timeouts, malformed JSON, and WattTime's token expiry."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from signal_service.feeds.base import FeedError, HttpJson
from signal_service.feeds.electricitymaps import ElectricityMaps
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.feeds.watttime import TOKEN_RENEW_AFTER, WattTime
from tests.signal.grid_server import Answer, GridApi, grid_api


@pytest.fixture
def api() -> Iterator[GridApi]:
    with grid_api() as running:
        yield running


def http(api: GridApi, *, timeout: float = 0.5) -> HttpJson:
    return HttpJson(api.url, timeout=timeout, attempts=3, backoff_initial=0.01, backoff_max=0.02)


def uk_entry(start: str, forecast: int, actual: int | None) -> dict[str, object]:
    end = start[:-3] + ("30Z" if start.endswith("00Z") else "00Z")
    return {"from": start, "to": end, "intensity": {"forecast": forecast, "actual": actual, "index": "moderate"}}


# -- UK Carbon Intensity ------------------------------------------------------------------------


async def test_uk_actual_then_forecast_when_actual_is_missing(api: GridApi) -> None:
    api.on(
        "/intensity",
        Answer({"data": [uk_entry("2026-11-29T23:00Z", 180, 175)]}),
        Answer({"data": [uk_entry("2026-11-29T23:30Z", 190, None)]}),
    )
    feed = UkCarbonIntensity(http(api))
    first, second = await feed.current(), await feed.current()
    await feed.aclose()
    assert (first.value, first.observed_at, first.unit) == (175.0, datetime(2026, 11, 29, 23, tzinfo=UTC), "gCO2/kWh")
    assert second.value == 190.0


async def test_uk_regional_current_and_forecast(api: GridApi) -> None:
    regional = {
        "regionid": 13,
        "dnoregion": "UKPN London",
        "shortname": "London",
        "data": [{**uk_entry("2026-11-29T23:00Z", 140, None), "generationmix": [{"fuel": "gas", "perc": 30.1}]}],
    }
    api.on("/regional/regionid/13", Answer({"data": [regional]}))
    ahead = [uk_entry("2026-11-29T23:00Z", 140, None), uk_entry("2026-11-29T23:30Z", 150, None)]
    api.on(
        "/regional/intensity/2026-11-29T23:10Z/fw48h/regionid/13",
        Answer({"data": {"regionid": 13, "shortname": "London", "data": ahead}}),
    )
    feed = UkCarbonIntensity(http(api), region="13", now=lambda: datetime(2026, 11, 29, 23, 10, tzinfo=UTC))
    current, forecast = await feed.current(), await feed.forecast()
    await feed.aclose()
    assert current.value == 140.0
    assert [(p.at.minute, p.value) for p in forecast] == [(0, 140.0), (30, 150.0)]


async def test_uk_national_forecast(api: GridApi) -> None:
    ahead = [uk_entry("2026-11-29T23:30Z", 150, None), uk_entry("2026-11-30T00:00Z", 120, None)]
    api.on("/intensity/2026-11-29T23:10Z/fw48h", Answer({"data": ahead}))
    feed = UkCarbonIntensity(http(api), now=lambda: datetime(2026, 11, 29, 23, 10, tzinfo=UTC))
    forecast = await feed.forecast()
    await feed.aclose()
    assert [p.value for p in forecast] == [150.0, 120.0]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Answer({"error": {"code": "400 Bad Request", "message": "Invalid date"}}, status=400), "HTTP 400"),
        (Answer("<html>upstream down</html>", status=503), "HTTP 503 (after 3 tries)"),
        (Answer('{"data": [', status=200), "malformed JSON"),
        (Answer({"data": []}), "unexpected answer"),
        (Answer({"data": [uk_entry("2026-11-29T23:00Z", 180, None) | {"intensity": {"forecast": "high"}}]}), "number"),
        (Answer({"data": [uk_entry("2026-11-29T23:00Z", 1, 1)]}, delay=0.4), "no answer within 0.1s"),
    ],
)
async def test_uk_bad_answers_raise_feed_error(api: GridApi, answer: Answer, message: str) -> None:
    api.on("/intensity", answer)
    feed = UkCarbonIntensity(http(api, timeout=0.1))
    with pytest.raises(FeedError, match=message.replace("(", r"\(").replace(")", r"\)")):
        await feed.current()
    await feed.aclose()


async def test_a_failure_then_a_good_answer_is_retried_to_success(api: GridApi) -> None:
    api.on("/intensity", Answer("busy", status=502), Answer({"data": [uk_entry("2026-11-29T23:00Z", 99, 98)]}))
    feed = UkCarbonIntensity(http(api))
    reading = await feed.current()
    await feed.aclose()
    assert reading.value == 98.0
    assert api.paths() == ["/intensity", "/intensity"]


# -- Electricity Maps ---------------------------------------------------------------------------

EM_LATEST = {
    "zone": "DE",
    "carbonIntensity": 302,
    "datetime": "2026-11-29T23:00:00.000Z",
    "updatedAt": "2026-11-29T22:41:10.468Z",
    "createdAt": "2026-11-26T23:43:41.717Z",
    "emissionFactorType": "lifecycle",
    "isEstimated": True,
    "estimationMethod": "TIME_SLICER_AVERAGE",
}


async def test_electricitymaps_latest_and_forecast_with_the_token(api: GridApi) -> None:
    api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST))
    forecast = {
        "zone": "DE",
        "forecast": [
            {"carbonIntensity": 310, "datetime": "2026-11-30T00:00:00.000Z"},
            {"carbonIntensity": 290, "datetime": "2026-11-30T01:00:00.000Z"},
        ],
        "updatedAt": "2026-11-29T22:41:10.468Z",
    }
    api.on("/v3/carbon-intensity/forecast", Answer(forecast))
    feed = ElectricityMaps(http(api), zone="DE", token="secret")
    current, points = await feed.current(), await feed.forecast()
    await feed.aclose()
    assert (current.value, current.observed_at) == (302.0, datetime(2026, 11, 29, 23, tzinfo=UTC))
    assert [p.value for p in points] == [310.0, 290.0]
    assert all(r.headers["auth-token"] == "secret" and r.query == "zone=DE" for r in api.requests)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Answer({"message": "Unauthorized: invalid token"}, status=401), "HTTP 401"),
        (Answer({"error": "Zone 'XX' does not exist."}, status=404), "HTTP 404"),
        (Answer("not json"), "malformed JSON"),
        (Answer({"zone": "DE", "carbonIntensity": None, "datetime": "2026-11-29T23:00:00.000Z"}), "number"),
        (Answer(EM_LATEST, delay=0.4), "no answer"),
    ],
)
async def test_electricitymaps_bad_answers_raise_feed_error(api: GridApi, answer: Answer, message: str) -> None:
    api.on("/v3/carbon-intensity/latest", answer)
    feed = ElectricityMaps(http(api, timeout=0.1), zone="DE", token="secret")
    with pytest.raises(FeedError, match=message):
        await feed.current()
    await feed.aclose()


# -- WattTime -----------------------------------------------------------------------------------

WT_INDEX = {
    "data": [{"point_time": "2026-11-29T23:05:00+00:00", "value": 57.0}],
    "meta": {
        "data_point_period_seconds": 300,
        "region": "CAISO_NORTH",
        "signal_type": "co2_moer",
        "units": "percentile",
        "warnings": [],
        "model": {"date": "2023-03-01"},
    },
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_watttime_logs_in_once_and_renews_before_the_token_expires(api: GridApi) -> None:
    api.on("/login", Answer({"token": "t1"}), Answer({"token": "t2"}))
    api.on("/v3/signal-index", Answer(WT_INDEX))
    clock = Clock()
    feed = WattTime(http(api), username="me", password="pw", region="CAISO_NORTH", clock=clock)
    first = await feed.current()
    await feed.current()
    clock.now += TOKEN_RENEW_AFTER
    await feed.current()
    await feed.aclose()
    assert (first.value, first.unit, first.observed_at.minute) == (57.0, "percentile", 5)
    assert api.paths() == ["/login", "/v3/signal-index", "/v3/signal-index", "/login", "/v3/signal-index"]
    login = api.requests[0]
    assert login.headers["authorization"].startswith("Basic ")
    tokens = [r.headers["authorization"] for r in api.requests if r.path == "/v3/signal-index"]
    assert tokens == ["Bearer t1", "Bearer t1", "Bearer t2"]
    assert "region=CAISO_NORTH" in api.requests[1].query and "signal_type=co2_moer" in api.requests[1].query


async def test_watttime_logs_in_again_when_the_token_is_refused(api: GridApi) -> None:
    api.on("/login", Answer({"token": "old"}), Answer({"token": "new"}))
    api.on("/v3/signal-index", Answer(WT_INDEX), Answer({"error": "token expired"}, status=401), Answer(WT_INDEX))
    feed = WattTime(http(api), username="me", password="pw", region="CAISO_NORTH")
    await feed.current()
    reading = await feed.current()
    await feed.aclose()
    assert reading.value == 57.0
    assert feed.logins == 2
    assert api.paths() == ["/login", "/v3/signal-index", "/v3/signal-index", "/login", "/v3/signal-index"]


@pytest.mark.parametrize(
    ("login", "index", "message"),
    [
        (Answer({"error": "bad credentials"}, status=403), Answer(WT_INDEX), "HTTP 403"),
        (Answer({"nothing": 1}), Answer(WT_INDEX), "no token"),
        (Answer({"token": "t"}), Answer({**WT_INDEX, "meta": {"units": "lbs_co2_per_mwh"}}), "lbs_co2_per_mwh"),
        (Answer({"token": "t"}), Answer({"data": [], "meta": {}}), "unexpected answer"),
        (Answer({"token": "t"}), Answer("{oops"), "malformed JSON"),
    ],
)
async def test_watttime_bad_answers_raise_feed_error(api: GridApi, login: Answer, index: Answer, message: str) -> None:
    api.on("/login", login)
    api.on("/v3/signal-index", index)
    feed = WattTime(http(api), username="me", password="pw", region="CAISO_NORTH")
    with pytest.raises(FeedError, match=message):
        await feed.current()
    await feed.aclose()
