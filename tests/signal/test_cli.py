"""`lowtide signal ...` as a user runs it: `watch` in one process prints the change made by
`set` in another within a blink."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from signal_service.server import SignalServer


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


async def test_a_refused_value_exits_non_zero_with_the_reason(signal_server: SignalServer) -> None:
    setter = await lowtide("signal", "set", "--target", signal_server.target, "--", "-5")
    _, err = await asyncio.wait_for(setter.communicate(), 20.0)
    assert setter.returncode == 1
    assert "INVALID_ARGUMENT: value: is -5, but a value in gCO2/kWh cannot be negative" in err.decode()
