"""Fault 5: two scheduler replicas on one database, with workers spread over both. No task is
dispatched twice; time-driven work runs on the leader alone; when the leader is killed the other
replica takes the lease within a few seconds and a start_to_close timeout still fires."""

from __future__ import annotations

import asyncio
import re
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, TaskState, task_spec
from tests.faults.support import (
    connected_workers,
    counting_worker,
    executions,
    free_port,
    kill_all,
    logs_of,
    query,
    service_process,
    sigkill,
    states,
    until_serving,
)
from tests.helpers import eventually

TIMED_OUT = TaskState.Value("TASK_STATE_TIMED_OUT")
TASKS = 2_000
LEADER = "scheduler.maintenance"
SETTINGS = {
    "lease_timeout": "3s",
    "heartbeat_interval": "300ms",
    "maintenance_interval": "200ms",
    "leader_lease": "2s",
}


def scheduler_id(log: Path) -> str | None:
    found = re.search(r"scheduler\.started .*scheduler_id=(\S+)", log.read_text(errors="replace"))
    return found.group(1) if found else None


async def leader(database_url: str) -> str | None:
    rows = await query(
        database_url, f"SELECT holder FROM lowtide.leader WHERE name = '{LEADER}' AND expires_at > now()"
    )
    return str(rows[0][0]) if rows else None


@pytest.mark.slow
async def test_two_replicas_share_the_work_and_hand_over_the_leader_lease(database_url: str, tmp_path: Path) -> None:
    targets = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    service_logs = [tmp_path / f"scheduler-{n}.log" for n in range(2)]
    worker_logs = [tmp_path / f"worker-{n}.log" for n in range(4)]
    outs = [tmp_path / f"count-{n}.txt" for n in range(4)]
    replicas: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(2):
            replicas.append(
                service_process("scheduler", database_url, service_logs[n], {"listen": targets[n], **SETTINGS})
            )
        for target, log in zip(targets, service_logs, strict=True):
            await until_serving(target, log)
        ids = [scheduler_id(log) for log in service_logs]
        assert None not in ids
        # Workers 0 and 1 on replica 0, 2 and 3 on replica 1.
        for n in range(4):
            workers.append(
                counting_worker(targets[n // 2], outs[n], slots=16, worker_id=f"counter-{n}", log=worker_logs[n])
            )

        async def all_connected() -> bool:
            return len(await connected_workers(database_url)) == 4

        await eventually(all_connected, within=30, interval=0.1)

        # Half the tasks submitted through each replica; every one runs exactly once.
        for n, target in enumerate(targets):
            async with Client(target) as client:
                half = range(n * TASKS // 2, (n + 1) * TASKS // 2)
                await client.submit_many(task_spec("count", str(i)) for i in half)

        async def all_done() -> bool:
            return (await states(database_url)).get("completed") == TASKS

        try:
            await eventually(all_done, within=60, interval=0.2)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{logs_of(service_logs + worker_logs)}") from None
        runs = executions(outs)
        assert set(runs) == {str(i) for i in range(TASKS)}
        assert [p for p, count in runs.items() if count > 1] == [], "a task ran twice with no fault"
        assert all(out.exists() and out.stat().st_size > 0 for out in outs), "a worker got no work"

        # One leader, and it is one of the two.
        holder = await eventually(lambda: leader(database_url), within=10)
        assert holder in ids
        leading = ids.index(holder)
        other = 1 - leading

        # Kill the leader and the workers that were on it (they would only keep redialling it).
        sigkill(replicas[leading])
        kill_all(workers[2 * leading : 2 * leading + 2])

        async def taken_over() -> bool:
            return await leader(database_url) == ids[other]

        loop_time = asyncio.get_running_loop().time
        killed_at = loop_time()
        await eventually(taken_over, within=10, interval=0.1)
        assert loop_time() - killed_at < 5, "the survivor took the leader lease too late"

        # Time-driven work now happens on the survivor: a start_to_close timeout fires.
        async with Client(targets[other]) as client:
            task = await client.submit("hang", max_attempts=1, start_to_close_timeout=timedelta(seconds=1))

            async def ended() -> bool:
                return (await client.get(task.id)).state == TIMED_OUT

            await eventually(ended, within=15, interval=0.1)
            got = await client.get(task.id)
        assert got.last_failure.error_type == "StartToCloseTimeout"
        assert got.attempt == 1
    finally:
        kill_all(replicas + workers)
