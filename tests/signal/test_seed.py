"""At start, the UK feed stores the API's past forecasts beside the values that came for the
signal's calibration: the shortest leads state the error learned from them at once, the longer
ones the prior (the API does not say how far ahead those forecasts were made); a restart asks
for none of the days it stored."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.feeds.base import HttpJson
from signal_service.feeds.uk_carbon_intensity import UkCarbonIntensity
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config
from tests.signal.grid_server import Answer, GridApi, grid_api

HALF_HOUR = timedelta(minutes=30)
STAMP = "%Y-%m-%dT%H:%MZ"
TRUTH = 300.0
DAYS = 3


def _entry(start: datetime, forecast: float, actual: float | None) -> dict[str, object]:
    intensity = {"forecast": forecast, "actual": actual, "index": "moderate"}
    return {"from": start.strftime(STAMP), "to": (start + HALF_HOUR).strftime(STAMP), "intensity": intensity}


def _answer(path: str) -> dict[str, object]:
    """`/intensity/{from}/fw48h`: a flat forecast; `/intensity/{from}/{to}`: every half hour with
    the forecast the API last published for it (the values that came were 5 % or 15 % above it,
    in turn: a bias of 0.1, a spread of 0.05) and its actual value."""
    _, _, first, second = path.split("/")
    start = datetime.strptime(first, STAMP).replace(tzinfo=UTC)
    if second == "fw48h":
        return {"data": [_entry(start + i * HALF_HOUR, TRUTH, None) for i in range(96)]}
    end = datetime.strptime(second, STAMP).replace(tzinfo=UTC)
    entries, at, i = [], start, 0
    while at < end:
        entries.append(_entry(at, round(TRUTH / (1.05 if i % 2 else 1.15), 3), TRUTH))
        at, i = at + HALF_HOUR, i + 1
    return {"data": entries}


def _past(api: GridApi) -> list[str]:
    return [p for p in api.paths() if p.startswith("/intensity/") and not p.endswith("/fw48h")]


def _answering(api: GridApi, answer: Callable[[str], dict[str, object]] = _answer) -> None:
    """The API's value for the current half hour, and its forecasts and past from `answer`."""
    now = datetime.now(UTC)
    slot = now.replace(minute=30 * (now.minute // 30), second=0, microsecond=0)
    api.on("/intensity", Answer({"data": [_entry(slot, TRUTH, TRUTH)]}))
    api.on("/intensity/*", Answer(answer))


async def _seeded(caplog: pytest.LogCaptureFixture, *, within: float) -> logging.LogRecord:
    """The seeding's one `calibration.seeded` record, once logged."""

    async def seeded() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "calibration.seeded"]

    (done,) = await eventually(seeded, within=within)
    return done


async def _forecast(target: str) -> signal_pb2.GetForecastResponse:
    async with grpc.aio.insecure_channel(target) as channel:
        response: signal_pb2.GetForecastResponse = await signal_pb2_grpc.SignalServiceStub(channel).GetForecast(
            signal_pb2.GetForecastRequest()
        )
        return response


def _at_lead(response: signal_pb2.GetForecastResponse, hours: float) -> signal_pb2.SignalPoint:
    """The point whose lead is in [hours, hours + 0.5) (the points are half an hour apart)."""
    issued, lead = response.issued_at.ToDatetime(), timedelta(hours=hours)
    return next(p for p in response.points if lead <= p.at.ToDatetime() - issued < lead + HALF_HOUR)


async def test_the_uk_feeds_past_forecasts_seed_the_short_leads_at_start(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lowtide.signal.feed")
    with grid_api() as api:
        _answering(api)
        config = signal_config(refresh=timedelta(milliseconds=200), calibration_seed_days=DAYS)

        def feed() -> UkCarbonIntensity:
            return UkCarbonIntensity(HttpJson(api.url, timeout=2.0, backoff_initial=0.01, backoff_max=0.02))

        server = await start_signal_service(config, database_url=database_url, feed=feed())
        try:

            async def learned() -> signal_pb2.GetForecastResponse | None:
                response = await _forecast(server.target)
                near = _at_lead(response, 0.5) if response.points else None
                return response if near is not None and near.error_source.startswith("learned over") else None

            response = await eventually(learned, within=30)
            assert response is not None
        finally:
            await server.stop()
        # A request a day, for the days configured.
        assert len(_past(api)) == DAYS
        near = _at_lead(response, 0.5)
        # Learned from 144 forecasts (weighted 144 / 152 against the prior): the bias of 0.1 and
        # the spread of 0.05 / 1.1.
        assert 0.08 < near.bias < 0.11, near
        assert 0.05 < near.expected_error < 0.08, near
        # Further ahead, nothing was learned: the prior, no bias.
        far = _at_lead(response, 6)
        assert far.error_source == "prior" and far.bias == 0.0, far

        # A restart asks for none of the days already stored.
        caplog.clear()
        again = await start_signal_service(config, database_url=database_url, feed=feed())
        try:
            done = await _seeded(caplog, within=15)
        finally:
            await again.stop()
        assert (done.requests, done.stored) == (0, 0)  # type: ignore[attr-defined]
        assert len(_past(api)) == DAYS


async def test_the_signal_is_polled_while_the_past_is_asked_for(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An API slow to give its past (each day's answer takes 2 s here; a seeding may take up to its
    timeout): the signal's value is polled all the while, not once the seeding is done (the
    signal went stale, and the feed's lease lapsed, behind a slow seeding)."""
    caplog.set_level(logging.INFO, logger="lowtide.signal.feed")

    def slow_past(path: str) -> dict[str, object]:
        if not path.endswith("/fw48h"):
            time.sleep(2.0)
        return _answer(path)

    with grid_api() as api:
        _answering(api, slow_past)
        config = signal_config(refresh=timedelta(milliseconds=200), calibration_seed_days=DAYS)
        feed = UkCarbonIntensity(HttpJson(api.url, timeout=5.0, backoff_initial=0.01, backoff_max=0.02))
        server = await start_signal_service(config, database_url=database_url, feed=feed)
        try:
            done = await _seeded(caplog, within=60)
        finally:
            await server.stop()
    assert done.requests == DAYS  # type: ignore[attr-defined]
    past = [r.at for r in api.requests if r.path.startswith("/intensity/") and not r.path.endswith("/fw48h")]
    polls = [r.at for r in api.to("/intensity") if min(past) < r.at < max(past)]
    # The seeding's requests are spread over 4 s or more; a poll every 0.2 s meanwhile.
    assert len(polls) >= 3, (past, polls)
