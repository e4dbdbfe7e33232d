"""Each feed adapter against a real local HTTP server answering with the APIs' real shapes:
good answers, HTTP errors, timeouts, malformed JSON, WattTime's token expiry, an answer for
another zone, and a plan without forecasts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from urllib.parse import parse_qs

import pytest

from lowtide.config import SignalConfig
from signal_service.feeds import feed_unit, make_feed
from signal_service.feeds.base import FeedError, ForecastUnavailable, HttpJson
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
        (Answer({"data": [uk_entry("2026-11-29T23:00Z", 1, 1)]}, delay=2.0), "no answer within 0.5s"),
    ],
)
async def test_uk_bad_answers_raise_feed_error(api: GridApi, answer: Answer, message: str) -> None:
    api.on("/intensity", answer)
    # A timeout short only where the case is the timeout: a loaded machine may take longer than
    # a fraction of a second to answer three tries of the others.
    timeout = 0.5 if answer.delay else 10.0
    feed = UkCarbonIntensity(http(api, timeout=timeout))
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


EM_FORECAST = {
    "zone": "DE",
    "forecast": [
        {"carbonIntensity": 310, "datetime": "2026-11-30T00:00:00.000Z"},
        {"carbonIntensity": 290, "datetime": "2026-11-30T01:00:00.000Z"},
    ],
    "updatedAt": "2026-11-29T22:41:10.468Z",
}


async def test_electricitymaps_latest_and_forecast_with_the_token_no_caller_lookup_and_lifecycle(
    api: GridApi,
) -> None:
    api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST))
    api.on("/v3/carbon-intensity/forecast", Answer(EM_FORECAST))
    feed = ElectricityMaps(http(api), zone="DE", token="secret")
    current, points = await feed.current(), await feed.forecast()
    await feed.aclose()
    assert (current.value, current.observed_at) == (302.0, datetime(2026, 11, 29, 23, tzinfo=UTC))
    assert [p.value for p in points] == [310.0, 290.0]
    assert all(r.headers["auth-token"] == "secret" for r in api.requests)
    # Every request names the zone and the emission factor, and turns the caller-IP fallback off.
    for request in api.requests:
        assert parse_qs(request.query) == {
            "zone": ["DE"],
            "emissionFactorType": ["lifecycle"],
            "disableCallerLookup": ["true"],
            "shouldUseFallbackCallerLookup": ["false"],
        }


async def test_electricitymaps_direct_emission_factor_is_asked_for_and_checked(api: GridApi) -> None:
    api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST | {"emissionFactorType": "direct", "carbonIntensity": 250}))
    feed = ElectricityMaps(http(api), zone="DE", token="secret", emission_factor="direct")
    reading = await feed.current()
    # An answer on the other factor than asked is refused, naming both.
    api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST))
    with pytest.raises(FeedError, match="'lifecycle' emission factor, not the configured 'direct'"):
        await feed.current()
    await feed.aclose()
    assert reading.value == 250.0
    assert parse_qs(api.requests[0].query)["emissionFactorType"] == ["direct"]


@pytest.mark.parametrize("path", ["/v3/carbon-intensity/latest", "/v3/carbon-intensity/forecast"])
async def test_electricitymaps_an_answer_for_another_zone_is_refused_naming_both(api: GridApi, path: str) -> None:
    # What the API does when it falls back to the caller's location: a good answer, elsewhere.
    api.on("/v3/carbon-intensity/latest", Answer(EM_LATEST | {"zone": "FR", "carbonIntensity": 40}))
    api.on("/v3/carbon-intensity/forecast", Answer(EM_FORECAST | {"zone": "FR"}))
    feed = ElectricityMaps(http(api), zone="DEE", token="secret")
    with pytest.raises(FeedError, match="the answer is for zone 'FR', not the configured 'DEE'"):
        await (feed.current() if path.endswith("latest") else feed.forecast())
    await feed.aclose()


async def test_electricitymaps_an_answer_without_a_zone_is_refused(api: GridApi) -> None:
    api.on("/v3/carbon-intensity/latest", Answer({k: v for k, v in EM_LATEST.items() if k != "zone"}))
    feed = ElectricityMaps(http(api), zone="DE", token="secret")
    with pytest.raises(FeedError, match="zone None, not the configured 'DE'"):
        await feed.current()
    await feed.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        Answer({"message": "Unauthorized: your plan does not include this endpoint"}, status=401),
        Answer({"message": "Forbidden"}, status=403),
    ],
)
async def test_electricitymaps_a_plan_without_forecasts_is_told_apart(api: GridApi, answer: Answer) -> None:
    api.on("/v3/carbon-intensity/forecast", answer)
    feed = ElectricityMaps(http(api), zone="DE", token="free-tier")
    with pytest.raises(ForecastUnavailable, match=f"HTTP {answer.status}"):
        await feed.forecast()
    await feed.aclose()


def test_electricitymaps_calls_the_current_host_with_the_configured_factor() -> None:
    config = SignalConfig(feed="electricitymaps", region="DE", token="t", emission_factor="direct")
    feed = make_feed(config)
    assert isinstance(feed, ElectricityMaps)
    assert feed._http.base_url == "https://api.electricitymaps.com"
    assert (feed.zone, feed.emission_factor) == ("DE", "direct")


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


def wt_forecast(*values: float, region: str = "CAISO_NORTH") -> dict[str, object]:
    """/v3/forecast's answer: 5-minute points from 23:05, the first for the current five minutes."""
    data = [{"point_time": f"2026-11-29T23:{5 + 5 * i:02d}:00+00:00", "value": value} for i, value in enumerate(values)]
    meta = {
        "data_point_period_seconds": 300,
        "region": region,
        "warnings": [],
        "signal_type": "co2_moer",
        "model": {"date": "2023-03-01"},
        "units": "lbs_co2_per_mwh",
        "generated_at_period_seconds": 300,
        "generated_at": "2026-11-29T23:05:00+00:00",
    }
    return {"data": data, "meta": meta}


def moer(api: GridApi) -> WattTime:
    return WattTime(http(api), username="me", password="pw", region="CAISO_NORTH", signal="moer")


async def test_watttime_moer_is_the_forecast_first_point_then_the_rest_as_given(api: GridApi) -> None:
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", Answer(wt_forecast(900.0, 700.0, 800.5, 1100.0)))
    feed = moer(api)
    reading = await feed.current()
    points = await feed.forecast()
    await feed.aclose()
    assert (reading.value, reading.unit, reading.observed_at) == (
        900.0,
        "lbs/MWh",
        datetime(2026, 11, 29, 23, 5, tzinfo=UTC),
    )
    # WattTime's own numbers in its own unit: nothing rescaled.
    assert [(p.at.minute, p.value) for p in points] == [(10, 700.0), (15, 800.5), (20, 1100.0)]
    # One request for both; the index is not asked.
    assert api.paths() == ["/login", "/v3/forecast"]
    request = api.to("/v3/forecast")[0]
    assert parse_qs(request.query) == {"region": ["CAISO_NORTH"], "signal_type": ["co2_moer"]}
    assert request.headers["authorization"] == "Bearer t1"


async def test_watttime_moer_forecast_asked_alone_is_the_points_after_the_current_one(api: GridApi) -> None:
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", Answer(wt_forecast(650.0, 640.0, 630.0)))
    feed = moer(api)
    points = await feed.forecast()
    await feed.aclose()
    assert [p.value for p in points] == [640.0, 630.0]


async def test_watttime_moer_without_forecast_access_fails_the_value_and_the_forecast(api: GridApi) -> None:
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", Answer({"error": "Unauthorized: no access to forecast"}, status=403))
    feed = moer(api)
    with pytest.raises(FeedError, match=r"HTTP 403.*watttime_signal = index"):
        await feed.current()
    # The poll's forecast is that same refusal, as for a plan without forecasts, not asked again.
    with pytest.raises(ForecastUnavailable, match="HTTP 403"):
        await feed.forecast()
    await feed.aclose()
    assert len(api.to("/v3/forecast")) == 1


async def test_watttime_a_refused_login_is_not_taken_for_a_plan_without_forecasts(api: GridApi) -> None:
    api.on("/login", Answer({"error": "bad credentials"}, status=403))
    feed = moer(api)
    with pytest.raises(FeedError, match=r"HTTP 403.*username and password") as caught:
        await feed.forecast()
    await feed.aclose()
    assert not isinstance(caught.value, ForecastUnavailable)
    assert api.to("/v3/forecast") == []


async def test_watttime_index_has_no_forecast_and_asks_none(api: GridApi) -> None:
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", Answer(wt_forecast(650.0, 640.0)))
    feed = WattTime(http(api), username="me", password="pw", region="CAISO_NORTH")
    assert (feed.unit, feed.has_forecast) == ("percentile", False)
    with pytest.raises(ForecastUnavailable, match="no forecast"):
        await feed.forecast()
    await feed.aclose()
    assert api.requests == []


def test_watttime_signal_comes_from_the_config() -> None:
    base = SignalConfig(feed="watttime", username="me", password="pw", region="CAISO_NORTH")
    for config, unit in ((base, "percentile"), (replace(base, watttime_signal="moer"), "lbs/MWh")):
        feed = make_feed(config)
        assert isinstance(feed, WattTime)
        assert (feed.unit, feed_unit(config), feed.has_forecast) == (unit, unit, unit == "lbs/MWh")


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (Answer(wt_forecast(1.0, 2.0, region="PJM_DC")), FeedError, "region 'PJM_DC', not 'CAISO_NORTH'"),
        (Answer({"data": [{"point_time": "later", "value": 1}], "meta": {}}), FeedError, "ISO 8601"),
        (Answer({"meta": {}}), FeedError, "unexpected answer"),
        (Answer(wt_forecast(1.0, 2.0) | {"meta": {"units": "percentile"}}), FeedError, "'percentile', expected"),
        (Answer(wt_forecast()), FeedError, "no points"),
        (Answer({"error": "Unauthorized: no access to forecast"}, status=403), ForecastUnavailable, "HTTP 403"),
        (Answer({"error": "Payment required"}, status=402), ForecastUnavailable, "HTTP 402"),
    ],
)
async def test_watttime_bad_moer_answers_fail_the_value_and_the_forecast(
    api: GridApi, answer: Answer, error: type[FeedError], message: str
) -> None:
    """A bad answer fails the poll's value, and its forecast with it: as for a plan without
    forecasts (ForecastUnavailable) when the plan refused it, a plain FeedError otherwise."""
    api.on("/login", Answer({"token": "t1"}))
    api.on("/v3/forecast", answer)
    feed = moer(api)
    with pytest.raises(FeedError, match=message):
        await feed.current()
    with pytest.raises(FeedError, match=message) as caught:
        await feed.forecast()
    await feed.aclose()
    assert type(caught.value) is error
    assert len(api.to("/v3/forecast")) == 1
