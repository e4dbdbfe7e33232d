"""The recorded feed: a real feed's issued forecasts and the values that came, replayed at a speed.
Alone with a clock the test moves, then driving a signal service over gRPC: a subscriber sees the
actual values, and GetForecast gives the forecast issued latest before where the replay is, as
it was issued (bare values), never a later one."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from lowtide.config import SignalDefinition, load_config
from lowtide.errors import ConfigError
from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.feeds import feed_settings, make_feed
from signal_service.feeds.recorded import Recorded, load_recording
from signal_service.server import start_signal_service
from tests.docs.blocks import block_run_by
from tests.signal.conftest import signal_config

T0 = datetime(2023, 3, 14, tzinfo=UTC)
ACTUALS = [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0, 200.0, 210.0]
# Issued at 00:01, 01:31 and 03:01, each four half hours ahead from its own half hour, each with
# values of its own (so a forecast tells which issue it is).
ISSUES = {1: [101.0, 102.0, 103.0, 104.0], 91: [201.0, 202.0, 203.0, 204.0], 181: [301.0, 302.0, 303.0, 304.0]}


def _recording(folder: Path) -> tuple[str, str]:
    forecasts = folder / "forecasts.csv"
    rows = []
    for minute, values in ISSUES.items():
        issued = T0 + timedelta(minutes=minute)
        first = T0 + timedelta(minutes=minute // 30 * 30)
        rows += [
            f"{issued:%Y-%m-%dT%H:%MZ},{first + timedelta(minutes=30 * i):%Y-%m-%dT%H:%MZ},{v:g}"
            for i, v in enumerate(values)
        ]
    forecasts.write_text("issued_at,target,forecast\n" + "\n".join(rows) + "\n")
    actuals = folder / "actuals.csv"
    lines = [f"{T0 + timedelta(minutes=30 * i):%Y-%m-%dT%H:%MZ},{v:g}" for i, v in enumerate(ACTUALS)]
    actuals.write_text("target,actual\n" + "\n".join(lines) + "\n")
    return str(forecasts), str(actuals)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_issues_each_recorded_forecast_at_its_time_and_plays_the_actuals(tmp_path: Path) -> None:
    forecasts, actuals = _recording(tmp_path)
    clock, began = Clock(), datetime(2026, 1, 1, tzinfo=UTC)
    # 1800x: a recorded half hour per second; the replay begins at the first issue, 00:01.
    feed = Recorded(
        load_recording(forecasts=forecasts, actuals=actuals), speed=1800.0, clock=clock, wall_clock=lambda: began
    )
    assert (await feed.current()).value == 100.0
    assert [p.value for p in await feed.forecast()] == ISSUES[1]
    # Its points at the wall-clock times the replay reaches them: 00:00 was a minute before it began.
    assert (await feed.forecast())[0].at == began - timedelta(minutes=1) / 1800
    assert feed.interval(60.0) == pytest.approx(29 / 30, abs=0.01)
    clock.now += 89 / 30 - 0.01  # just before 01:30
    assert ((await feed.current()).value, [p.value for p in await feed.forecast()]) == (120.0, ISSUES[1])
    clock.now += 0.02  # 01:30: the value of its half hour; the forecast of 01:31 not yet
    assert ((await feed.current()).value, [p.value for p in await feed.forecast()]) == (130.0, ISSUES[1])
    clock.now += 1 / 30
    assert [p.value for p in await feed.forecast()] == ISSUES[91]
    assert feed.forecast_issue() == (0, 1)
    # The lap ends a half hour after the last value (05:30 + 30 min), and starts again at 00:01.
    clock.now = 1000.0 + (6 * 60 - 1) / 30 + 0.01
    assert ((await feed.current()).value, [p.value for p in await feed.forecast()]) == (100.0, ISSUES[1])
    assert feed.forecast_issue() == (1, 0)
    # Without looping, the last value and forecast hold.
    held = Recorded(load_recording(forecasts=forecasts, actuals=actuals), speed=1800.0, loop=False, clock=clock)
    clock.now += 1000
    assert ((await held.current()).value, [p.value for p in await held.forecast()]) == (210.0, ISSUES[181])


def test_the_feeds_page_configuration_plays_the_bundled_week(tmp_path: Path) -> None:
    (block,) = block_run_by("tests/signal/test_recorded.py", "docs/how-to/feeds.md", "toml")
    (tmp_path / "lowtide.toml").write_text(block.text)
    feed = make_feed(load_config(tmp_path / "lowtide.toml", env={}).signal)
    assert isinstance(feed, Recorded) and feed.time_scale == 1440.0
    issue = feed.issue_now()
    assert issue is not None and issue.issued_at == datetime(2023, 3, 14, 3, 31, tzinfo=UTC)
    assert len(issue.points) == 96  # 48 h of half hours


def test_a_named_signal_plays_its_own_recording(tmp_path: Path) -> None:
    forecasts, actuals = _recording(tmp_path)
    week = SignalDefinition(
        feed="recorded", recorded_forecasts=forecasts, recorded_actuals=actuals, replay_speed=60.0, threshold=150.0
    )
    settings = feed_settings(signal_config({"week": week}))["week"]
    feed = make_feed(settings.options, where=settings.where)
    assert isinstance(feed, Recorded) and feed.time_scale == 60.0
    issue = feed.issue_now()
    assert issue is not None and [v for _, v in issue.points] == ISSUES[1]
    with pytest.raises(ConfigError, match=r"\[signals.week\] recorded_forecasts, recorded_actuals: give both"):
        only = SignalDefinition(feed="recorded", recorded_forecasts=forecasts)
        settings = feed_settings(signal_config({"week": only}))["week"]
        make_feed(settings.options, where=settings.where)


@pytest.mark.parametrize(
    ("forecasts", "actuals", "message"),
    [
        ("issued_at,target\n", "target,actual\n", "header 'issued_at,target,forecast'"),
        ("issued_at,target,forecast\n2023-03-14T00:01Z,soon,1\n", "", "give both files"),
        ("issued_at,target,forecast\n2023-03-14T00:01Z,soon,1\n", "target,actual\n", "line 2: expected"),
        ("issued_at,target,forecast\n2023-03-14T00:01Z,2023-03-14T00:00Z,1\n", "target,actual\n", "at least two"),
        ("issued_at,target,forecast\n2023-03-14T00:01Z,2023-03-14T00:00Z,nan\n", "target,actual\n", "line 2"),
        (
            "issued_at,target,forecast\n2023-03-14T00:01Z,2023-03-14T00:00Z,1\n",
            "target,actual\n2023-03-14T00:00Z,1\n2023-03-14T00:30Z,inf\n",
            "line 3: expected 'target,actual'",
        ),
    ],
)
def test_a_bad_recording_is_refused_naming_what_is_wrong(
    tmp_path: Path, forecasts: str, actuals: str, message: str
) -> None:
    (tmp_path / "f.csv").write_text(forecasts)
    (tmp_path / "a.csv").write_text(actuals)
    with pytest.raises(ConfigError, match=message):
        load_recording(forecasts=str(tmp_path / "f.csv"), actuals=str(tmp_path / "a.csv") if actuals else "")


def test_an_unknown_recording_and_a_start_outside_it_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="recording: 'uk-2099' is not one of uk-2023-03"):
        load_recording("uk-2099")
    forecasts, actuals = _recording(tmp_path)
    with pytest.raises(ConfigError, match=r"replay_start: .* is outside the recording"):
        Recorded(load_recording(forecasts=forecasts, actuals=actuals), speed=1.0, start=T0 + timedelta(days=2))


async def test_a_subscriber_sees_the_actuals_and_get_forecast_the_forecast_issued_latest_before_now(
    database_url: str, tmp_path: Path
) -> None:
    forecasts, actuals = _recording(tmp_path)
    # A recorded half hour a second; a refresh far longer than the run: a new forecast is asked
    # for because the recording issued one, not because the refresh came round.
    feed = Recorded(load_recording(forecasts=forecasts, actuals=actuals), speed=1800.0)
    config = signal_config(feed="recorded", refresh=timedelta(hours=1))
    running = await start_signal_service(config, database_url=database_url, feed=feed)
    seen: list[float] = []
    try:
        async with SignalClient(running.target) as client, grpc.aio.insecure_channel(running.target) as channel:
            stub = signal_pb2_grpc.SignalServiceStub(channel)

            async def watch() -> None:
                async for state in client.subscribe():
                    if state.HasField("value") and (not seen or seen[-1] != state.value):
                        assert state.source == "recorded"
                        seen.append(state.value)

            watching = asyncio.create_task(watch())
            given: set[tuple[int, int]] = set()
            versions: set[int] = set()
            loop = asyncio.get_running_loop()
            until = loop.time() + 13.0  # a lap (12 s) and a little
            while loop.time() < until:
                before = feed.forecast_issue()
                response = await stub.GetForecast(signal_pb2.GetForecastRequest())
                after = feed.forecast_issue()
                if response.points:
                    issue = _which(feed, response)
                    # Never a forecast issued later than where the replay is, and at most the one
                    # before the newest (the poll that stores the newest may be under way).
                    assert _count(before) - 1 <= _count(issue) <= _count(after), (before, issue, after)
                    # Stored once the replay had reached its issue time, not before.
                    issued = response.issued_at.ToDatetime(tzinfo=UTC)
                    assert issued >= feed.wall(list(ISSUE_TIMES)[issue[1]], issue[0]) - timedelta(milliseconds=50)
                    # As issued: bare values, whose error is the calibration's, not the feed's.
                    assert all(p.error_source != "feed" for p in response.points)
                    given.add(issue)
                    versions.add(response.version)
                await asyncio.sleep(0.1)
            watching.cancel()
        # Every recorded forecast of the lap was given, each stored once, not once per poll.
        assert {(0, 0), (0, 1), (0, 2)} <= given
        assert len(versions) <= len(given) + 1
        # The values that came, in their order (a slow reader may skip one), lap after lap.
        assert set(seen) <= set(ACTUALS) and len(set(seen)) >= 10, seen
        steps = {(ACTUALS.index(b) - ACTUALS.index(a)) % len(ACTUALS) for a, b in itertools.pairwise(seen)}
        assert steps <= {1, 2}, seen
    finally:
        await running.stop()


ISSUE_TIMES = {T0 + timedelta(minutes=minute): T0 + timedelta(minutes=minute // 30 * 30) for minute in ISSUES}


def _count(issue: tuple[int, int]) -> int:
    """Forecasts issued before this one, over the laps."""
    return issue[0] * len(ISSUES) + issue[1]


def _which(feed: Recorded, response: signal_pb2.GetForecastResponse) -> tuple[int, int]:
    """The (lap, issue) of a forecast, from its values and the wall-clock time of its first point."""
    values = [p.value for p in response.points]
    found = [i for i, issued in enumerate(ISSUES.values()) if issued == values]
    assert found, f"not a recorded forecast: {values}"
    first = response.points[0].at.ToDatetime(tzinfo=UTC)
    target = list(ISSUE_TIMES.values())[found[0]]
    for lap in range(3):
        if abs((feed.wall(target, lap) - first).total_seconds()) < 1e-3:
            return lap, found[0]
    raise AssertionError(f"its first point {first} is at no lap's time of {target}")
