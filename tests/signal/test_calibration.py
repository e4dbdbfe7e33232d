"""A signal's forecast calibration, live: the replay feed issues bare forecasts (its error hidden,
as a real feed's is), the service keeps them and the values that came in PostgreSQL, and the
error it states for each point converges to the replay model's; a restart keeps it."""

from __future__ import annotations

import re
from datetime import timedelta

from lowtide.forecast_error import HorizonError
from lowtide_client import SignalClient
from lowtide_proto.lowtide.v1 import signal_pb2
from signal_service.server import start_signal_service
from tests.helpers import eventually
from tests.signal.conftest import signal_config

# A trace day in 10 s: a week of half-hourly forecasts in 70 s (faster, and a poll's own latency
# moves a point's lead by more than the buckets are wide).
SPEED = 86_400 / 10
LEARNED = re.compile(r"learned over ([0-9.]+) days")


def _at_lead(points: list[signal_pb2.SignalPoint], hours: float) -> signal_pb2.SignalPoint:
    first = points[0].at.ToDatetime()
    target = first + timedelta(hours=hours) / SPEED
    return min(points, key=lambda p: abs(p.at.ToDatetime() - target))


def _days(points: list[signal_pb2.SignalPoint]) -> float:
    found = [LEARNED.fullmatch(p.error_source) for p in points]
    return min((float(m.group(1)) for m in found if m), default=0.0)


async def test_the_stated_error_converges_to_the_feeds_and_a_restart_keeps_it(database_url: str) -> None:
    config = signal_config(
        feed="replay",
        replay_speed=SPEED,
        replay_states_error=False,
        calibrate_every=timedelta(seconds=1),
        refresh=timedelta(seconds=1),
    )
    model = HorizonError()
    server = await start_signal_service(config, database_url=database_url)
    try:
        async with SignalClient(server.target) as client:
            first = await eventually(client.forecast, within=60)
            # Before any record: the prior states the error.
            assert {p.error_source for p in first} <= {"prior"}
            assert all(p.HasField("expected_error") for p in first)

            async def learned_a_week() -> list[signal_pb2.SignalPoint] | None:
                points = await client.forecast()
                return points if _days(points) >= 7 else None

            points = await eventually(learned_a_week, within=240, interval=0.5)
            assert points is not None
            # A point's error is learned for its lead's bucket (1 to 2 h, 6 to 8 h, 24 to 30 h):
            # within 25 % of the model's over that bucket.
            for hours, (lo, hi) in ((1, (1, 2)), (6, (6, 8)), (24, (24, 30))):
                error = _at_lead(points, hours + 0.25).expected_error
                low, high = model.stddev(timedelta(hours=lo)), model.stddev(timedelta(hours=hi))
                assert 0.75 * low <= error <= 1.25 * high, (hours, error, low, high)
            # The metrics show it, by lead bucket, with the points it was learned from.
            assert server.metrics is not None
            text = server.metrics.text()
            assert re.search(r'lowtide_signal_forecast_error\{lead="24",signal="grid"\} 0\.[12]', text), text
            samples = re.search(r'lowtide_signal_forecast_samples\{lead="24",signal="grid"\} ([0-9.]+)', text)
            assert samples is not None and float(samples.group(1)) > 100
    finally:
        await server.stop()

    # A restart: the record is in PostgreSQL, so the new replica states what was learned (not
    # the prior) from its first learning on, long before a week of new forecasts.
    again = await start_signal_service(config, database_url=database_url)
    try:
        async with SignalClient(again.target) as client:

            async def kept() -> bool:
                return _days(await client.forecast()) >= 7

            await eventually(kept, within=30, interval=0.2)
    finally:
        await again.stop()
