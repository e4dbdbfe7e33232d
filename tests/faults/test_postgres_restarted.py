"""Fault 3: PostgreSQL stopped and started again in the middle of a run, with the scheduler, the
signal service and workers running. While it is away a submit fails with UNAVAILABLE (never a
silent success); when it is back both services carry on by themselves and nothing is lost."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import grpc
import pytest

from lowtide_client import Client, SignalClient, task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.faults.support import (
    Postgres,
    connected_workers,
    counting_worker,
    executions,
    free_port,
    kill_all,
    logs_of,
    query,
    service_process,
    states,
    until_serving,
)
from tests.helpers import eventually

TASKS = 3_000


@pytest.mark.slow
async def test_services_ride_out_a_postgres_restart(postgres: Postgres, tmp_path: Path) -> None:
    url = postgres.url
    signal_target = f"127.0.0.1:{free_port()}"
    target = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / "signal.log", tmp_path / "scheduler.log", tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
    outs = [tmp_path / "count-0.txt", tmp_path / "count-1.txt"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(service_process("signal", url, logs[0], {"listen": signal_target}))
        await until_serving(signal_target, logs[0])
        processes.append(service_process("scheduler", url, logs[1], {"listen": target, "signal_target": signal_target}))
        await until_serving(target, logs[1])
        for n in range(2):
            processes.append(counting_worker(target, outs[n], slots=16, worker_id=f"counter-{n}", log=logs[2 + n]))

        async def both_connected() -> bool:
            return len(await connected_workers(url)) == 2

        await eventually(both_connected, within=30, interval=0.1)
        async with Client(target) as client:
            await client.submit_many(task_spec("count", str(i)) for i in range(TASKS))

        async def under_way() -> bool:
            return (await states(url)).get("completed", 0) >= TASKS // 10

        await eventually(under_way, within=60, interval=0.05)
        await asyncio.to_thread(postgres.stop)

        # A submit without the client's retries: the scheduler answers UNAVAILABLE.
        async with grpc.aio.insecure_channel(target) as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            request = scheduler_pb2.SubmitTaskRequest(task=task_spec("count", "while-away"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SubmitTask(request, timeout=15)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        async with SignalClient(signal_target) as signals:
            with pytest.raises(grpc.aio.AioRpcError) as refused_signal:
                await signals.set(250)
        assert refused_signal.value.code() == grpc.StatusCode.UNAVAILABLE, refused_signal.value
        await asyncio.sleep(2)  # bounded: the database stays away a few seconds

        await asyncio.to_thread(postgres.start)

        async def all_done() -> dict[str, int] | None:
            now = await states(url)
            return now if now.get("completed") == TASKS else None

        try:
            await eventually(all_done, within=90, interval=0.25)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{logs_of(logs)}") from None
        assert await query(url, "SELECT count(*) FROM lowtide.tasks WHERE payload = 'while-away'") == [(0,)]
        assert set(executions(outs)) == {str(i) for i in range(TASKS)}

        # The signal service took a new value once the database was back, and the scheduler,
        # still subscribed, saw it.
        async with SignalClient(signal_target) as signals, Client(target) as client:
            await signals.set(250)

            async def scheduler_sees_it() -> bool:
                return (await client.status()).hold.value == 250

            await eventually(scheduler_sees_it, within=10, interval=0.1)
    finally:
        kill_all(processes)
