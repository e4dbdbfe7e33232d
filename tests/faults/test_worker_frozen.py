"""A worker process frozen (SIGSTOP) past its lease while its stream stays open, then continued
(SIGCONT). Its attempts are lost once, as WorkerLost; while it is frozen it is given nothing more;
when it wakes its first heartbeat finds the lease gone, the stream ends (UNAVAILABLE), the worker
connects again and the work completes: no task fails for good, none runs more often than the
attempts that were in flight when it froze."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

from lowtide_client import Client, task_spec
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.faults.support import connected_workers, counting_worker, executions, kill_all, logs_of, query, states
from tests.helpers import eventually

TASKS = 200
SLOTS = 4


async def test_a_worker_frozen_past_its_lease_fails_nothing_for_good_when_it_wakes(
    database_url: str, tmp_path: Path
) -> None:
    scheduler = await start_scheduler(make_config(lease_timeout=timedelta(seconds=2)), database_url=database_url)
    out, log = tmp_path / "frozen.txt", tmp_path / "frozen.log"
    worker = counting_worker(scheduler.target, out, slots=SLOTS, worker_id="frozen", log=log, nap=0.3, level="INFO")
    try:
        async with Client(scheduler.target) as client:
            retry = {"max_attempts": 3, "initial_backoff": timedelta(milliseconds=100)}
            await client.submit_many([task_spec("nap", str(i), **retry) for i in range(TASKS)])  # type: ignore[arg-type]

            async def some_ran() -> bool:
                return sum(executions([out]).values()) >= 20

            await eventually(some_ran, within=60)
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                # Frozen: the lease runs out, maintenance ends what it ran and forgets it.
                async def forgotten() -> bool:
                    running = await query(database_url, "SELECT count(*) FROM lowtide.tasks WHERE state = 'running'")
                    return running == [(0,)] and not await connected_workers(database_url)

                await eventually(forgotten, within=30)
            finally:
                os.kill(worker.pid, signal.SIGCONT)

            async def all_completed() -> bool:
                return await states(database_url) == {"completed": TASKS}

            try:
                await eventually(all_completed, within=120, interval=0.25)
            except AssertionError as error:
                raise AssertionError(f"{error}: {await states(database_url)}\n{logs_of([log])}") from None
        runs = executions([out])
        assert set(runs) == {str(i) for i in range(TASKS)}
        again = {payload: count for payload, count in runs.items() if count > 1}
        # Only what was in flight at the freeze (at most its slots) ran again, once each.
        assert sum(count - 1 for count in again.values()) <= SLOTS, again
        retried = await query(database_url, "SELECT count(*) FROM lowtide.tasks WHERE attempt > 1")
        assert retried[0][0] <= SLOTS  # type: ignore[operator]
        assert worker.poll() is None, logs_of([log])
    finally:
        kill_all([worker])
        await scheduler.stop(grace=1.0)
