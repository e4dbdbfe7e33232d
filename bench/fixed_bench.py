"""Fixed-start precision: a pool saturated with regular work (~2 s tasks), 200 fixed-start tasks
with tolerance 1 s spread over two minutes. Hit rate (|actual - start| <= tolerance, the actual
start being the claim time by the database clock) and |actual - start| p50/p99.

The pool has 2 worker processes of 5 slots and `max_workers = 10` (a slot counts as a worker
for reservations here), so at most 5 fixed starts may overlap; the regular backlog keeps every
slot busy for the whole run, so each start depends on its held slot.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench._pg import throwaway_database
from bench.lowtide_run import _percentile, _spawn, _stop
from lowtide_client import Client, task_spec
from tests.helpers import free_port

FIXED = 200
SPREAD = timedelta(seconds=120)
REGULAR_SECONDS = 2.0
WORKERS = 2
SLOTS = 5

CONFIG = """
[pools.bench]
max_workers = 10
reservable_fraction = 0.5
max_hold = "30s"
"""


async def fixed_precision(server_url: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as config:
        config.write(CONFIG)
    try:
        async with throwaway_database(server_url, "bench_fixed") as url:
            return await _run(url, config.name)
    finally:
        os.unlink(config.name)


async def _run(url: str, config_path: str) -> dict[str, Any]:
    target = f"127.0.0.1:{free_port()}"
    env = dict(
        os.environ,
        LOWTIDE_CONFIG=config_path,
        LOWTIDE_DATABASE_URL=url,
        # Auth is on by default; the benchmark runs everything on loopback.
        LOWTIDE_AUTH="off",
        LOWTIDE_LOG_LEVEL="WARNING",
        LOWTIDE_SCHEDULER_LISTEN=target,
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
    )
    processes = [await _spawn(env, "scheduler", "serve")]
    try:
        async with Client(target) as client:
            await client.list(page_size=1)  # retries until the scheduler listens
            processes += [
                await _spawn(env, "demo-worker", "--target", target, "--pool", "bench", "--slots", str(SLOTS))
                for _ in range(WORKERS)
            ]
            for _ in range(600):
                if sum(p.workers for p in (await client.status()).pools if p.name == "bench") == WORKERS:
                    break
                await asyncio.sleep(0.05)
            # Enough regular work to keep every slot busy past the last fixed start.
            backlog = int((SPREAD.total_seconds() + 20) * WORKERS * SLOTS / REGULAR_SECONDS)
            await client.submit_many([task_spec("sleep", str(REGULAR_SECONDS)) for _ in range(backlog)])
            first = datetime.now(UTC) + timedelta(seconds=10)
            step = SPREAD / FIXED
            await client.submit_many(
                [
                    task_spec(
                        "echo",
                        b"fixed",
                        pool="bench",
                        start_at=first + i * step,
                        start_tolerance=timedelta(seconds=1),
                        estimated_duration=timedelta(milliseconds=500),
                    )
                    for i in range(FIXED)
                ]
            )
            await asyncio.sleep((first + SPREAD - datetime.now(UTC)).total_seconds() + 5)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM started_at - start_at) * 1000, start_hit FROM lowtide.tasks"
                " WHERE start_at IS NOT NULL AND started_at IS NOT NULL"
            )
            rows = await cur.fetchall()
            cur = await conn.execute("SELECT count(*) FROM lowtide.tasks WHERE start_at IS NULL AND state = 'pending'")
            still_waiting = await cur.fetchone()
    finally:
        await _stop(processes)
    offsets = [abs(float(r[0])) for r in rows]
    hits = sum(1 for r in rows if r[1])
    return {
        "fixed_tasks": FIXED,
        "started": len(rows),
        "hit_rate": round(hits / FIXED, 4),
        "abs_offset_ms": {
            "p50": _percentile(offsets, 0.5),
            "p99": _percentile(offsets, 0.99),
            "max": round(max(offsets), 3),
        },
        "regular_run_seconds": REGULAR_SECONDS,
        "slots": WORKERS * SLOTS,
        "regular_backlog_left": int(still_waiting[0]) if still_waiting else None,
    }
