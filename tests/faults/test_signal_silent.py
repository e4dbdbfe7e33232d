"""The signal service goes silent without closing anything (SIGSTOP: its connections stay open,
nothing answers). The scheduler's Subscribe stream still counts as connected, yet its staleness
clock runs: after [signal] stale_after with no new value the signal is stale and [cost] on_stale
applies. Keepalive then finds the dead connection and the stream fails, so the scheduler
resubscribes instead of waiting on it for ever."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, SignalClient
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.domain.holds import HoldConfig, HoldPolicy
from scheduler_service.holds.cost import CostHolds
from tests.faults.support import free_port, kill_all, logs_of, service_process, until_serving
from tests.helpers import eventually


@pytest.mark.slow
async def test_a_silent_subscribe_stream_turns_stale_and_keepalive_ends_it(database_url: str, tmp_path: Path) -> None:
    signal_target = f"127.0.0.1:{free_port()}"
    target = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / "signal.log", tmp_path / "scheduler.log"]
    processes: list[subprocess.Popen[bytes]] = []
    holds: CostHolds | None = None
    runner: asyncio.Task[None] | None = None
    stopped = False
    try:
        # The signal service's own stale_after stays at its default (an hour): whatever turns
        # stale here, the scheduler's own clock did it.
        signal_service = service_process("signal", database_url, logs[0], {"listen": signal_target})
        processes.append(signal_service)
        await until_serving(signal_target, logs[0])
        processes.append(
            service_process(
                "scheduler",
                database_url,
                logs[1],
                {"listen": target, "signal_target": signal_target},
                extra={"LOWTIDE_SIGNAL_STALE_AFTER": "3s", "LOWTIDE_COST_DEFERRABLE_ACTIVITIES": "count"},
            )
        )
        await until_serving(target, logs[1])
        # The scheduler's own subscriber, in this process, with a keepalive short enough for a
        # test (10 s, the services' minimum ping interval; 3 s to answer).
        holds = CostHolds(
            target=signal_target,
            signal="grid",
            policy=HoldPolicy(),
            config=HoldConfig(),
            on_release=lambda: None,
            stale_after=timedelta(seconds=2),
            keepalive=(10_000, 3_000),
        )
        runner = asyncio.create_task(holds.run())
        watched = holds

        async with Client(target) as client, SignalClient(signal_target) as signals:
            await signals.set(100)

            async def hold_is(**want: object) -> scheduler_pb2.HoldStatus | None:
                hold = (await client.status()).hold
                return hold if all(getattr(hold, k) == v for k, v in want.items()) else None

            await eventually(lambda: hold_is(value=100, active=False, stale=False), within=15)

            async def fresh_here() -> bool:
                return watched.connected and watched.value == 100 and not watched.state.active

            await eventually(fresh_here, within=15)

            os.kill(signal_service.pid, signal.SIGSTOP)
            stopped = True

            # The in-process subscriber: stale while its stream still counts as connected.
            async def stale_here() -> tuple[bool] | None:
                return (watched.connected,) if watched.signal is not None and watched.signal.stale else None

            seen = await eventually(stale_here, within=15, interval=0.05)
            assert seen == (True,), "stale only once the stream had ended: the clock did not run on a silent stream"
            assert watched.state.active  # on_stale = hold: held types wait

            # The scheduler process: stale after its 3 s, the hold applies.
            try:
                stale = await eventually(lambda: hold_is(stale=True), within=20, interval=0.1)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{logs_of(logs)}") from None
            assert stale is not None and stale.value == 100 and stale.active

            # Keepalive: a ping goes unanswered, so the dead connection is given up (3 s after
            # the ping, which goes at the latest 10 s after the last answered one; bounded
            # generously here).
            async def given_up() -> bool:
                return not watched.connected

            await eventually(given_up, within=40, interval=0.1)
    finally:
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        if holds is not None:
            holds.close()
        if stopped:
            for process in processes:
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGCONT)
        kill_all(processes)
