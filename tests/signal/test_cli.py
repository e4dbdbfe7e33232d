"""`lowtide signal ...` as a user runs it: `watch` in one process prints the change made by
`set` in another within a blink, and keeps watching across a restart of the signal service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from datetime import UTC, datetime, timedelta

from lowtide_client import SignalClient
from signal_service.domain import Point
from signal_service.server import SignalServer, start_signal_service
from tests.signal.conftest import signal_config


async def lowtide(*args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, LOWTIDE_LOG_LEVEL="WARNING")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lowtide", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def test_watch_prints_the_change_that_set_makes(signal_server: SignalServer) -> None:
    watch = await lowtide("signal", "watch", "--json", "--target", signal_server.target)
    try:
        assert watch.stdout is not None
        first = json.loads(await asyncio.wait_for(watch.stdout.readline(), 20.0))
        assert first["name"] == "grid" and first["high"] is True and "value" not in first

        setter = await lowtide("signal", "set", "520", "--target", signal_server.target)
        out, err = await asyncio.wait_for(setter.communicate(), 20.0)
        assert setter.returncode == 0, err.decode()
        assert out.decode().startswith("grid 520 gCO2/kWh high threshold=400")

        changed = json.loads(await asyncio.wait_for(watch.stdout.readline(), 5.0))
        assert (changed["value"], changed["high"], changed["source"]) == (520.0, True, "manual")
        assert changed["version"] > first["version"]
    finally:
        watch.terminate()
        await watch.wait()


async def test_watch_forecast_prints_each_new_forecast_once(signal_server: SignalServer) -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    watch = await lowtide("signal", "watch", "--forecast", "--target", signal_server.target)
    try:
        assert watch.stdout is not None
        first = (await asyncio.wait_for(watch.stdout.readline(), 20.0)).decode()
        assert first.startswith("grid no value yet (gCO2/kWh) high")
        points = [Point(at, 300.0), Point(at + timedelta(minutes=30), 120.0), Point(at + timedelta(hours=1), 200.0)]
        await signal_server.signals.set_forecast("grid", points, source="replay")
        # The same forecast again is not news.
        await signal_server.signals.set_forecast("grid", points, source="replay")
        line = (await asyncio.wait_for(watch.stdout.readline(), 5.0)).decode()
        assert line.startswith("grid forecast from=replay version=1 points=3 2026-11-30T12:00:00Z..")
        assert "lowest=120 at 2026-11-30T12:30:00Z" in line
        async with SignalClient(signal_server.target) as client:
            await client.set(90.0)
        line = (await asyncio.wait_for(watch.stdout.readline(), 5.0)).decode()
        assert line.startswith("grid 90 gCO2/kWh low")
    finally:
        watch.terminate()
        await watch.wait()


async def test_a_refused_value_exits_non_zero_with_the_reason(signal_server: SignalServer) -> None:
    setter = await lowtide("signal", "set", "--target", signal_server.target, "--", "-5")
    _, err = await asyncio.wait_for(setter.communicate(), 20.0)
    assert setter.returncode == 1
    assert "INVALID_ARGUMENT: value: is -5, but a value in gCO2/kWh cannot be negative" in err.decode()


async def test_watch_reconnects_by_itself_when_the_service_restarts(database_url: str) -> None:
    first_run = await start_signal_service(signal_config(), database_url=database_url)
    address = first_run.target
    second_run: SignalServer | None = None
    watch = await lowtide("signal", "watch", "--json", "--target", address)
    try:
        assert watch.stdout is not None
        before = json.loads(await asyncio.wait_for(watch.stdout.readline(), 20.0))
        await first_run.stop()
        # The same address and database, as after `systemctl restart` or a pod restart.
        second_run = await start_signal_service(signal_config(listen=address), database_url=database_url)
        async with SignalClient(address) as client:
            await client.set(610)
        # The next line is the value set after the restart: the state the new service
        # sends on resubscribing is the one already printed, and is not printed twice.
        line = await asyncio.wait_for(watch.stdout.readline(), 10.0)
        assert line, "watch ended when the service stopped instead of reconnecting"
        after = json.loads(line)
        assert (after["value"], after["source"]) == (610.0, "manual")
        assert after["version"] > before["version"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            watch.terminate()
        await asyncio.wait_for(watch.wait(), 10.0)
        await first_run.stop()
        if second_run is not None:
            await second_run.stop()


async def test_list_shows_every_signal_with_its_unit_and_threshold(signal_server: SignalServer) -> None:
    async with SignalClient(signal_server.target) as client:
        await client.set(-3.5, name="price")
    listing = await lowtide("signal", "list", "--target", signal_server.target)
    out, err = await asyncio.wait_for(listing.communicate(), 20.0)
    assert listing.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].startswith("grid no value yet (gCO2/kWh) high threshold=400")
    assert lines[1].startswith("price -3.5 EUR/MWh low threshold=100")


async def test_forecast_prints_each_points_error_and_its_source(signal_server: SignalServer) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    points = [Point(now + timedelta(hours=h), 300.0 - h) for h in (1, 6, 24)]
    await signal_server.signals.set_forecast("grid", points, source="uk-carbon-intensity")
    shown = await lowtide("signal", "forecast", "--target", signal_server.target)
    out, err = await asyncio.wait_for(shown.communicate(), 20.0)
    assert shown.returncode == 0, err.decode()
    header, *lines = out.decode().splitlines()
    assert header.startswith("grid forecast from=uk-carbon-intensity version=1 issued=")
    assert header.endswith("points=3 caution=1 (the prior's)")
    # One line a point: its time, value, expected error, bias and where the error comes from (the
    # prior's horizon-growing error here: nothing learned yet).
    assert len(lines) == 3
    for line, point in zip(lines, points, strict=True):
        at, value, error, bias, source = line.split(" ", 4)
        assert (at, value, bias, source) == (
            f"{point.at.replace(tzinfo=None).isoformat()}Z",
            f"{point.value:g}",
            "bias=+0.0%",
            "(prior)",
        )
        assert error.startswith("error=") and error.endswith("%")
    errors = [float(line.split()[2][6:-1]) for line in lines]
    assert 0 < errors[0] < errors[1] < errors[2]

    as_json = await lowtide("signal", "forecast", "--json", "--target", signal_server.target)
    out, err = await asyncio.wait_for(as_json.communicate(), 20.0)
    assert as_json.returncode == 0, err.decode()
    data = json.loads(out)
    assert data["signal"] == "grid"
    stated = data["forecast"]["points"]
    assert [p["error_source"] for p in stated] == ["prior"] * 3
    assert all(p["expected_error"] > 0 for p in stated)
    assert data["forecast"]["calibration"]["caution"] == 1.0
