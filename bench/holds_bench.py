"""Cost holds, measured.

- `hold_release`: a signal service and a scheduler as processes, one worker; 50 times: the signal
  rises, one held task is submitted, then the signal falls — the time from the `SetSignal` call
  that ends the hold to the worker starting the held task (p50/p99).
- `held_claim`: the claim statement itself, with 1,000,000 held pending rows ahead of the
  claimable ones versus none: mean and p99 of a 10-task claim, and their ratio.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import psycopg

from bench._pg import throwaway_database
from bench.lowtide_run import _percentile, _spawn, _stop
from lowtide.db import Database, apply_migrations
from lowtide_client import Client, SignalClient, Worker
from scheduler_service.store import Store
from tests.helpers import free_port

RISES = 50
HELD_ROWS = 1_000_000
CLAIMABLE_ROWS = 2_000
CLAIMS = 150


async def hold_release(server_url: str) -> dict[str, Any]:
    async with throwaway_database(server_url, "bench_holds") as url:
        signal_target = f"127.0.0.1:{free_port()}"
        scheduler_target = f"127.0.0.1:{free_port()}"
        env = dict(
            os.environ,
            LOWTIDE_DATABASE_URL=url,
            # Auth is on by default; the benchmark runs everything on loopback.
            LOWTIDE_AUTH="off",
            LOWTIDE_LOG_LEVEL="WARNING",
            LOWTIDE_SIGNAL_LISTEN=signal_target,
            LOWTIDE_SIGNAL_METRICS_LISTEN="",
            LOWTIDE_SCHEDULER_LISTEN=scheduler_target,
            LOWTIDE_SCHEDULER_METRICS_LISTEN="",
            LOWTIDE_SCHEDULER_SIGNAL_TARGET=signal_target,
            LOWTIDE_COST_DEFERRABLE_ACTIVITIES="train",
        )
        processes = [await _spawn(env, "signal", "serve"), await _spawn(env, "scheduler", "serve")]
        started: asyncio.Queue[float] = asyncio.Queue()
        worker = Worker(target=scheduler_target, slots=4)

        @worker.activity("train")
        async def train(payload: bytes) -> bytes:
            started.put_nowait(time.perf_counter())
            return payload

        latencies: list[float] = []
        try:
            async with SignalClient(signal_target) as signals, Client(scheduler_target) as client, worker:
                await client.list(page_size=1)  # retries until the scheduler listens
                for _ in range(600):  # until the worker is connected (at most 30 s)
                    if (await client.status()).pools:
                        break
                    await asyncio.sleep(0.05)
                for round_ in range(RISES + 1):
                    await signals.set(520)
                    await asyncio.sleep(0.05)  # the rise reaches the scheduler
                    await client.submit("train")
                    await asyncio.sleep(0.05)  # the task is held (a claim would have happened by now)
                    assert started.empty(), "a held task started while the signal was high"
                    t0 = time.perf_counter()
                    await signals.set(100)
                    t1 = await asyncio.wait_for(started.get(), 10)
                    if round_:  # the first round warms up the scheduler's subscription
                        latencies.append((t1 - t0) * 1000)
        finally:
            await _stop(processes)
    return {
        "rises_and_falls": RISES,
        "release_latency_ms": {
            "p50": _percentile(latencies, 0.5),
            "p99": _percentile(latencies, 0.99),
            "max": round(max(latencies), 3),
        },
    }


async def _claim_latency(url: str, held_rows: int) -> list[float]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # Held rows first (older, so ahead of the claimable ones in FIFO order), then claimable.
        await conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
            " backoff_coefficient, max_backoff_ms, run_at)"
            " SELECT 'default', 'activity', 'train', ''::bytea, 3, 1000, 2, 60000, now() - interval '1 hour'"
            " FROM generate_series(1, %s)",
            (held_rows,),
        )
        await conn.execute(
            "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms,"
            " backoff_coefficient, max_backoff_ms)"
            " SELECT 'default', 'activity', 'echo', ''::bytea, 3, 1000, 2, 60000 FROM generate_series(1, %s)",
            (CLAIMABLE_ROWS,),
        )
        # The claims are for a connected worker: one whose lease runs.
        await conn.execute(
            "INSERT INTO lowtide.workers (id, pool, queues, activity_types, slots, scheduler_id, lease_expires_at)"
            " VALUES ('bench', 'default', '{default}', '{echo,train}', 10, 'bench', now() + interval '1 hour')"
        )
        await conn.execute("VACUUM ANALYZE lowtide.tasks")
    db = Database(url, min_size=1, max_size=2)
    await db.open()
    store = Store(db, on_unblocked=lambda rows: None)
    timings: list[float] = []
    try:
        for _ in range(CLAIMS):
            t0 = time.perf_counter()
            rows = await store.claim(
                slots=[("bench", 10)],
                queues=["default"],
                worker_types=["echo", "train"],
                limits={},
                held={"default": frozenset({"train"})},
            )
            timings.append((time.perf_counter() - t0) * 1000)
            if len(rows) != 10 or any(r.activity_type != "echo" for r in rows):
                raise RuntimeError("the claim took held work or came back short")
    finally:
        await db.close()
    return timings


async def held_claim(server_url: str) -> dict[str, Any]:
    results: dict[str, Any] = {"held_rows": HELD_ROWS, "claimable_rows": CLAIMABLE_ROWS, "claim_size": 10}
    for label, rows in (("without_held", 0), ("with_held", HELD_ROWS)):
        async with throwaway_database(server_url, "bench_claim") as url:
            await apply_migrations(url)
            timings = await _claim_latency(url, rows)
        results[label] = {
            "mean_ms": round(statistics.fmean(timings), 3),
            "p50_ms": _percentile(timings, 0.5),
            "p99_ms": _percentile(timings, 0.99),
        }
    results["ratio_mean"] = round(results["with_held"]["mean_ms"] / results["without_held"]["mean_ms"], 3)
    return results
