"""Procrastinate 3.10: no-op jobs/s with the settings that suit a backlog drain best.

The jobs are deferred in batches before any worker starts (`batch_defer_async`, one INSERT per
batch); the workers are `bench.procrastinate_worker` processes with `wait=False`, which leave
once they find the queue empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bench import _pg
from bench._fleet import Progress
from bench._peer import Peer, run_peer
from bench._procrastinate_app import TASK_NAME, make_app

# Jobs in flight per worker. A worker fetches one job per query, serially, and runs the job and
# its finish query as a task; past a few tasks the fetch loop is the limit and more only holds
# more connections. On 2 shared cores 4 and 8-10 measured alike, 25 no better, 1 slower (the
# fetch then waits for the previous job's finish); 25 (a 28-connection pool) x 4 workers exhausted
# the server's max_connections=100.
CONCURRENCY = 4
# A connection per job in flight, one for the fetch loop, one for the heartbeat/abort polls.
POOL_SIZE = CONCURRENCY + 2
# With wait=False a worker never waits for new jobs, so LISTEN/NOTIFY would only hold another
# connection and a task open, and the polling interval (left at its default) is never used.
LISTEN_NOTIFY = False
FETCH_JOB_POLLING_INTERVAL_S = 5.0
DEFER_BATCH = 1000

SETTINGS: dict[str, object] = {
    "concurrency": CONCURRENCY,
    "listen_notify": LISTEN_NOTIFY,
    "fetch_job_polling_interval": FETCH_JOB_POLLING_INTERVAL_S,
    "wait": False,
    "delete_jobs": "never",
    "pool_size_per_worker": POOL_SIZE,
    "task": "async def noop() -> None",
    "defer": f"batch_defer_async, {DEFER_BATCH} jobs a call",
}

PROGRESS = Progress(
    counts="""
        SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'aborted', 'cancelled')),
               count(*) FILTER (WHERE status IN ('failed', 'aborted', 'cancelled'))
        FROM procrastinate_jobs
    """,
    # The status-change trigger stamps every transition into procrastinate_events.
    finished_at="""
        SELECT max(at) FROM procrastinate_events
        WHERE type IN ('succeeded', 'failed', 'aborted', 'cancelled')
    """,
)


async def _prepare(database_url: str, tasks: int) -> float:
    """Install the schema and defer `tasks` jobs; returns the deferring time in seconds."""
    app = make_app(database_url, pool_size=1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        noop = app.tasks[TASK_NAME]
        start = time.monotonic()
        for first in range(0, tasks, DEFER_BATCH):
            await noop.batch_defer_async(*({} for _ in range(min(DEFER_BATCH, tasks - first))))
        defer_s = time.monotonic() - start
    await _pg.vacuum_analyze(database_url, ["procrastinate_jobs", "procrastinate_events"])
    return defer_s


WORKER_ARGV = [
    f"--concurrency={CONCURRENCY}",
    f"--pool-size={POOL_SIZE}",
    f"--listen-notify={'on' if LISTEN_NOTIFY else 'off'}",
    f"--fetch-job-polling-interval={FETCH_JOB_POLLING_INTERVAL_S}",
]


PEER = Peer(
    name="procrastinate",
    worker_module="bench.procrastinate_worker",
    settings=SETTINGS,
    progress=PROGRESS,
    prepare=_prepare,
    worker_argv=WORKER_ARGV,
)


async def run_procrastinate(
    server_url: str, *, tasks: int, processes: Sequence[int], repeat: int, timeout_s: float
) -> dict[str, object]:
    return await run_peer(PEER, server_url, tasks=tasks, processes=processes, repeat=repeat, timeout_s=timeout_s)
