"""Fault 2: a worker process killed (SIGKILL) while it runs tasks. Its attempts go to another
worker as new attempts, and no slot leaks: the pool's figures are the survivor's true ones, and
the survivor takes exactly as much new work as it has slots."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

from lowtide_client import Client, TaskState
from scheduler_service.server import Scheduler
from tests.faults.support import connected_workers, counting_worker, kill_all, logs_of
from tests.helpers import eventually

RUNNING = TaskState.Value("TASK_STATE_RUNNING")
PENDING = TaskState.Value("TASK_STATE_PENDING")


async def test_a_killed_worker_leaks_no_slot(scheduler: Scheduler, database_url: str, tmp_path: Path) -> None:
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        a = counting_worker(scheduler.target, tmp_path / "a.txt", slots=2, worker_id="worker-a", log=logs[0])
        processes.append(a)

        async def connected(*names: str) -> bool:
            return set(names) == await connected_workers(database_url)

        await eventually(lambda: connected("worker-a"), within=30, interval=0.1)
        async with Client(scheduler.target) as client:
            hang = {"max_attempts": 3, "initial_backoff": timedelta(milliseconds=100)}
            first = [await client.submit("hang", **hang) for _ in range(2)]  # type: ignore[call-overload]

            async def states_of(ids: list[int]) -> list[tuple[int, str, int]]:
                tasks = [await client.get(i) for i in ids]
                return [(t.state, t.worker_id, t.attempt) for t in tasks]

            async def all_on(worker_id: str, attempt: int) -> bool:
                return await states_of([t.id for t in first]) == [(RUNNING, worker_id, attempt)] * 2

            await eventually(lambda: all_on("worker-a", 1), within=10)
            # B connects only now, so A holds both first attempts.
            b = counting_worker(scheduler.target, tmp_path / "b.txt", slots=3, worker_id="worker-b", log=logs[1])
            processes.append(b)
            await eventually(lambda: connected("worker-a", "worker-b"), within=30, interval=0.1)

            os.kill(a.pid, signal.SIGKILL)
            try:
                await eventually(lambda: all_on("worker-b", 2), within=15, interval=0.1)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{logs_of(logs)}") from None
            for task in first:
                assert (await client.get(task.id)).last_failure.error_type == "WorkerLost"

            # The pool's figures are B's alone: one worker, its 3 slots, 2 of them busy.
            async def pool_is_b() -> tuple[int, int, int] | None:
                pools = (await client.status()).pools
                figures = [(p.workers, p.slots, p.busy_slots) for p in pools if p.name == "default"]
                return figures[0] if figures == [(1, 3, 2)] else None

            await eventually(pool_is_b, within=10, interval=0.1)

            # And B's free slot is really free, and only one: of two more tasks exactly one starts.
            more = [await client.submit("hang", **hang) for _ in range(2)]  # type: ignore[call-overload]

            async def one_more_running() -> list[tuple[int, str, int]] | None:
                now = sorted(await states_of([t.id for t in more]))
                return now if now == sorted([(RUNNING, "worker-b", 1), (PENDING, "", 0)]) else None

            await eventually(one_more_running, within=10, interval=0.1)
            assert [p.busy_slots for p in (await client.status()).pools if p.name == "default"] == [3]
            assert b.poll() is None
    finally:
        kill_all(processes)
