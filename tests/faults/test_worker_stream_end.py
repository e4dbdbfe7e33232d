"""A worker process killed (SIGKILL) in the middle of an attempt, twenty times in a row: each time
the scheduler sees the stream end and releases the attempt at once (back to pending as WorkerLost),
logs `worker.disconnected` and drops the worker from `lowtide status`. The lease is 30 s here, so
nothing but the stream's end can release the attempt within the bound the test allows."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from lowtide_client import Client, TaskState
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker, connected_workers, counting_worker, kill_all, logs_of, query
from tests.helpers import eventually

PENDING = TaskState.Value("TASK_STATE_PENDING")
RUNNING = TaskState.Value("TASK_STATE_RUNNING")

KILLS = 20
LEASE = timedelta(seconds=30)
# What "at once" is allowed to mean on a loaded 2-core machine: a third of the lease, so a release
# by lease expiry can never pass. Measured from the kill to all three seen (2 cores shared with
# other work, PostgreSQL 15 on loopback, 3 runs of 20 kills): median 24-28 ms, at worst 48 ms.
RELEASE_BOUND = 10.0


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def test_a_killed_worker_s_attempt_is_released_at_once_every_time(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lowtide.scheduler.workers")
    config = make_config(lease_timeout=LEASE, heartbeat_interval=timedelta(seconds=1))
    scheduler = await start_scheduler(config, database_url=database_url)
    loop = asyncio.get_running_loop()
    took: list[float] = []
    try:
        async with Client(scheduler.target) as client:
            for kill in range(KILLS):
                worker_id = f"doomed-{kill}"
                out, log = tmp_path / f"{worker_id}.txt", tmp_path / f"{worker_id}.log"
                process: subprocess.Popen[bytes] = counting_worker(
                    scheduler.target, out, slots=1, worker_id=worker_id, log=log, nap=600
                )
                try:
                    # One attempt at most before the retry, and its retry an hour away: what
                    # the kill does to the task stays visible.
                    task = await client.submit("nap", str(kill), max_attempts=2, initial_backoff=timedelta(hours=1))

                    async def under_way(number: int = kill, file: Path = out) -> bool:
                        return _lines(file) == [str(number)]

                    await eventually(under_way, within=60, interval=0.05)
                    assert (await client.get(task.id)).state == RUNNING
                    os.kill(process.pid, signal.SIGKILL)
                    killed = loop.time()

                    async def released(task_id: int = task.id, name: str = worker_id) -> bool:
                        now = await client.get(task_id)
                        lost = now.state == PENDING and now.last_failure.error_type == "WorkerLost"
                        gone = all(p.workers == 0 for p in (await client.status()).pools)
                        logged = any(
                            r.getMessage() == "worker.disconnected" and getattr(r, "worker_id", None) == name
                            for r in caplog.records
                        )
                        return lost and gone and logged

                    try:
                        await eventually(released, within=RELEASE_BOUND, interval=0.01)
                    except AssertionError as error:
                        now = await client.get(task.id)
                        raise AssertionError(
                            f"kill {kill + 1}: {error}; task {now.state} {now.last_failure}\n{logs_of([log])}"
                        ) from None
                    took.append(loop.time() - killed)
                    assert (await client.get(task.id)).attempt == 1
                finally:
                    kill_all([process])
    finally:
        await scheduler.stop(grace=1.0)
    took.sort()
    print(f"release after kill -9, {KILLS} kills: median {took[KILLS // 2]:.3f}s, max {took[-1]:.3f}s")
    assert len(took) == KILLS


async def test_a_worker_gone_while_it_is_being_recorded_is_released_too(database_url: str) -> None:
    """A stream cut while the scheduler records its worker (held there by a row lock the test
    takes): the recording is not cut half way, and the worker is released as soon as it is
    recorded, not left in `lowtide status` for its 30 s lease."""
    config = make_config(lease_timeout=LEASE, heartbeat_interval=timedelta(seconds=1))
    scheduler = await start_scheduler(config, database_url=database_url)
    raw = RawWorker(scheduler.target, "fleeting")
    try:
        async with await psycopg.AsyncConnection.connect(database_url) as locker:
            # The worker's row from an earlier stream, locked: the hello's upsert waits for it.
            await locker.execute(
                "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at)"
                " VALUES ('fleeting', 'default', '{default}', '{count}', 1, 'earlier', now() + interval '30 s')"
            )
            await locker.commit()
            await locker.execute("SELECT 1 FROM lowtide.workers WHERE id = 'fleeting' FOR UPDATE")
            await raw.call.write(worker_pb2.WorkerMessage(hello=raw.hello))

            async def upsert_waits() -> bool:
                rows = await query(
                    database_url,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'",
                )
                return rows != [(0,)]

            await eventually(upsert_waits, within=RELEASE_BOUND)
            await raw.close()
            await locker.rollback()

        async def none_left() -> bool:
            return not await connected_workers(database_url) and len(scheduler.registry) == 0

        await eventually(none_left, within=RELEASE_BOUND)
    finally:
        await raw.close()
        await scheduler.stop(grace=1.0)
