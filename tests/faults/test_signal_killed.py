"""Fault 4: the signal service is killed (SIGKILL) and started again. The scheduler keeps the last
value, marks it stale itself once it has heard nothing for [signal] stale_after, applies
[cost] on_stale (hold: held types wait; release: they run), and resubscribes by itself."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from lowtide_client import Client, SignalClient, TaskState
from lowtide_proto.lowtide.v1 import scheduler_pb2
from tests.faults.support import (
    connected_workers,
    counting_worker,
    free_port,
    kill_all,
    logs_of,
    service_process,
    sigkill,
    until_serving,
)
from tests.helpers import eventually

PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


@pytest.mark.slow
@pytest.mark.parametrize("on_stale", ["hold", "release"])
async def test_the_scheduler_outlives_the_signal_service(on_stale: str, database_url: str, tmp_path: Path) -> None:
    signal_target = f"127.0.0.1:{free_port()}"
    target = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / "signal-1.log", tmp_path / "scheduler.log", tmp_path / "worker.log", tmp_path / "signal-2.log"]
    processes: list[subprocess.Popen[bytes]] = []

    def start_signal(log: Path) -> subprocess.Popen[bytes]:
        # The signal service's own stale_after stays at its default (an hour): whatever turns
        # stale in this test, the scheduler's own clock did it.
        process = service_process("signal", database_url, log, {"listen": signal_target})
        processes.append(process)
        return process

    try:
        signal_service = start_signal(logs[0])
        await until_serving(signal_target, logs[0])
        processes.append(
            service_process(
                "scheduler",
                database_url,
                logs[1],
                {"listen": target, "signal_target": signal_target},
                extra={
                    "LOWTIDE_SIGNAL_STALE_AFTER": "3s",
                    "LOWTIDE_COST_ON_STALE": on_stale,
                    "LOWTIDE_COST_DEFERRABLE_ACTIVITIES": "count",
                },
            )
        )
        await until_serving(target, logs[1])
        processes.append(counting_worker(target, tmp_path / "count.txt", slots=4, worker_id="counter", log=logs[2]))
        await eventually(lambda: connected_workers(database_url), within=30, interval=0.1)

        async with Client(target) as client, SignalClient(signal_target) as signals:
            await signals.set(100)

            async def hold_is(**want: object) -> scheduler_pb2.HoldStatus | None:
                hold = (await client.status()).hold
                return hold if all(getattr(hold, k) == v for k, v in want.items()) else None

            await eventually(lambda: hold_is(value=100, active=False, stale=False), within=10)

            sigkill(signal_service)
            # At once: the last value is kept, not stale yet, and work runs on it.
            kept = await hold_is(value=100, active=False, stale=False)
            assert kept is not None, (await client.status()).hold
            before = await client.submit("count", payload=b"before")
            assert (await client.wait(before.id)).state == COMPLETED

            # After stale_after with no word: stale, and on_stale decides.
            try:
                stale = await eventually(lambda: hold_is(stale=True), within=10, interval=0.1)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{logs_of(logs)}") from None
            assert stale is not None and stale.value == 100
            assert stale.active is (on_stale == "hold")
            during = await client.submit("count", payload=b"during")
            if on_stale == "hold":
                # Held: it waits, pending, with its attempt count unmoved.
                for _ in range(5):
                    got = await client.get(during.id)
                    assert (got.state, got.attempt) == (PENDING, 0)
                    await asyncio.sleep(0.1)
            else:
                assert (await client.wait(during.id)).state == COMPLETED

            # The signal service comes back (same address, value kept in the database): the
            # scheduler resubscribes by itself, and the held work starts.
            start_signal(logs[3])
            await eventually(lambda: hold_is(value=100, active=False, stale=False), within=15, interval=0.1)
            assert (await client.wait(during.id)).state == COMPLETED
    finally:
        kill_all(processes)
