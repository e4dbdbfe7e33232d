"""One PgQueuer consumer process: `python -m bench.pgqueuer_worker ...`.

Started by `bench.pgqueuer_bench` through `bench._fleet`. It runs the QueueManager in drain
mode, PgQueuer's own way of stopping once the queue is empty and its last jobs are logged (or,
for the steady bench, in continuous mode); SIGTERM/SIGINT set the shutdown event so the parent
can stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, Queries, QueueManager
from pgqueuer.adapters.cli.cli import asyncio_run
from pgqueuer.db import Driver
from pgqueuer.types import QueueExecutionMode

from bench._handshake import database_url, ready_then_wait_for_go

ENTRYPOINT = "bench.noop"


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pgqueuer_worker")
    parser.add_argument("--driver", choices=("connection", "pool"), required=True)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-concurrent-tasks", type=int, default=0, help="0: unlimited")
    parser.add_argument("--dequeue-timeout", type=float, required=True)
    parser.add_argument(
        "--mode",
        choices=("drain", "continuous"),
        default="drain",
        help="drain: leave once the queue is empty; continuous: run until SIGTERM (the steady bench)",
    )
    return parser.parse_args(argv)


async def _consume(driver: Driver, args: argparse.Namespace) -> int:
    qm = QueueManager(Queries(driver))

    @qm.entrypoint(ENTRYPOINT)  # type: ignore[untyped-decorator]
    async def noop(job: Job) -> None:
        return None

    if not await ready_then_wait_for_go():
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    await qm.run(
        batch_size=args.batch_size,
        mode=QueueExecutionMode[args.mode],
        max_concurrent_tasks=args.max_concurrent_tasks or None,
        dequeue_timeout=timedelta(seconds=args.dequeue_timeout),
    )
    return 0


async def _main(args: argparse.Namespace) -> int:
    # Connections are opened before the worker reports ready, so their set-up is not timed.
    if args.driver == "pool":
        async with asyncpg.create_pool(database_url(), min_size=args.pool_size, max_size=args.pool_size) as pool:
            return await _consume(AsyncpgPoolDriver(pool), args)
    conn = await asyncpg.connect(database_url())
    try:
        return await _consume(AsyncpgDriver(conn), args)
    finally:
        await conn.close()


def main() -> None:
    # On the loop PgQueuer's own CLI (`pgq run`) runs its consumers on: uvloop, which PgQueuer
    # depends on wherever it builds.
    raise SystemExit(asyncio_run(_main(_parse())))


if __name__ == "__main__":
    main()
