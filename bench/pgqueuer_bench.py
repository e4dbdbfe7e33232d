"""PgQueuer 1.6: no-op jobs/s with 50-job claims and otherwise its own defaults.

The jobs are enqueued in batches before any consumer starts (`Queries.enqueue` with lists, one
INSERT per batch); the consumers are `bench.pgqueuer_worker` processes running the
QueueManager in drain mode, which leave once the queue is empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import asyncpg
from pgqueuer import AsyncpgDriver, Queries

from bench import _pg
from bench._fleet import Progress
from bench._peer import Peer, run_peer
from bench.pgqueuer_worker import ENTRYPOINT

# Jobs claimed per dequeue query, and so also the size of the batched status-log flush.
BATCH_SIZE = 50
# PgQueuer's plain asyncpg driver: one connection per consumer, shared (under a lock) by dequeue,
# log flushes, heartbeats and LISTEN. Its pool driver (4 or 8 connections) measured no faster on
# 2 cores, so the simpler, documented default stays.
DRIVER = "connection"
POOL_SIZE = 4
# None (unlimited) is the default; a cap of 100 measured no faster and adds a CTE to each claim.
MAX_CONCURRENT_TASKS = 0
# Only bounds how long an idle drain-mode consumer waits before its last look at the queue.
DEQUEUE_TIMEOUT_S = 1.0
ENQUEUE_BATCH = 1000

SETTINGS: dict[str, object] = {
    "batch_size": BATCH_SIZE,
    "driver": "AsyncpgDriver" if DRIVER == "connection" else f"AsyncpgPoolDriver(size={POOL_SIZE})",
    "max_concurrent_tasks": MAX_CONCURRENT_TASKS or None,
    "mode": "drain",
    "dequeue_timeout_s": DEQUEUE_TIMEOUT_S,
    "durability": "durable",
    "entrypoint": "async def noop(job: Job) -> None",
    "enqueue": f"Queries.enqueue with lists, {ENQUEUE_BATCH} jobs a call",
}

# A finished job leaves the queue table; the log keeps one row per transition ('queued',
# 'picked', then the terminal one), stamped when the consumer's batched log flush commits.
_TERMINAL = "('successful', 'exception', 'canceled', 'deleted', 'failed')"
PROGRESS = Progress(
    counts=f"""
        SELECT count(*) FILTER (WHERE status IN {_TERMINAL}),
               count(*) FILTER (WHERE status IN {_TERMINAL} AND status <> 'successful')
        FROM pgqueuer_log
    """,
    finished_at=f"SELECT max(created) FROM pgqueuer_log WHERE status IN {_TERMINAL}",
)


async def _prepare(database_url: str, tasks: int) -> float:
    """Install the schema and enqueue `tasks` jobs; returns the enqueueing time in seconds."""
    conn = await asyncpg.connect(database_url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        start = time.monotonic()
        for first in range(0, tasks, ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, tasks - first)
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        enqueue_s = time.monotonic() - start
    finally:
        await conn.close()
    await _pg.vacuum_analyze(database_url, ["pgqueuer", "pgqueuer_log"])
    return enqueue_s


WORKER_ARGV = [
    f"--driver={DRIVER}",
    f"--pool-size={POOL_SIZE}",
    f"--batch-size={BATCH_SIZE}",
    f"--max-concurrent-tasks={MAX_CONCURRENT_TASKS}",
    f"--dequeue-timeout={DEQUEUE_TIMEOUT_S}",
]


PEER = Peer(
    name="pgqueuer",
    worker_module="bench.pgqueuer_worker",
    settings=SETTINGS,
    progress=PROGRESS,
    prepare=_prepare,
    worker_argv=WORKER_ARGV,
)


async def run_pgqueuer(
    server_url: str, *, tasks: int, processes: Sequence[int], repeat: int, timeout_s: float
) -> dict[str, object]:
    return await run_peer(PEER, server_url, tasks=tasks, processes=processes, repeat=repeat, timeout_s=timeout_s)
