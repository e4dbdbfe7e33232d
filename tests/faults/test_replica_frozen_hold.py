"""A scheduler replica frozen (SIGSTOP) while the cost signal rises, then continued: it must not
dispatch held work on the signal it knew before the freeze. The news of the rise waits in its
sockets (the signal stream, here behind a slow link, and the NOTIFY), while its dispatch loop's
poll is overdue the moment it runs again: before the fix, that first claim used the old view
and started held work while the signal was far above the threshold (found by the soak)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, SignalClient, TaskState
from lowtide_proto.lowtide.v1 import scheduler_pb2
from tests.faults.support import (
    Relay,
    connected_workers,
    counting_worker,
    free_port,
    kill_all,
    logs_of,
    query,
    service_process,
    until_serving,
)
from tests.helpers import eventually

PENDING = TaskState.Value("TASK_STATE_PENDING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
COST = {"LOWTIDE_COST_DEFERRABLE_ACTIVITIES": "count", "LOWTIDE_COST_DEFER_THRESHOLD": "200"}


@pytest.mark.slow
async def test_a_thawed_replica_checks_the_signal_before_it_dispatches_held_work(
    database_url: str, tmp_path: Path
) -> None:
    signal_target = f"127.0.0.1:{free_port()}"
    frozen_target, other_target = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    logs = [tmp_path / name for name in ("signal.log", "frozen.log", "other.log", "worker.log")]
    out = tmp_path / "count.txt"
    processes: list[subprocess.Popen[bytes]] = []
    # The frozen replica hears the stream 3 s late: what it knows on waking comes from elsewhere.
    # It never polls (every 5 m): what it claims on waking, it claims for the wake-up it reads.
    slow = Relay(signal_target, delay=3.0)
    frozen: subprocess.Popen[bytes] | None = None
    try:
        processes.append(service_process("signal", database_url, logs[0], {"listen": signal_target}))
        await until_serving(signal_target, logs[0])
        slow_target = await slow.start()
        frozen = service_process(
            "scheduler",
            database_url,
            logs[1],
            {"listen": frozen_target, "signal_target": slow_target, "poll_interval": "5m"},
            extra=COST,
        )
        processes.append(frozen)
        other = {"listen": other_target, "signal_target": signal_target}
        processes.append(service_process("scheduler", database_url, logs[2], other, extra=COST))
        await until_serving(frozen_target, logs[1])
        await until_serving(other_target, logs[2])
        # The only worker is the frozen replica's: the other replica can dispatch nothing.
        processes.append(counting_worker(frozen_target, out, slots=4, worker_id="counter", log=logs[3]))
        await eventually(lambda: connected_workers(database_url), within=30, interval=0.1)

        async with (
            Client(frozen_target) as thawed,
            Client(other_target) as client,
            SignalClient(signal_target) as signals,
        ):

            def hold_is(via: Client, **want: object):  # type: ignore[no-untyped-def]
                async def check() -> scheduler_pb2.HoldStatus | None:
                    hold = (await via.status()).hold
                    return hold if all(getattr(hold, k) == v for k, v in want.items()) else None

                return check

            await signals.set(100)
            await eventually(hold_is(thawed, value=100, active=False), within=30, interval=0.1)
            warm = await client.submit("count", payload=b"warm")
            assert (await client.wait(warm.id)).state == COMPLETED

            os.kill(frozen.pid, signal.SIGSTOP)
            # Submitted while the signal is low, so its wake-up (a NOTIFY) comes first on waking.
            held = await client.submit("count", payload=b"held")
            await signals.set(900)
            await eventually(hold_is(client, value=900, active=True), within=15, interval=0.1)
            # Frozen for seconds, as in the soak (a freeze of less than a second is within the
            # time a new value may take to reach dispatch).
            await asyncio.sleep(3.0)
            os.kill(frozen.pid, signal.SIGCONT)

            try:
                await eventually(hold_is(thawed, value=900, active=True), within=20, interval=0.1)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{logs_of(logs)}") from None
            got = await client.get(held.id)
            rows = await query(
                database_url, f"SELECT signal_at_dispatch, worker_id FROM lowtide.tasks WHERE id = {held.id}"
            )
            assert (got.state, got.attempt) == (PENDING, 0), (
                f"held work dispatched by the thawed replica on the signal it knew before its freeze: {rows}"
            )
            assert b"held" not in (out.read_bytes() if out.exists() else b"")

            # The signal falls: the thawed replica releases the work, on the new value.
            await signals.set(100)
            assert (await client.wait(held.id, timeout=timedelta(seconds=30))).state == COMPLETED
            rows = await query(database_url, f"SELECT signal_at_dispatch FROM lowtide.tasks WHERE id = {held.id}")
            assert rows == [(100.0,)]
    finally:
        if frozen is not None and frozen.poll() is None:
            os.kill(frozen.pid, signal.SIGCONT)
        kill_all(processes)
        await slow.close()
